"""Read a Theano-MPI model's parameters: their tags and its ``tmx_layers``."""
from ..params import tags_of

BN_NAMES = ('gamma', 'beta')


def contract_tags(model):
    """Tag sets for ``model.params``.

    Our own tags win when the model's layers set them; otherwise (plain
    Theano-MPI layers) the documented fallback: a parameter named
    ``'gamma'`` or ``'beta'`` is a BN affine parameter, and weight type
    ``'b'`` marks a bias.
    """
    wtypes = list(getattr(model, 'weight_types', None) or [])
    out = []
    for i, p in enumerate(model.params):
        t = set(tags_of(p))
        if not t:
            t.add('trainable')
            if (p.name or '') in BN_NAMES:
                t.add('bn_affine')
            if i < len(wtypes) and wtypes[i] == 'b':
                t.add('bias')
        out.append(frozenset(t))
    return out


def layer_entries(model):
    """``model.tmx_layers`` as a list of (name, output, params), forward order.

    Each entry is either an object with ``.output`` and ``.params`` (and
    optionally ``.name``), as Theano-MPI's layer classes are, or an
    ``(output, params)`` pair. Returns None when the model has no such
    attribute; raises ValueError naming the entry when one is malformed.
    """
    layers = getattr(model, 'tmx_layers', None)
    if layers is None:
        return None
    layers = list(layers)
    if not layers:
        raise ValueError('model.tmx_layers is empty: list the top-level layers in forward '
                         'order, each with .output and .params')
    out = []
    for i, entry in enumerate(layers):
        if isinstance(entry, (tuple, list)) and len(entry) == 2:
            output, params = entry
            name = 'layer%d' % i
        else:
            output = getattr(entry, 'output', None)
            params = getattr(entry, 'params', None)
            name = getattr(entry, 'name', None) or 'layer%d' % i
        if output is None or params is None or not hasattr(output, 'owner'):
            raise ValueError('model.tmx_layers[%d] (%r): expected an object with a symbolic '
                             '.output and a .params list, or an (output, params) pair'
                             % (i, entry))
        out.append((str(name), output, list(params)))
    return out
