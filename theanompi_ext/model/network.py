"""A classifier as an ordered list of top-level layers.

The order (input to output) is the order of the flat parameter vector;
the chunked backward pass walks the same list from the output back.
"""
from ..engine.core import T, floatX


class Network(object):
    """Top-level layers + input shape + number of classes.

    Parameters
    ----------
    name : str
    layers : list of Layer
        The chunking units, input to output; the last produces logits.
    input_shape : tuple
        Shape of one example, e.g. (3, 32, 32).
    n_classes : int
    """

    def __init__(self, name, layers, input_shape, n_classes):
        self.name = name
        self.layers = list(layers)
        self.input_shape = tuple(input_shape)
        self.n_classes = int(n_classes)
        names = [l.name for l in self.layers]
        if len(set(names)) != len(names):
            raise ValueError('layer names must be unique in %s' % name)

    @property
    def params(self):
        """Trainable shared variables in model order."""
        return [p for l in self.layers for p in l.params]

    @property
    def stats(self):
        """Per-worker state (BN running statistics)."""
        return [s for l in self.layers for s in l.stats]

    def input_var(self):
        """A fresh symbolic input batch of the right rank."""
        return T.TensorType(floatX, (False,) * (1 + len(self.input_shape)))('x')

    def forward(self, x, ctx):
        """Logits for ``x`` and every layer's output (the chunk boundaries)."""
        outs = []
        for layer in self.layers:
            x = layer.forward(x, ctx)
            outs.append(x)
        return x, outs

    def count_params(self):
        """Number of trainable scalars."""
        return int(sum(p.get_value(borrow=True).size for p in self.params))


def softmax_xent(logits, y):
    """Per-example cross-entropy of integer labels ``y`` (numerically stable)."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    logp = shifted - T.log(T.exp(shifted).sum(axis=1, keepdims=True))
    return -logp[T.arange(y.shape[0]), y]


def errors(logits, y):
    """Per-example 0/1 top-1 error."""
    return T.neq(T.argmax(logits, axis=1), y)


def topk_errors(logits, y, k=5):
    """Per-example 0/1 top-k error."""
    topk = T.argsort(-logits, axis=1)[:, :k]
    return 1 - T.eq(topk, y.dimshuffle(0, 'x')).any(axis=1)
