"""Layer objects in the manner of Theano-MPI's ``theanompi/models/layers2.py``,
on Theano's CPU ops (``T.nnet.conv2d`` where Theano-MPI calls cuDNN).

Each layer is built from its input (a symbolic variable, or the layer
below it, which it keeps as ``.input_layer``) and has ``.output``,
``.output_shape``, ``.name`` and, when it has parameters, ``.params`` and
``.weight_type`` (``'W'`` or ``'b'``, what Theano-MPI's update reads).
``get_layers(lastlayer)`` walks ``input_layer`` down from the top, as
layers2's does. A residual block is one layer object.

Batch normalisation (layers2 has none): ``gamma``/``beta`` are named so,
which is how Theano-MPI's ``opt.py`` recognises them; the running mean and
variance move through the ``default_update`` of a clone of each (the clone
shares the storage), so whichever compiled function computes the training
forward pass moves them, once per call, and a validation function, which
reads the originals, does not. Every layer also builds ``.output_val``,
the inference pass (running statistics), from its input's ``output_val``.
"""
import numpy as np

import theano
import theano.tensor as T

floatX = theano.config.floatX
BN_EPS = 1e-5
BN_ALPHA = 0.1          # running statistics: (1 - alpha) * old + alpha * batch


def shared_value(value, name):
    return theano.shared(np.asarray(value, dtype=floatX), name=name, borrow=True)


def he_normal(rng, shape):
    """N(0, 2 / fan_in) filters (fan_in = all axes but the first)."""
    fan_in = int(np.prod(shape[1:]))
    return rng.normal(0.0, np.sqrt(2.0 / fan_in), size=shape)


def conv(x, W, stride, pad):
    """bc01 correlation, ``pad`` zeros on each side."""
    return T.nnet.conv2d(x, W, border_mode=(pad, pad), subsample=(stride, stride),
                         filter_flip=False)


class BatchNormal(object):
    """Per-channel batch normalisation of bc01 maps (a part of a layer, not a layer)."""

    def __init__(self, channels, gamma=1.0):
        self.gamma = shared_value(np.full(channels, gamma), 'gamma')
        self.beta = shared_value(np.zeros(channels), 'beta')
        self.mean = shared_value(np.zeros(channels), 'mean')
        self.var = shared_value(np.ones(channels), 'var')
        self.params = [self.gamma, self.beta]
        self.weight_type = ['b', 'b']

    @staticmethod
    def _affine(v):
        return v.dimshuffle('x', 0, 'x', 'x')

    def train(self, x):
        """Batch statistics; the running ones follow by default update."""
        axes = (0, 2, 3)
        batch_mean = x.mean(axis=axes)
        centred = x - self._affine(batch_mean)
        batch_var = T.sqr(centred).mean(axis=axes)
        running_mean, running_var = self.mean.clone(), self.var.clone()
        running_mean.default_update = (1 - BN_ALPHA) * running_mean + BN_ALPHA * batch_mean
        running_var.default_update = (1 - BN_ALPHA) * running_var + BN_ALPHA * batch_var
        # Zero times each clone puts it on the graph, so its update is applied.
        batch_var = batch_var + 0 * running_mean + 0 * running_var
        scaled = centred * self._affine(T.inv(T.sqrt(batch_var + BN_EPS)))
        return scaled * self._affine(self.gamma) + self._affine(self.beta)

    def infer(self, x):
        inv_std = T.inv(T.sqrt(self.var + BN_EPS))
        return (x - self._affine(self.mean)) * self._affine(inv_std * self.gamma) + \
            self._affine(self.beta)


class Layer(object):
    """Shape bookkeeping shared by every layer."""

    def take_input(self, input, input_shape=None):
        if hasattr(input, 'output'):
            self.input_layer = input
            self.input = input.output
            self.input_val = input.output_val
            self.input_shape = tuple(input.output_shape)
        else:
            if input_shape is None:
                raise ValueError('%s: a symbolic input needs its input_shape' % type(self).__name__)
            self.input = self.input_val = input
            self.input_shape = tuple(input_shape)

    def print_shape(self):
        print('Layer %s \t in %s --> out %s' % (self.name, self.input_shape, self.output_shape))


class Subtract(Layer):
    """c01b input minus a c01 mean image."""

    def __init__(self, input, subtract_arr, input_shape=None, printinfo=False):
        self.take_input(input, input_shape)
        mean = theano.shared(np.asarray(subtract_arr, dtype=floatX)[..., None],
                             broadcastable=(False, False, False, True))
        self.output = self.input - mean
        self.output_val = self.input_val - mean
        self.output_shape = self.input_shape
        self.name = 'Subtract\t'
        if printinfo:
            self.print_shape()


class Dimshuffle(Layer):
    def __init__(self, input, new_axis_order, printinfo=False):
        self.take_input(input)
        self.output = self.input.dimshuffle(*new_axis_order)
        self.output_val = self.input_val.dimshuffle(*new_axis_order)
        self.output_shape = tuple(self.input_shape[i] for i in new_axis_order)
        self.name = 'Dimshuffle    '
        if printinfo:
            self.print_shape()


