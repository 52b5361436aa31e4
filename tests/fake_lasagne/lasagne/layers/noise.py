"""Dropout: a random mask from a Theano random stream, rescaled to keep the mean."""
import theano.tensor as T
from theano.sandbox.rng_mrg import MRG_RandomStreams

from ..random import get_rng
from .base import Layer


class DropoutLayer(Layer):
    """Zero each input with probability ``p`` (training only); ``rescale``: divide
    the kept ones by ``1 - p``. The stream's seed comes from :func:`lasagne.random.get_rng`."""

    def __init__(self, incoming, p=0.5, rescale=True, **kwargs):
        super(DropoutLayer, self).__init__(incoming, **kwargs)
        self._srng = MRG_RandomStreams(get_rng().randint(1, 2147462579))
        self.p, self.rescale = p, rescale

    def get_output_for(self, input, deterministic=False, **kwargs):
        if deterministic or self.p == 0:
            return input
        keep = 1 - self.p
        if self.rescale:
            input = input / T.constant(keep, dtype=input.dtype)
        return input * self._srng.binomial(input.shape, p=keep, dtype=input.dtype)
