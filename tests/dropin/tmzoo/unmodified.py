"""Unmodified Theano-MPI models: no ``tmx_layers``, no ``load_train_batch`` hook.

Laid out as Theano-MPI's zoo lays its models out (``models/cifar10.py``,
``lasagne_model_zoo/vgg16.py`` and ``resnet50.py``), on CPU ops and the
8x8 digits: a file batch of 2 sub-batches of c01b images in ``shared_x``,
the sub-batch index ``subb_ind``, ``shared_x_slice``/``shared_y_slice``
given for ``x``/``y``, ``compile_iter_fns`` compiling ``get_vel`` and
``descent_vel`` the way Theano-MPI's ``pre_model_iter_fn(model, k=size)``
does, and ``train_iter`` loading the file batch at sub-batch 0 and calling
``self.train_iter_fn(self.subb_t)``. Nothing here is written for
theanompi_ext: it has to find the chunks (from the graph, ``model.layers``
or ``model.output_layer``) and its own step by itself.

* :class:`NativeLayers`: cifar10.py's native layer objects (``.output``,
  ``.input_layer``, ``.name``, ``.params``/``.weight_type`` where they have
  parameters), ``self.layers = get_layers(lastlayer=softmax)``; the input is
  mean-subtracted, cropped and dimshuffled c01b -> bc01 inside the graph.
* :class:`LasagneVGG`: the zoo's VGG shape on (fake) Lasagne,
  ``self.output_layer``, the c01b -> bc01 dimshuffle inside the slice.
* :class:`LasagneResNet`: a small residual network with Lasagne batch norm
  (running statistics updated through ``default_update``), an identity and
  a 1x1-projection shortcut.
* :class:`NativeLayersDropout`: :class:`NativeLayers` with a random-stream
  dropout after the FC layer (as layers2.Dropout).

Every model counts the calls of its own compiled train functions (a counter
updated by ``get_vel`` and ``descent_vel`` themselves) and, in ``cleanup()``
with ``TMZOO_REPORT`` set, writes ``$TMZOO_REPORT/rank<r>.json``:
``own_train_calls``, ``params`` and ``bn_stats`` (lists), atomically.
The weights are seeded, identical on every rank; the data are those of
:mod:`tmzoo.subbatch` (rank r's file batch i: :func:`tmzoo.subbatch.global_subbatch`).
"""
import json
import os

import numpy as np

import theano
import theano.tensor as T
from theano.tensor.signal.pool import pool_2d

from tmzoo import subbatch as sb

n_epochs = 1
momentum = 0.9
weight_decay = 1e-3
batch_size = sb.batch_size
file_batch_size = sb.file_batch_size
learning_rate = 0.05
lr_policy = 'step'
lr_step = [50]
SEED = 2024
CROP = 1
BN_NAMES = ('gamma', 'beta')    # Theano-MPI's opt.py updates these locally


# -- cifar10.py-style native layers (layers2.py's shape, CPU ops) ---------------------------

class _Native(object):
    """What layers2.Layer keeps: the input layer when the input is a layer."""

    def take_input(self, input, input_shape=None):
        if hasattr(input, 'output'):
            self.input_layer = input
            self.input = input.output
            self.input_shape = tuple(input.output_shape)
        else:
            self.input = input
            self.input_shape = tuple(input_shape)


class Subtract(_Native):
    def __init__(self, input, subtract_arr, input_shape=None):
        self.take_input(input, input_shape)
        mean = theano.shared(subtract_arr.astype(theano.config.floatX),
                             broadcastable=(False, False, False, True))
        self.output = self.input - mean
        self.output_shape = self.input_shape
        self.name = 'Subtract\t'


class Crop(_Native):
    """The centre crop (layers2.Crop with random cropping off), c01b."""

    def __init__(self, input, crop):
        self.take_input(input)
        c, h, w, b = self.input_shape
        self.output = self.input[:, crop:h - crop, crop:w - crop, :]
        self.output_shape = (c, h - 2 * crop, w - 2 * crop, b)
        self.name = 'Crop\t'


class Dimshuffle(_Native):
    def __init__(self, input, new_axis_order):
        self.take_input(input)
        self.output = self.input.dimshuffle(*new_axis_order)
        self.output_shape = tuple(self.input_shape[i] for i in new_axis_order)
        self.name = 'Dimshuffle    '


