"""Weight initializers: ``init(shape) -> numpy array``, drawn from :func:`lasagne.random.get_rng`."""
import numpy as np

from .random import get_rng
from .utils import floatX


class Initializer(object):
    """Base class: calling it samples an array of the given shape."""

    def __call__(self, shape):
        return self.sample(shape)

    def sample(self, shape):
        raise NotImplementedError


class Constant(Initializer):
    def __init__(self, val=0.0):
        self.val = val

    def sample(self, shape):
        return floatX(np.ones(shape) * self.val)


class Normal(Initializer):
    def __init__(self, std=0.01, mean=0.0):
        self.std, self.mean = std, mean

    def sample(self, shape):
        return floatX(get_rng().normal(self.mean, self.std, size=shape))


class Uniform(Initializer):
    def __init__(self, range=0.01):
        self.range = range if isinstance(range, tuple) else (-range, range)

    def sample(self, shape):
        return floatX(get_rng().uniform(self.range[0], self.range[1], size=shape))


def _gain(gain):
    return np.sqrt(2.0) if gain == 'relu' else float(gain)


def _fans(shape):
    """(fan_in, fan_out): a dense W is (inputs, units); a conv W is (out, in, rows, cols)."""
    if len(shape) == 2:
        return shape[0], shape[1]
    field = int(np.prod(shape[2:]))
    return shape[1] * field, shape[0] * field


class GlorotNormal(Initializer):
    def __init__(self, gain=1.0):
        self.gain = _gain(gain)

    def sample(self, shape):
        fan_in, fan_out = _fans(shape)
        return Normal(self.gain * np.sqrt(2.0 / (fan_in + fan_out)))(shape)


class GlorotUniform(Initializer):
    def __init__(self, gain=1.0):
        self.gain = _gain(gain)

    def sample(self, shape):
        fan_in, fan_out = _fans(shape)
        std = self.gain * np.sqrt(2.0 / (fan_in + fan_out))
        return Uniform(np.sqrt(3.0) * std)(shape)


class HeNormal(Initializer):
    def __init__(self, gain=1.0):
        self.gain = _gain(gain)

    def sample(self, shape):
        return Normal(self.gain * np.sqrt(1.0 / _fans(shape)[0]))(shape)


class HeUniform(Initializer):
    def __init__(self, gain=1.0):
        self.gain = _gain(gain)

    def sample(self, shape):
        std = self.gain * np.sqrt(1.0 / _fans(shape)[0])
        return Uniform(np.sqrt(3.0) * std)(shape)
