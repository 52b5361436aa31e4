"""2D convolution on bc01 input."""
import theano.tensor as T

from .. import init, nonlinearities
from ..utils import as_tuple
from .base import Layer


def conv_output_length(length, size, stride, pad):
    """Output length of a convolution: ``pad`` an int, 'valid', 'full' or 'same'."""
    if length is None:
        return None
    if pad == 'valid':
        pad = 0
    elif pad == 'full':
        pad = size - 1
    elif pad == 'same':
        return (length + stride - 1) // stride
    return (length + 2 * pad - size) // stride + 1


class Conv2DLayer(Layer):
    """``nonlinearity(conv(x, W) + b)``, W of shape (num_filters, channels, rows, cols)."""

    def __init__(self, incoming, num_filters, filter_size, stride=(1, 1), pad=0,
                 untie_biases=False, W=init.GlorotUniform(), b=init.Constant(0.),
                 nonlinearity=nonlinearities.rectify, flip_filters=True, **kwargs):
        super(Conv2DLayer, self).__init__(incoming, **kwargs)
        if untie_biases:
            raise NotImplementedError('untie_biases is not part of this stand-in')
        self.num_filters = num_filters
        self.filter_size = as_tuple(filter_size, 2)
        self.stride = as_tuple(stride, 2)
        self.pad = pad if isinstance(pad, str) else as_tuple(pad, 2)
        self.flip_filters = flip_filters
        self.nonlinearity = nonlinearity or nonlinearities.identity
        self.W = self.add_param(W, (num_filters, self.input_shape[1]) + self.filter_size,
                                name='W')
        self.b = None if b is None else self.add_param(b, (num_filters,), name='b',
                                                       regularizable=False)

    def get_output_shape_for(self, input_shape):
        pads = (self.pad,) * 2 if isinstance(self.pad, str) else self.pad
        return (input_shape[0], self.num_filters) + tuple(
            conv_output_length(n, f, s, p) for n, f, s, p in
            zip(input_shape[2:], self.filter_size, self.stride, pads))

    def get_output_for(self, input, **kwargs):
        mode = 'half' if self.pad == 'same' else self.pad
        conved = T.nnet.conv2d(input, self.W, subsample=self.stride, border_mode=mode,
                               filter_flip=self.flip_filters)
        if self.b is not None:
            conved = conved + self.b.dimshuffle('x', 0, 'x', 'x')
        return self.nonlinearity(conved)
