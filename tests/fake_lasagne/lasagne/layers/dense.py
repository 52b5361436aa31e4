"""Fully connected layers and a bare nonlinearity."""
import numpy as np
import theano.tensor as T

from .. import init, nonlinearities
from .base import Layer


class DenseLayer(Layer):
    """``nonlinearity(x W + b)``; inputs of more than 2 dimensions are flattened."""

    def __init__(self, incoming, num_units, W=init.GlorotUniform(), b=init.Constant(0.),
                 nonlinearity=nonlinearities.rectify, **kwargs):
        super(DenseLayer, self).__init__(incoming, **kwargs)
        self.num_units = num_units
        self.nonlinearity = nonlinearity or nonlinearities.identity
        n_in = int(np.prod(self.input_shape[1:]))
        self.W = self.add_param(W, (n_in, num_units), name='W')
        self.b = None if b is None else self.add_param(b, (num_units,), name='b',
                                                       regularizable=False)

    def get_output_shape_for(self, input_shape):
        return (input_shape[0], self.num_units)

    def get_output_for(self, input, **kwargs):
        if input.ndim > 2:
            input = input.flatten(2)
        act = T.dot(input, self.W)
        if self.b is not None:
            act = act + self.b.dimshuffle('x', 0)
        return self.nonlinearity(act)


class NonlinearityLayer(Layer):
    def __init__(self, incoming, nonlinearity=nonlinearities.rectify, **kwargs):
        super(NonlinearityLayer, self).__init__(incoming, **kwargs)
        self.nonlinearity = nonlinearity or nonlinearities.identity

    def get_output_for(self, input, **kwargs):
        return self.nonlinearity(input)
