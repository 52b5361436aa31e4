"""Layers with tagged parameters (Lasagne-style), NCHW tensors.

A layer owns its parameters (tagged at creation, see
:mod:`theanompi_ext.params.tags`) and maps a symbolic input to a symbolic
output in :meth:`Layer.forward`, given a :class:`ForwardContext` that says
whether this is training and collects batch-norm running-statistic updates.

The top-level layers of a :class:`~theanompi_ext.model.network.Network`
are the units the chunked backward pass cuts at; a residual block is one
such unit.
"""
import numpy as np

from ..engine.core import T, shared, conv2d, pool2d
from ..params import tag
from . import init


class ForwardContext(object):
    """Options of one symbolic forward pass.

    ``train``      batch statistics in BN (else running statistics).
    ``bn_groups``  BN statistics over this many equal groups of the batch
                   (one process emulating k workers of n examples).
    ``updates``    filled with (running_stat, new_value) pairs.
    """

    def __init__(self, train=True, bn_groups=1):
        self.train = train
        self.bn_groups = int(bn_groups)
        self.updates = []


class Layer(object):
    """Base class: a name, tagged trainable params, per-worker state."""

    def __init__(self, name):
        self.name = name
        self.params = []   # trainable shared variables, creation order
        self.stats = []    # non-trainable per-worker state (BN running stats)

    def add_param(self, value, suffix, *tags):
        """Create a shared variable ``<layer>.<suffix>`` with the given tags."""
        var = shared(np.asarray(value, np.float32), name='%s.%s' % (self.name, suffix))
        if 'bn_stat' in tags:
            self.stats.append(tag(var, *tags))
        else:
            self.params.append(tag(var, 'trainable', *tags))
        return var

    def forward(self, x, ctx):
        """Symbolic output for input ``x``."""
        raise NotImplementedError

    def output_shape(self, shape):
        """Output shape (without batch) for an input shape (without batch)."""
        return shape


class Conv2D(Layer):
    """Convolution, He-initialised, no bias (BN follows) unless ``bias=True``."""

    def __init__(self, name, rng, in_channels, out_channels, ksize, stride=1,
                 pad=None, bias=False):
        Layer.__init__(self, name)
        self.ksize, self.stride = ksize, stride
        self.pad = ksize // 2 if pad is None else pad
        self.W = self.add_param(init.he_normal(rng, (out_channels, in_channels, ksize, ksize)), 'W')
        self.b = self.add_param(np.zeros(out_channels, np.float32), 'b', 'bias') if bias else None
        self.out_channels = out_channels

    def forward(self, x, ctx):
        y = conv2d(x, self.W, border_mode=(self.pad, self.pad), stride=(self.stride, self.stride))
        if self.b is not None:
            y = y + self.b.dimshuffle('x', 0, 'x', 'x')
        return y

    def output_shape(self, shape):
        c, h, w = shape
        f = lambda s: (s + 2 * self.pad - self.ksize) // self.stride + 1
        return (self.out_channels, f(h), f(w))


