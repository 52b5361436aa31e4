"""Where a network starts."""
from collections import OrderedDict

import theano
import theano.tensor as T


class InputLayer(object):
    """The network's input: a symbolic tensor of ``len(shape)`` dimensions (None: any size)."""

    def __init__(self, shape, input_var=None, name=None):
        self.shape = tuple(shape)
        if input_var is None:
            kind = T.TensorType(theano.config.floatX, (False,) * len(self.shape))
            input_var = kind('input' if name is None else '%s.input' % name)
        elif input_var.ndim != len(self.shape):
            raise ValueError('input_var has %d dimensions, shape has %d'
                             % (input_var.ndim, len(self.shape)))
        self.input_var = input_var
        self.name = name
        self.params = OrderedDict()

    @property
    def output_shape(self):
        return self.shape

    def get_params(self, unwrap_shared=True, **tags):
        return []
