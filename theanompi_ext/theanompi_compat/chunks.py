"""The backward chunks of a Theano-MPI model, found rather than declared.

Order of precedence:

1. ``model.tmx_layers`` (the user's override, :func:`~.tags.layer_entries`);
2. the model's Theano graph (:func:`theanompi_ext.backward.cuts.find_cuts`),
   with the layers the model already has telling which parameters go
   together and naming the chunks: Theano-MPI's ``model.layers`` (native
   layer objects: ``.output``, ``.params``, ``.name``; their outputs are
   the preferred boundaries) or Lasagne's layer graph below
   ``model.output_layer`` (``.input_layer``/``.input_layers``, ``.params``),
   else the graph alone (a vector parameter goes with the filter bank or
   matrix before it).

A graph with no cut between parameter groups (one block) has no chunks:
the caller says so and runs the serial exchange.
"""
import collections

from ..backward.cuts import find_cuts
from .tags import layer_entries

# What :func:`find_chunks` found: ``entries`` as :func:`~.tags.layer_entries`
# gives them ((name, output, params), forward order; None: no chunks),
# ``source`` (where they came from, for the log) and ``why`` (one line).
Chunking = collections.namedtuple('Chunking', 'entries source why')


def _symbolic(v):
    return v is not None and hasattr(v, 'owner') and not hasattr(v, 'get_value')


def _label(layer, i):
    name = getattr(layer, 'name', None)
    name = str(name).strip() if name is not None else ''
    return '%s[%d]' % (name or type(layer).__name__, i)


def _native_layers(model):
    """(owners, units, preferred) from Theano-MPI's ``model.layers``, or None."""
    layers = getattr(model, 'layers', None)
    if not isinstance(layers, (list, tuple)) or not layers or \
            not all(hasattr(l, 'output') for l in layers):
        return None
    owners, units = {}, []
    for i, layer in enumerate(layers):
        ps = list(getattr(layer, 'params', None) or [])
        for p in ps:
            owners.setdefault(p, _label(layer, i))
        if ps:
            units.append(ps)
    return owners, units, [l.output for l in layers if hasattr(l.output, 'owner')]


def _lasagne_layers(model):
    """(owners, units, preferred) from Lasagne's layer graph under
    ``model.output_layer``, or None. Read by attribute (no Lasagne import)."""
    top = getattr(model, 'output_layer', None)
    if top is None or not (hasattr(top, 'input_layer') or hasattr(top, 'input_layers')):
        return None
    # Lasagne's own order (get_all_layers): inputs before the layers using them.
    order, seen = [], set()

    def visit(layer):
        if layer is None or id(layer) in seen:
            return
        seen.add(id(layer))
        for parent in list(getattr(layer, 'input_layers', None) or []) + \
                [getattr(layer, 'input_layer', None)]:
            visit(parent)
        order.append(layer)
    visit(top)
    owners, units = {}, []
    for i, layer in enumerate(order):
        ps = [p for p in getattr(layer, 'params', None) or {} if hasattr(p, 'get_value')]
        for p in ps:
            owners.setdefault(p, _label(layer, i))
        if ps:
            units.append(ps)
    return owners, units, []


def _group_name(params, owners, index):
    names = []
    for p in params:
        n = owners.get(p) or '%s[%d]' % (p.name or 'param', index[p])
        if n not in names:
            names.append(n)
    return names[0] if len(names) == 1 else '%s..%s' % (names[0], names[-1])


def find_chunks(model):
    """:class:`Chunking` of ``model``'s backward pass (see the module docstring).

    Raises ValueError when ``model.tmx_layers`` is malformed.
    """
    declared = layer_entries(model)
    if declared is not None:
        return Chunking(declared, 'model.tmx_layers',
                        '%d chunks declared in model.tmx_layers' % len(declared))
    params = list(model.params)
    source = model.x if _symbolic(getattr(model, 'x', None)) else getattr(model, 'shared_x', None)
    if source is None:
        return Chunking(None, 'none', 'the model has neither a symbolic model.x nor '
                        'model.shared_x: cannot tell where the batch enters its graph')
    for source_name, read in (('model.layers', _native_layers),
                              ('model.output_layer (Lasagne layers)', _lasagne_layers),
                              ('the Theano graph', lambda m: ({}, None, []))):
        found = read(model)
        if found is not None:
            break
    owners, units, preferred = found
    if units is not None:
        # Parameters of model.params no layer lists stay alone.
        known = set(params)
        units = [[p for p in u if p in known] for u in units]
        units = [u for u in units if u]
    groups = find_cuts(model.cost, source, params, units=units, preferred=preferred)
    where = 'the Theano graph from %s to model.cost (names from %s)' % (
        'model.x' if source is getattr(model, 'x', None) else 'model.shared_x', source_name)
    if len(groups) < 2:
        return Chunking(None, where, 'no cut in %s: no variable between two groups of '
                        'parameters lies on every path from the batch to the loss (the graph '
                        'is one block, e.g. a connection from the input around every layer)'
                        % where)
    index = {p: i for i, p in enumerate(params)}
    entries = [(_group_name(g.params, owners, index),
                g.output if g.output is not None else model.cost, list(g.params))
               for g in groups]
    return Chunking(entries, where, '%d chunks found in %s: %s' % (
        len(entries), where, ' | '.join(e[0] for e in entries)))
