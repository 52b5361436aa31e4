"""Walking a layer graph: its layers, its output expression, shapes and parameters."""
from ..utils import as_theano_expression
from .base import MergeLayer
from .input import InputLayer


def _inputs_of(layer):
    if isinstance(layer, MergeLayer):
        return [l for l in layer.input_layers if l is not None]
    parent = getattr(layer, 'input_layer', None)
    return [] if parent is None else [parent]


def get_all_layers(layer, treat_as_input=None):
    """Every layer below ``layer`` (or a list of layers), each after all of its
    inputs, the given layers last; ``treat_as_input`` layers are not descended into."""
    tops = list(layer) if isinstance(layer, (list, tuple)) else [layer]
    stop = set(treat_as_input or ())
    order, done = [], set()
    for top in tops:
        stack = [(top, False)]
        while stack:
            node, expanded = stack.pop()
            if node in done:
                continue
            if expanded or node in stop:
                done.add(node)
                order.append(node)
                continue
            stack.append((node, True))
            for parent in reversed(_inputs_of(node)):
                if parent not in done:
                    stack.append((parent, False))
    return order


def get_output(layer_or_layers, inputs=None, **kwargs):
    """The symbolic output of a layer (or a list of them). ``inputs``: one expression
    for the network's only InputLayer, or a dict {layer: expression}. Keyword
    arguments (``deterministic=True``) reach every layer's ``get_output_for``."""
    many = isinstance(layer_or_layers, (list, tuple))
    given = dict(inputs) if isinstance(inputs, dict) else {}
    layers = get_all_layers(layer_or_layers, treat_as_input=given.keys())
    outputs = {l: l.input_var for l in layers if isinstance(l, InputLayer)}
    if inputs is not None and not isinstance(inputs, dict):
        if len(outputs) != 1:
            raise ValueError('one input expression for a network of %d input layers'
                             % len(outputs))
        outputs = {l: as_theano_expression(inputs) for l in outputs}
    outputs.update((l, as_theano_expression(e)) for l, e in given.items())
    for l in layers:
        if l in outputs:
            continue
        if isinstance(l, MergeLayer):
            outputs[l] = l.get_output_for([outputs[p] for p in l.input_layers], **kwargs)
        else:
            outputs[l] = l.get_output_for(outputs[l.input_layer], **kwargs)
    if many:
        return [outputs[l] for l in layer_or_layers]
    return outputs[layer_or_layers]


def get_output_shape(layer_or_layers, input_shapes=None):
    """The output shape(s) of the layer(s), as built (``input_shapes`` is not supported)."""
    if input_shapes is not None:
        raise NotImplementedError('input_shapes is not part of this stand-in')
    if isinstance(layer_or_layers, (list, tuple)):
        return [l.output_shape for l in layer_or_layers]
    return layer_or_layers.output_shape


def get_all_params(layer, unwrap_shared=True, **tags):
    """The parameters of every layer below ``layer`` with the given tags, each once."""
    seen, out = set(), []
    for l in get_all_layers(layer):
        for p in l.get_params(unwrap_shared=unwrap_shared, **tags):
            if p not in seen:
                seen.add(p)
                out.append(p)
    return out


def count_params(layer, **tags):
    """The number of parameter entries below ``layer`` (with the given tags)."""
    return sum(int(p.get_value(borrow=True).size) for p in get_all_params(layer, **tags))
