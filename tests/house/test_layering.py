"""The package's import graph: no cycle between modules, lower layers never import
upper ones. Read from the source with ``ast`` (nothing is imported); an import
inside a function counts the same as one at module level."""
import ast
import os

import pytest

from support import paths

PKG = 'theanompi_ext'
ROOT = os.path.join(paths.ROOT, PKG)
# Layers that must not import the ones above them, nor their peers. From the bottom:
# collective/ moves buffers, buckets/ plans them, update/ is the update's math,
# backward/ computes gradients, exchange/ sums them over the buckets; step/ runs one
# step of those; train/, theanompi_compat/ and bench/ are the faces. launch/ runs
# jobs, it does not train.
FACES = ('step', 'train', 'bench', 'theanompi_compat', 'simulate')
LOWER = {
    'collective': FACES + ('exchange', 'backward', 'buckets', 'update', 'launch', 'model',
                           'data'),
    'buckets': FACES + ('exchange', 'backward', 'update', 'launch', 'model', 'data',
                        'collective'),
    'update': FACES + ('collective', 'exchange', 'backward', 'buckets', 'launch', 'data'),
    'backward': FACES + ('collective', 'exchange', 'update', 'launch'),
    'exchange': FACES + ('backward', 'launch', 'model', 'data'),
    'launch': FACES + ('exchange', 'backward', 'update', 'buckets', 'model', 'data'),
    # the step is below its faces: the trainer and the Theano-MPI stepper call it
    'step': ('train', 'bench', 'theanompi_compat', 'simulate', 'launch', 'cli'),
    # the floors everything stands on: whole files (errors only), the engine (and
    # the world it reads the local rank from), the flat parameter layout
    'files': FACES + ('collective', 'exchange', 'backward', 'buckets', 'update', 'launch',
                      'model', 'data', 'engine', 'params', 'cli'),
    'engine': FACES + ('exchange', 'backward', 'buckets', 'update', 'launch', 'model', 'data',
                       'params', 'cli'),
    'params': FACES + ('collective', 'exchange', 'backward', 'buckets', 'update', 'launch',
                       'model', 'data', 'cli'),
}
# Imports a rule above allows all the same, each with its reason. Aliases: modules
# kept at a documented import path for users' model files; they only re-export.
ALIASES = {
    ('theanompi_ext.exchange.theanompi_exchanger', 'theanompi_ext.theanompi_compat.exchanger'):
        "Theano-MPI model files import BSP_Exchanger from the exchange/ path (docs)",
}


def modules(root=ROOT, pkg=PKG):
    """``{dotted module name: file path}`` of every module under ``root``."""
    found = {}
    for folder, _, files in os.walk(root):
        for name in files:
            if name.endswith('.py'):
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, os.path.dirname(root))[:-3].replace(os.sep, '.')
                found[rel[:-len('.__init__')] if rel.endswith('.__init__') else rel] = path
    return found


def _targets(module, node, is_package, known):
    """The package's modules an Import/ImportFrom node names."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ''
        if node.level:
            parts = module.split('.') if is_package else module.split('.')[:-1]
            parts = parts[:len(parts) - (node.level - 1)]
            base = '.'.join(parts + ([node.module] if node.module else []))
        # ``from pkg import name``: a submodule if there is one, else pkg itself
        names = [base + '.' + a.name if base + '.' + a.name in known else base
                 for a in node.names]
    out = set()
    for name in names:
        if not (name == PKG or name.startswith(PKG + '.')):
            continue
        while name not in known and '.' in name:
            name = name.rsplit('.', 1)[0]
        if name in known and name != module:
            out.add(name)
    return out


def import_graph(found):
    """``{module: set of the package's modules it imports}`` (any depth in the file)."""
    graph = {}
    for module, path in found.items():
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        graph[module] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[module] |= _targets(module, node, path.endswith('__init__.py'), found)
    return graph


def find_cycle(graph):
    """One import cycle as a list ``[a, b, ..., a]``, or None (depth-first search)."""
    state = {}                                   # 1: on the current path, 2: done

    def visit(node, path):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt, path)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            cycle = visit(start, [])
            if cycle:
                return cycle
    return None


def test_finder_sees_a_cycle_and_function_level_imports(tmp_path):
    pkg = tmp_path / PKG
    (pkg / 'sub').mkdir(parents=True)
    (pkg / '__init__.py').write_text('')
    (pkg / 'sub' / '__init__.py').write_text('from .b import x\n')
    (pkg / 'a.py').write_text('import os\n\ndef f():\n    from .sub import b\n')
    (pkg / 'sub' / 'b.py').write_text('from .. import a\nx = 1\n')
    (pkg / 'c.py').write_text('from theanompi_ext.sub.b import x\n')
    graph = import_graph(modules(str(pkg)))
    assert graph[PKG + '.a'] == {PKG + '.sub.b'}
    assert graph[PKG + '.sub'] == {PKG + '.sub.b'}
    assert graph[PKG + '.c'] == {PKG + '.sub.b'}
    assert find_cycle(graph) == [PKG + '.a', PKG + '.sub.b', PKG + '.a']
    del graph[PKG + '.sub.b']
    assert find_cycle(graph) is None


@pytest.fixture(scope='module')
def graph():
    return import_graph(modules())


def test_no_import_cycle(graph):
    cycle = find_cycle(graph)
    assert cycle is None, 'import cycle: ' + ' -> '.join(cycle)


@pytest.mark.parametrize('lower', sorted(LOWER))
def test_lower_layers_do_not_import_upper_ones(graph, lower):
    prefix = PKG + '.' + lower
    upper = [PKG + '.' + u for u in LOWER[lower]]
    wrong = sorted('%s imports %s' % (m, t) for m, targets in graph.items()
                   if m == prefix or m.startswith(prefix + '.')
                   for t in targets if any(t == u or t.startswith(u + '.') for u in upper)
                   and (m, t) not in ALIASES)
    assert not wrong, '; '.join(wrong)


def test_every_allowed_alias_import_is_still_there(graph):
    """An exception that no longer happens is removed, so the list stays the truth."""
    stale = sorted('%s -> %s' % pair for pair in ALIASES if pair[1] not in graph.get(pair[0], ()))
    assert not stale, 'no longer imported, remove from ALIASES: ' + '; '.join(stale)


def test_errors_imports_nothing_of_the_package(graph):
    assert graph[PKG + '.errors'] == set()