class ConvBN(Layer):
    """3x3 convolution (no bias), batch norm, ReLU: the stem."""

    def __init__(self, input, n_out, rng, stride=1, printinfo=False):
        self.take_input(input)
        b, c, h, w = self.input_shape
        self.W = shared_value(he_normal(rng, (n_out, c, 3, 3)), 'W')
        self.bn = BatchNormal(n_out)
        self.output = T.nnet.relu(self.bn.train(conv(self.input, self.W, stride, 1)))
        self.output_val = T.nnet.relu(self.bn.infer(conv(self.input_val, self.W, stride, 1)))
        self.params = [self.W] + self.bn.params
        self.weight_type = ['W'] + self.bn.weight_type
        self.output_shape = (b, n_out, (h - 1) // stride + 1, (w - 1) // stride + 1)
        self.name = 'ConvBN\t'
        if printinfo:
            self.print_shape()


class BasicBlock(Layer):
    """relu(bn(conv3x3(relu(bn(conv3x3(x))))) + shortcut(x)), one layer object.

    The shortcut is the identity when the shape is kept, else a strided 1x1
    convolution with batch norm. The branch's last BN starts at gamma 0
    (the block starts as the identity).
    """

    def __init__(self, input, n_out, rng, stride=1, printinfo=False):
        self.take_input(input)
        b, c, h, w = self.input_shape
        self.W_a = shared_value(he_normal(rng, (n_out, c, 3, 3)), 'W')
        self.bn_a = BatchNormal(n_out)
        self.W_b = shared_value(he_normal(rng, (n_out, n_out, 3, 3)), 'W')
        self.bn_b = BatchNormal(n_out, gamma=0.0)
        self.params = [self.W_a] + self.bn_a.params + [self.W_b] + self.bn_b.params
        self.weight_type = ['W'] + self.bn_a.weight_type + ['W'] + self.bn_b.weight_type
        self.project = stride != 1 or c != n_out
        if self.project:
            self.W_p = shared_value(he_normal(rng, (n_out, c, 1, 1)), 'W')
            self.bn_p = BatchNormal(n_out)
            self.params += [self.W_p] + self.bn_p.params
            self.weight_type += ['W'] + self.bn_p.weight_type
        self.stride = stride
        self.output = self._block(self.input, 'train')
        self.output_val = self._block(self.input_val, 'infer')
        self.output_shape = (b, n_out, (h - 1) // stride + 1, (w - 1) // stride + 1)
        self.name = 'BasicBlock'
        if printinfo:
            self.print_shape()

    def _block(self, x, how):
        a, bb = getattr(self.bn_a, how), getattr(self.bn_b, how)
        branch = bb(conv(T.nnet.relu(a(conv(x, self.W_a, self.stride, 1))), self.W_b, 1, 1))
        short = getattr(self.bn_p, how)(conv(x, self.W_p, self.stride, 0)) if self.project \
            else x
        return T.nnet.relu(branch + short)


class GlobalPool(Layer):
    """Mean over the spatial axes: (b, c, h, w) -> (b, c)."""

    def __init__(self, input, printinfo=False):
        self.take_input(input)
        self.output = self.input.mean(axis=(2, 3))
        self.output_val = self.input_val.mean(axis=(2, 3))
        self.output_shape = self.input_shape[:2]
        self.name = 'GlobalPool'
        if printinfo:
            self.print_shape()


class Softmax(Layer):
    def __init__(self, input, n_out, rng, printinfo=False):
        self.take_input(input)
        n_in = self.input_shape[-1]
        self.W = shared_value(rng.normal(0.0, 0.01, size=(n_in, n_out)), 'W')
        self.b = shared_value(np.zeros(n_out), 'b')
        self.p_y_given_x = T.nnet.softmax(T.dot(self.input, self.W) + self.b)
        self.output = self.p_y_given_x
        self.output_val = T.nnet.softmax(T.dot(self.input_val, self.W) + self.b)
        self.params = [self.W, self.b]
        self.weight_type = ['W', 'b']
        self.output_shape = (self.input_shape[0], n_out)
        self.name = 'Softmax\t'
        if printinfo:
            self.print_shape()

    @staticmethod
    def negative_log_likelihood(p, y):
        return -T.mean(T.log(p)[T.arange(y.shape[0]), y])

    @staticmethod
    def errors(p, y):
        return T.mean(T.neq(T.argmax(p, axis=1), y))


def get_layers(lastlayer):
    """Every layer below ``lastlayer`` through ``input_layer``, input first."""
    layers = [lastlayer]
    while hasattr(layers[-1], 'input_layer'):
        layers.append(layers[-1].input_layer)
    return layers[::-1]


def get_params(layers):
    """(params, weight_types) of the layers that have parameters, in order."""
    params, weight_types = [], []
    for layer in layers:
        if hasattr(layer, 'params'):
            params += layer.params
            weight_types += layer.weight_type
    return params, weight_types


def bn_stats(layers):
    """The running statistics (mean, var) of every batch norm in ``layers``."""
    out = []
    for layer in layers:
        for part in vars(layer).values():
            if isinstance(part, BatchNormal):
                out += [part.mean, part.var]
    return out
