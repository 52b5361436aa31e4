"""Pooling: windows over the two trailing axes, or everything past the channels."""
import theano.tensor as T
from theano.tensor.signal.pool import pool_2d

from ..utils import as_tuple
from .base import Layer


def pool_output_length(length, size, stride, pad, ignore_border):
    """Output length of one pooled axis (Theano's pool_2d conventions)."""
    if length is None:
        return None
    if ignore_border:
        return (length + 2 * pad - size) // stride + 1
    if stride >= size:
        return (length + stride - 1) // stride
    return max(0, (length - size + stride - 1) // stride) + 1


class Pool2DLayer(Layer):
    def __init__(self, incoming, pool_size, stride=None, pad=(0, 0), ignore_border=True,
                 mode='max', **kwargs):
        super(Pool2DLayer, self).__init__(incoming, **kwargs)
        self.pool_size = as_tuple(pool_size, 2)
        self.stride = self.pool_size if stride is None else as_tuple(stride, 2)
        self.pad = as_tuple(pad, 2)
        self.ignore_border = ignore_border
        self.mode = mode

    def get_output_shape_for(self, input_shape):
        return tuple(input_shape[:2]) + tuple(
            pool_output_length(n, w, s, p, self.ignore_border) for n, w, s, p in
            zip(input_shape[2:], self.pool_size, self.stride, self.pad))

    def get_output_for(self, input, **kwargs):
        return pool_2d(input, ws=self.pool_size, stride=self.stride,
                       ignore_border=self.ignore_border, pad=self.pad, mode=self.mode)


class MaxPool2DLayer(Pool2DLayer):
    def __init__(self, incoming, pool_size, stride=None, pad=(0, 0), ignore_border=True,
                 **kwargs):
        super(MaxPool2DLayer, self).__init__(incoming, pool_size, stride, pad, ignore_border,
                                             mode='max', **kwargs)


class GlobalPoolLayer(Layer):
    """``pool_function`` (default: mean) over every axis after the second."""

    def __init__(self, incoming, pool_function=T.mean, **kwargs):
        super(GlobalPoolLayer, self).__init__(incoming, **kwargs)
        self.pool_function = pool_function

    def get_output_shape_for(self, input_shape):
        return tuple(input_shape[:2])

    def get_output_for(self, input, **kwargs):
        return self.pool_function(input.flatten(3), axis=2)