class Conv(_Native):
    """conv (bc01, correlation) + bias + ReLU, 'same' padding for odd filters."""

    def __init__(self, input, W, b, padsize):
        self.take_input(input)
        self.W, self.b = W, b
        out = T.nnet.conv2d(self.input, W, border_mode=padsize, filter_flip=False)
        self.output = T.maximum(out + b.dimshuffle('x', 0, 'x', 'x'), 0)
        f, _, k, _ = W.get_value().shape
        bb, _, h, w = self.input_shape
        self.output_shape = (bb, f, h + 2 * padsize - k + 1, w + 2 * padsize - k + 1)
        self.params = [W, b]
        self.weight_type = ['W', 'b']
        self.name = 'Conv (cpu)'


class Pool(_Native):
    def __init__(self, input, poolsize):
        self.take_input(input)
        self.output = pool_2d(self.input, ws=(poolsize, poolsize), ignore_border=True,
                              mode='max')
        b, c, h, w = self.input_shape
        self.output_shape = (b, c, h // poolsize, w // poolsize)
        self.name = 'Pool\t'


class Flatten(_Native):
    def __init__(self, input, axis):
        self.take_input(input)
        self.output = T.flatten(self.input, axis)
        self.output_shape = (self.input_shape[0], int(np.prod(self.input_shape[1:])))
        self.name = 'Flatten\t'


class FC(_Native):
    def __init__(self, input, W, b):
        self.take_input(input)
        self.W, self.b = W, b
        self.output = T.maximum(T.dot(self.input, W) + b, 0)
        self.output_shape = (self.input_shape[0], W.get_value().shape[1])
        self.params = [W, b]
        self.weight_type = ['W', 'b']
        self.name = 'FC\t'


class Dropout(_Native):
    """layers2.Dropout: a binomial mask from a shared RandomStreams, a flag for validation."""

    def __init__(self, input, prob_drop=0.5, seed=SEED):
        self.take_input(input)
        self.prob_keep = 1.0 - prob_drop
        self.flag_on = theano.shared(np.float32(1.0))
        rng = T.shared_randomstreams.RandomStreams(seed)
        mask = T.cast(rng.binomial(n=1, p=self.prob_keep, size=self.input.shape),
                      theano.config.floatX)
        self.output = self.flag_on * mask * self.input + \
            (1.0 - self.flag_on) * self.prob_keep * self.input
        self.output_shape = self.input_shape
        self.name = 'Dropout' + str(prob_drop)


class Softmax(_Native):
    def __init__(self, input, W, b):
        self.take_input(input)
        self.W, self.b = W, b
        self.p_y_given_x = T.nnet.softmax(T.dot(self.input, W) + b)
        self.y_pred = T.argmax(self.p_y_given_x, axis=1)
        self.output = self.p_y_given_x
        self.output_shape = (self.input_shape[0], W.get_value().shape[1])
        self.params = [W, b]
        self.weight_type = ['W', 'b']
        self.name = 'Softmax\t'

    def negative_log_likelihood(self, y):
        return -T.mean(T.log(self.p_y_given_x)[T.arange(y.shape[0]), y])

    def errors(self, y):
        return T.mean(T.neq(self.y_pred, y))


def get_layers(lastlayer):
    """layers2.get_layers: follow ``input_layer`` down from the last layer, forward order."""
    layers = [lastlayer]
    while hasattr(lastlayer, 'input_layer'):
        lastlayer = lastlayer.input_layer
        layers.append(lastlayer)
    return layers[::-1]


def get_params(layers):
    """layers2.get_params: the params and weight types of the layers that have any."""
    params, weight_types = [], []
    for layer in layers:
        if hasattr(layer, 'params'):
            params += layer.params
            weight_types += layer.weight_type
    return params, weight_types


def extract_weight_types(params):
    """layers2.extract_weight_types: 'W' for a matrix or tensor, 'b' for a vector."""
    return ['W' if p.get_value().ndim > 1 else 'b' for p in params]


def _shared(rng, shape, std=None, val=0.0):
    value = rng.normal(0.0, std, size=shape) if std else np.full(shape, val)
    return theano.shared(value.astype(theano.config.floatX))


# -- the Theano-MPI model skeleton ------------------------------------------------------------

class _ZooModel(object):
    """The part every Theano-MPI zoo model repeats: data, shared file batch, slices,
    hyper-parameters, the compile of ``pre_model_iter_fn(k=size)``, the loops."""

    def __init__(self, config):
        self.verbose = config['verbose']
        self.rank = config['rank']
        self.size = config['size']
        self.name = type(self).__name__
        self.data = sb._Data(self.rank, self.size)
        self.channels = 1
        self.batch_size = batch_size
        self.file_batch_size = file_batch_size
        self.n_epochs = n_epochs
        self.epoch = 0
        self.mu = momentum
        self.use_momentum = True
        self.use_nesterov_momentum = False
        self.eta = weight_decay
        self.base_lr = np.float32(learning_rate)
        self.shared_lr = theano.shared(self.base_lr)
        self.shared_x = theano.shared(np.zeros((1, 8, 8, file_batch_size),
                                               dtype=theano.config.floatX), borrow=True)
        self.shared_y = theano.shared(np.zeros((file_batch_size,), dtype=int), borrow=True)
        subb_ind = T.iscalar('subb')
        self.subb_ind = subb_ind
        self.shared_x_slice = self.shared_x[:, :, :, subb_ind * batch_size:
                                            (subb_ind + 1) * batch_size]
        self.shared_y_slice = self.shared_y[subb_ind * batch_size:(subb_ind + 1) * batch_size]
        self.build_model()
        self.grads = T.grad(self.cost, self.params)
        self.compiled_train_fn_list = []
        self.train_iter_fn = None
        self.val_iter_fn = None
        self.n_subb = file_batch_size // batch_size
        self.current_t, self.subb_t, self.current_v, self.subb_v = 0, 0, 0, 0
        # Counts the calls of this model's own compiled train functions.
        self.own_calls = theano.shared(np.int64(0), name='own_train_calls')

    def bn_stats(self):
        """The batch-norm running statistics (none here)."""
        return []

    def val_outputs(self):
        """(cost, error) the validation function computes."""
        return self.cost, self.error

    def compile_iter_fns(self, *args, **kwargs):
        """As Theano-MPI's ``pre_model_iter_fn(model, k=size)``: ``get_vel`` keeps the
        gradient / k in ``vels`` (BN gamma/beta: a local momentum step instead),
        ``descent_vel`` steps with what the exchange left in ``vels2``."""
        k = float(self.size)
        lr, mu, eta = self.lr, self.mu, self.eta
        count = (self.own_calls, self.own_calls + 1)
        up_v, up_dv = [count], [count]
        self.vels, self.vels2 = [], []
        for p, g, wt in zip(self.params, self.grads, self.weight_types):
            if p.name in BN_NAMES:
                u = theano.shared(p.get_value() * 0.)
                real_lr = lr if p.name == 'gamma' else 2. * lr
                up_v += [(u, mu * u + g), (p, p - real_lr * (mu * u + g))]
                continue
            real_g, real_lr = (g + eta * p, lr) if wt == 'W' else (g, 2. * lr)
            v, v2, hist = [theano.shared(p.get_value() * 0.) for _ in range(3)]
            up_v.append((v, real_g / k))
            up_dv += [(hist, mu * hist + v2), (p, p - real_lr * (mu * hist + v2))]
            self.vels.append(v)
            self.vels2.append(v2)
        givens = [(self.x, self.shared_x_slice), (self.y, self.shared_y_slice),
                  (self.lr, self.shared_lr)]
        self.compile_train(
            dict(inputs=[self.subb_ind], outputs=[self.cost, self.error],
                 updates=_fix_broadcast(up_v), givens=givens, on_unused_input='ignore'),
            dict(inputs=[], outputs=[], updates=_fix_broadcast(up_dv),
                 givens=[(self.lr, self.shared_lr)], on_unused_input='ignore'))
        self.get_vel, self.descent_vel = self.compiled_train_fn_list

        def cdd_iter_fn(subb_ind):
            self.descent_vel()
            return self.get_vel(subb_ind)
        self.train_iter_fn = cdd_iter_fn
        cost, error = self.val_outputs()
        self.val_iter_fn = theano.function([self.subb_ind], [cost, error],
                                           givens=givens[:2], on_unused_input='ignore')

    def compile_train(self, *args):
        for kwargs in args:
            self.compiled_train_fn_list.append(theano.function(**kwargs))

    # The loops of the zoo (load the file batch at sub-batch 0, then the train function).
    reset_iter = sb.Cifar10Like.reset_iter
    _load = sb.Cifar10Like._load
    train_iter = sb.Cifar10Like.train_iter
    val_iter = sb.Cifar10Like.val_iter

    def adjust_hyperp(self, epoch):
        if lr_policy == 'step' and epoch in lr_step:
            self.shared_lr.set_value(np.float32(self.shared_lr.get_value() / 10.))

    def cleanup(self):
        """With ``TMZOO_REPORT`` set: this rank's report, written whole."""
        where = os.environ.get('TMZOO_REPORT')
        if not where:
            return
        report = {'own_train_calls': int(self.own_calls.get_value()),
                  'params': [np.asarray(p.get_value()).tolist() for p in self.params],
                  'bn_stats': [np.asarray(s.get_value()).tolist() for s in self.bn_stats()]}
        path = os.path.join(where, 'rank%d.json' % self.rank)
        with open(path + '.tmp', 'w') as f:
            json.dump(report, f)
        os.replace(path + '.tmp', path)


def _fix_broadcast(updates):
    """opt.fix_update_bcasts: an update keeps its variable's broadcastable pattern."""
    return [(p, T.patternbroadcast(u, p.broadcastable) if u.broadcastable != p.broadcastable
             else u) for p, u in updates]


class NativeLayers(_ZooModel):
    """cifar10.py's layout: c01b x -> Subtract -> Crop -> Dimshuffle -> Conv -> Pool
    -> Conv -> Flatten -> FC -> Softmax."""
    dropout = False

    def build_model(self):
        rng = np.random.RandomState(SEED)
        self.x = T.ftensor4('x')
        self.y = T.lvector('y')
        self.lr = T.scalar('lr')
        side = 8 - 2 * CROP
        sub = Subtract(self.x, sb.image_mean()[..., None], input_shape=(1, 8, 8, batch_size))
        crop = Crop(sub, CROP)
        shuffle = Dimshuffle(crop, (3, 0, 1, 2))
        conv1 = Conv(shuffle, _shared(rng, (4, 1, 3, 3), 0.3), _shared(rng, (4,), val=0.05), 1)
        pool = Pool(conv1, 2)
        conv2 = Conv(pool, _shared(rng, (8, 4, 3, 3), 0.2), _shared(rng, (8,), val=0.05), 1)
        flat = Flatten(conv2, 2)
        fc = FC(flat, _shared(rng, (8 * (side // 2) ** 2, 16), 0.1),
                _shared(rng, (16,), val=0.05))
        top = Dropout(fc, 0.25) if self.dropout else fc
        self.output_layer = Softmax(top, _shared(rng, (16, 10), 0.1), _shared(rng, (10,)))
        self.output = self.output_layer.output
        self.layers = get_layers(lastlayer=self.output_layer)
        self.params, self.weight_types = get_params(self.layers)
        self.cost = self.output_layer.negative_log_likelihood(self.y)
        self.error = self.output_layer.errors(self.y)


class NativeLayersDropout(NativeLayers):
    """With a random-stream dropout after the FC layer (its mask drawn once per step)."""
    dropout = True


class _LasagneModel(_ZooModel):
    """The Lasagne zoo's way: bc01 slice, get_output of output_layer, params by tag."""

    def __init__(self, config):
        super(_LasagneModel, self).__init__(config)
        # vgg16.py re-slices after build_model: c01b -> bc01 inside the slice.
        self.shared_x_slice = self.shared_x_slice.dimshuffle(3, 0, 1, 2)

    def build_model(self):
        import lasagne
        from lasagne.layers import get_output, get_all_params
        from lasagne.objectives import categorical_accuracy
        lasagne.random.set_rng(np.random.RandomState(SEED))   # every rank: the same weights
        self.x = T.ftensor4('x')
        self.y = T.lvector('y')
        self.lr = T.scalar('lr')
        # The zoo's build functions return the net as a dict of layers.
        self.net = self.build_network((None, 1, 8, 8))
        self.output_layer = self.net['prob']
        self.output = get_output(self.output_layer, self.x, deterministic=False)
        self.cost = lasagne.objectives.categorical_crossentropy(self.output, self.y).mean()
        self.error = 1 - categorical_accuracy(self.output, self.y, top_k=1).mean()
        self.params = get_all_params(self.output_layer, trainable=True)
        self.weight_types = extract_weight_types(self.params)

    def val_outputs(self):
        import lasagne
        out = lasagne.layers.get_output(self.output_layer, self.x, deterministic=True)
        cost = lasagne.objectives.categorical_crossentropy(out, self.y).mean()
        return cost, 1 - lasagne.objectives.categorical_accuracy(out, self.y).mean()

    def bn_stats(self):
        from lasagne.layers import get_all_params
        return get_all_params(self.output_layer, batch_norm_stat=True)


class LasagneVGG(_LasagneModel):
    """vgg16.py's shape: conv-conv-pool-conv-pool-dense-dense(softmax)."""

    def build_network(self, input_shape):
        from lasagne.layers import (InputLayer, DenseLayer, NonlinearityLayer,
                                    Conv2DLayer as ConvLayer, MaxPool2DLayer as PoolLayer)
        from lasagne.nonlinearities import softmax
        net = {}
        net['input'] = InputLayer(input_shape)
        net['conv1_1'] = ConvLayer(net['input'], 4, 3, pad=1, flip_filters=False,
                                   name='conv1_1')
        net['conv1_2'] = ConvLayer(net['conv1_1'], 4, 3, pad=1, flip_filters=False,
                                   name='conv1_2')
        net['pool1'] = PoolLayer(net['conv1_2'], 2)
        net['conv2_1'] = ConvLayer(net['pool1'], 8, 3, pad=1, flip_filters=False,
                                   name='conv2_1')
        net['pool2'] = PoolLayer(net['conv2_1'], 2)
        net['fc6'] = DenseLayer(net['pool2'], num_units=16, name='fc6')
        net['fc8'] = DenseLayer(net['fc6'], num_units=10, nonlinearity=None, name='fc8')
        net['prob'] = NonlinearityLayer(net['fc8'], softmax)
        return net


class LasagneResNet(_LasagneModel):
    """resnet50.py's blocks, small: conv-BN-relu stem, a block with the identity
    shortcut, a strided block with a 1x1 conv-BN projection, global pool, softmax."""

    def build_network(self, input_shape):
        from lasagne.layers import InputLayer, GlobalPoolLayer, DenseLayer
        from lasagne.nonlinearities import softmax
        net = {'input': InputLayer(input_shape)}
        net['stem'] = _conv_bn(net['input'], 4, 3, 1, 1)
        net['res1'] = _residual_block(net['stem'], 4, 1)
        net['res2'] = _residual_block(net['res1'], 8, 2)
        net['pool'] = GlobalPoolLayer(net['res2'])
        net['prob'] = DenseLayer(net['pool'], num_units=10, nonlinearity=softmax)
        return net


def _conv_bn(incoming, filters, size, stride, pad, relu=True):
    """resnet50.py's build_simple_block: conv (no bias) -> BN -> (ReLU)."""
    import lasagne
    from lasagne.layers import Conv2DLayer, BatchNormLayer, NonlinearityLayer
    net = Conv2DLayer(incoming, filters, size, stride, pad, b=None, nonlinearity=None,
                      W=lasagne.init.HeNormal(gain='relu'), flip_filters=False)
    net = BatchNormLayer(net)
    return NonlinearityLayer(net, nonlinearity=lasagne.nonlinearities.rectify) if relu else net


def _residual_block(incoming, filters, stride):
    """conv-BN-relu-conv-BN plus the shortcut (identity, or a 1x1 conv-BN projection), relu."""
    from lasagne.layers import ElemwiseSumLayer, NonlinearityLayer
    from lasagne.nonlinearities import rectify
    right = _conv_bn(incoming, filters, 3, stride, 1)
    right = _conv_bn(right, filters, 3, 1, 1, relu=False)
    left = incoming
    if stride != 1 or incoming.output_shape[1] != filters:
        left = _conv_bn(incoming, filters, 1, stride, 0, relu=False)
    return NonlinearityLayer(ElemwiseSumLayer([left, right], coeffs=1), nonlinearity=rectify)
