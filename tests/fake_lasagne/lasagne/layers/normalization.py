"""Batch normalisation with running statistics (Ioffe & Szegedy 2015).

Training (``deterministic=False``): normalise with the mini-batch mean and
inverse standard deviation, and move the running ``mean``/``inv_std`` by
``alpha`` towards them. The running statistics are updated the way Lasagne
does it: a memory-aliased clone of each statistic (``theano.clone(...,
share_inputs=False)``, same storage) carries a ``default_update``, and is
added times 0 to the batch statistic, so every Theano function computing
the output applies the update once per call, without it changing the value.
``deterministic=True``: normalise with the running statistics, no update.
"""
import theano
import theano.tensor as T

from .. import init
from .base import Layer


class BatchNormLayer(Layer):
    def __init__(self, incoming, axes='auto', epsilon=1e-4, alpha=0.1, beta=init.Constant(0),
                 gamma=init.Constant(1), mean=init.Constant(0), inv_std=init.Constant(1),
                 **kwargs):
        super(BatchNormLayer, self).__init__(incoming, **kwargs)
        if axes == 'auto':
            axes = (0,) + tuple(range(2, len(self.input_shape)))
        elif isinstance(axes, int):
            axes = (axes,)
        self.axes, self.epsilon, self.alpha = tuple(axes), epsilon, alpha
        shape = [n for i, n in enumerate(self.input_shape) if i not in self.axes]
        if any(n is None for n in shape):
            raise ValueError('BatchNormLayer needs the size of every axis it keeps')
        self.beta = None if beta is None else self.add_param(
            beta, shape, 'beta', trainable=True, regularizable=False)
        self.gamma = None if gamma is None else self.add_param(
            gamma, shape, 'gamma', trainable=True, regularizable=True)
        self.mean = self.add_param(mean, shape, 'mean', trainable=False, regularizable=False,
                                   batch_norm_stat=True)
        self.inv_std = self.add_param(inv_std, shape, 'inv_std', trainable=False,
                                      regularizable=False, batch_norm_stat=True)

    def get_output_for(self, input, deterministic=False, batch_norm_use_averages=None,
                       batch_norm_update_averages=None, **kwargs):
        batch_mean = input.mean(self.axes)
        batch_inv_std = T.inv(T.sqrt(input.var(self.axes) + self.epsilon))
        use_running = deterministic if batch_norm_use_averages is None \
            else batch_norm_use_averages
        update_running = (not deterministic) if batch_norm_update_averages is None \
            else batch_norm_update_averages
        mean, inv_std = (self.mean, self.inv_std) if use_running \
            else (batch_mean, batch_inv_std)
        if update_running:
            a = self.alpha
            run_mean = theano.clone(self.mean, share_inputs=False)
            run_inv_std = theano.clone(self.inv_std, share_inputs=False)
            run_mean.default_update = (1 - a) * run_mean + a * batch_mean
            run_inv_std.default_update = (1 - a) * run_inv_std + a * batch_inv_std
            mean = mean + 0 * run_mean
            inv_std = inv_std + 0 * run_inv_std
        kept = iter(range(input.ndim - len(self.axes)))
        pattern = ['x' if i in self.axes else next(kept) for i in range(input.ndim)]
        gamma = 1 if self.gamma is None else self.gamma.dimshuffle(pattern)
        beta = 0 if self.beta is None else self.beta.dimshuffle(pattern)
        return (input - mean.dimshuffle(pattern)) * (gamma * inv_std.dimshuffle(pattern)) + beta