class BatchNorm(Layer):
    """Batch normalisation over the batch (and spatial axes for 4-D input).

    gamma/beta are tagged ``bn_affine``; running mean/var ``bn_stat``
    (momentum 0.9, used at evaluation). ``gamma_init=0`` for the last BN
    of a residual block.
    """

    def __init__(self, name, channels, gamma_init=1.0, eps=1e-5, momentum=0.9):
        Layer.__init__(self, name)
        self.eps, self.momentum = eps, momentum
        self.gamma = self.add_param(init.constant(channels, gamma_init), 'gamma', 'bn_affine')
        self.beta = self.add_param(init.constant(channels, 0.0), 'beta', 'bn_affine')
        self.mean = self.add_param(init.constant(channels, 0.0), 'mean', 'bn_stat')
        self.var = self.add_param(init.constant(channels, 1.0), 'var', 'bn_stat')

    def forward(self, x, ctx):
        spatial = x.ndim == 4
        pat = ('x', 0, 'x', 'x') if spatial else ('x', 0)
        gamma, beta = self.gamma.dimshuffle(*pat), self.beta.dimshuffle(*pat)
        if not ctx.train:
            inv = T.inv(T.sqrt(self.var.dimshuffle(*pat) + self.eps))
            return (x - self.mean.dimshuffle(*pat)) * inv * gamma + beta
        g = ctx.bn_groups
        # (g, N/g, ...): statistics per group of the batch.
        xr = x.reshape(T.concatenate([[g, x.shape[0] // g], x.shape[1:]]), ndim=x.ndim + 1)
        axes = (1, 3, 4) if spatial else (1,)
        mean = xr.mean(axis=axes, keepdims=True)
        centred = xr - mean
        var = T.sqr(centred).mean(axis=axes, keepdims=True)
        y = (centred * T.inv(T.sqrt(var + self.eps))).reshape(x.shape, ndim=x.ndim)
        m = self.momentum
        ctx.updates.append((self.mean, m * self.mean + (1 - m) * mean.mean(axis=(0,) + axes).flatten()))
        ctx.updates.append((self.var, m * self.var + (1 - m) * var.mean(axis=(0,) + axes).flatten()))
        return y * gamma + beta


class ReLU(Layer):
    """max(x, 0)."""

    def forward(self, x, ctx):
        return T.nnet.relu(x)


class Pool(Layer):
    """Max or average pooling."""

    def __init__(self, name, size=2, stride=None, pad=0, mode='max'):
        Layer.__init__(self, name)
        self.size, self.stride, self.pad = size, stride or size, pad
        self.mode = 'max' if mode == 'max' else 'average_exc_pad'

    def forward(self, x, ctx):
        return pool2d(x, (self.size, self.size), (self.stride, self.stride),
                      (self.pad, self.pad), self.mode)

    def output_shape(self, shape):
        c, h, w = shape
        f = lambda s: (s + 2 * self.pad - self.size) // self.stride + 1
        return (c, f(h), f(w))


class GlobalAvgPool(Layer):
    """Mean over the spatial axes: (N, C, H, W) -> (N, C)."""

    def forward(self, x, ctx):
        return x.mean(axis=(2, 3))

    def output_shape(self, shape):
        return (shape[0],)


class Flatten(Layer):
    """(N, ...) -> (N, prod(...))."""

    def forward(self, x, ctx):
        return x.flatten(2)

    def output_shape(self, shape):
        return (int(np.prod(shape)),)


class Dense(Layer):
    """Fully connected; ``last=True`` initialises W from N(0, 0.01)."""

    def __init__(self, name, rng, n_in, n_out, last=False):
        Layer.__init__(self, name)
        w = init.normal(rng, (n_in, n_out), 0.01) if last else init.he_normal(rng, (n_in, n_out))
        self.W = self.add_param(w, 'W')
        self.b = self.add_param(np.zeros(n_out, np.float32), 'b', 'bias')
        self.n_out = n_out

    def forward(self, x, ctx):
        return T.dot(x, self.W) + self.b

    def output_shape(self, shape):
        return (self.n_out,)


class Sequence(Layer):
    """Layers applied one after the other, seen from outside as one layer."""

    def __init__(self, name, layers):
        Layer.__init__(self, name)
        self.layers = list(layers)
        for l in self.layers:
            self.params.extend(l.params)
            self.stats.extend(l.stats)

    def forward(self, x, ctx):
        for l in self.layers:
            x = l.forward(x, ctx)
        return x

    def output_shape(self, shape):
        for l in self.layers:
            shape = l.output_shape(shape)
        return shape


class Residual(Layer):
    """relu(branch(x) + shortcut(x)); the branch's last BN starts at gamma 0.

    ``branch`` and ``shortcut`` are :class:`Sequence` layers (an empty
    shortcut is the identity).
    """

    def __init__(self, name, branch, shortcut=None):
        Layer.__init__(self, name)
        self.branch, self.shortcut = branch, shortcut
        for part in (branch, shortcut):
            if part is not None:
                self.params.extend(part.params)
                self.stats.extend(part.stats)

    def forward(self, x, ctx):
        s = self.shortcut.forward(x, ctx) if self.shortcut is not None else x
        return T.nnet.relu(self.branch.forward(x, ctx) + s)

    def output_shape(self, shape):
        return self.branch.output_shape(shape)


def conv_bn_relu(name, rng, cin, cout, ksize=3, stride=1, relu=True, gamma_init=1.0):
    """The common conv -> BN (-> ReLU) triple as a list of layers."""
    out = [Conv2D(name + '.conv', rng, cin, cout, ksize, stride),
           BatchNorm(name + '.bn', cout, gamma_init=gamma_init)]
    if relu:
        out.append(ReLU(name + '.relu'))
    return out
