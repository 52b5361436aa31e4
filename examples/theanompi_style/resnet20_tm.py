"""ResNet-20 written the way Theano-MPI's ``theanompi/models/cifar10.py`` is.

Nothing here is written for theanompi_ext: no ``tmx_layers``, no
``load_train_batch`` (except in :class:`ResNet20TMHooked`, the same model
with the optional hook). The layout is cifar10.py's: module-level
hyper-parameters, ``self.data`` with file batches sharded per rank, a
c01b file batch in ``shared_x``, ``n_subb`` sub-batches selected by the
integer scalar ``subb_ind`` through ``shared_x_slice``/``shared_y_slice``,
the mean image subtracted and the batch dimshuffled to bc01 inside the
graph, ``self.layers = get_layers(lastlayer=...)`` and ``self.params``/
``self.weight_types`` from the layers, ``compile_iter_fns`` compiling
``get_vel``/``descent_vel`` as Theano-MPI's ``pre_model_iter_fn(model,
k=size)`` does, and ``train_iter`` loading the file batch at sub-batch 0
and calling ``self.train_iter_fn(self.subb_t)``.

The network is He et al.'s CIFAR ResNet-20 (3x32x32 inputs, a 3x3 stem of
16 channels, 3 stages of 3 basic blocks with 16/32/64 channels, global
average pooling, softmax over 10 classes), with projection shortcuts where
the shape changes: 272,474 parameters, as theanompi_ext's own ``resnet20``
(``theanompi_ext/model/resnet.py``). The data are synthetic
(:mod:`synthetic_cifar10`), generated from a fixed seed.

Run it (from the repository root)::

    PYTHONPATH=examples/theanompi_style python -m theanompi_ext.tmlauncher \
        -cfg=examples/theanompi_style/resnet20_tm.session [--dry-run]
"""
import numpy as np

import theano
import theano.tensor as T

from synthetic_cifar10 import SyntheticCifar10Data
from tm_layers import (BasicBlock, ConvBN, Dimshuffle, GlobalPool, Softmax, Subtract,
                       bn_stats, get_layers, get_params)

n_epochs = 2
momentum = 0.9
weight_decay = 0.0001
batch_size = 32
file_batch_size = 64
learning_rate = 0.1
lr_policy = 'step'
lr_step = [50, 75]
use_momentum = True
use_nesterov_momentum = False
n_train_files = 4        # file batches per rank per epoch
n_val_files = 1
data_seed = 1234
weight_seed = 4321


class ResNet20TM(object):  # c01b input
    depth, width, side = 20, 16, 32

    def __init__(self, config):
        self.verbose = config['verbose']
        self.rank = config['rank']
        self.size = config['size']
        self.name = type(self).__name__
        self.batch_size = batch_size
        self.file_batch_size = file_batch_size
        self.data = SyntheticCifar10Data(file_batch_size * n_train_files * self.size,
                                         file_batch_size * n_val_files * self.size, data_seed)
        self.channels = self.data.channels
        self.n_softmax_out = self.data.n_class
        self.data.batch_data(file_batch_size)
        self.data.shuffle_data(mode='train', common_seed=1234)
        self.data.shuffle_data(mode='val')
        self.data.shard_data(mode='train', rank=self.rank, size=self.size)
        self.data.shard_data(mode='val', rank=self.rank, size=self.size)

        self.n_epochs = n_epochs
        self.epoch = 0
        self.mu = momentum
        self.use_momentum = use_momentum
        self.use_nesterov_momentum = use_nesterov_momentum
        self.eta = weight_decay

        self.base_lr = np.float32(learning_rate)
        self.shared_lr = theano.shared(self.base_lr)
        self.shared_x = theano.shared(np.zeros((self.channels, self.side, self.side,
                                                file_batch_size), dtype=theano.config.floatX),
                                      borrow=True)
        self.shared_y = theano.shared(np.zeros((file_batch_size,), dtype=int), borrow=True)
        subb_ind = T.iscalar('subb')
        self.subb_ind = subb_ind
        self.shared_x_slice = self.shared_x[:, :, :, subb_ind * batch_size:
                                            (subb_ind + 1) * batch_size]
        self.shared_y_slice = self.shared_y[subb_ind * batch_size:(subb_ind + 1) * batch_size]

        self.build_model()
        self.output = self.output_layer.output
        self.layers = get_layers(lastlayer=self.output_layer)
        self.params, self.weight_types = get_params(self.layers)
        self.bn_stats = bn_stats(self.layers)
        if self.verbose:
            print('model size %d parameters' % sum(p.get_value().size for p in self.params))
        self.grads = T.grad(self.cost, self.params)

        self.compiled_train_fn_list = []
        self.train_iter_fn = None
        self.val_iter_fn = None
        self.n_subb = file_batch_size // batch_size
        self.current_t, self.last_one_t, self.subb_t = 0, False, 0
        self.current_v, self.last_one_v, self.subb_v = 0, False, 0

    def build_model(self):
        if self.verbose:
            print(self.name)
        rng = np.random.RandomState(weight_seed)
        self.x = T.ftensor4('x')
        self.y = T.lvector('y')
        self.lr = T.scalar('lr')
        subtract = Subtract(self.x, self.data.rawdata[4],
                            input_shape=(self.channels, self.side, self.side, self.batch_size),
                            printinfo=self.verbose)
        layer = Dimshuffle(subtract, (3, 0, 1, 2), printinfo=self.verbose)
        layer = ConvBN(layer, self.width, rng, printinfo=self.verbose)
        n_blocks = (self.depth - 2) // 6
        for stage in range(3):
            for j in range(n_blocks):
                stride = 2 if stage > 0 and j == 0 else 1
                layer = BasicBlock(layer, self.width * 2 ** stage, rng, stride,
                                   printinfo=self.verbose)
        layer = GlobalPool(layer, printinfo=self.verbose)
        softmax = Softmax(layer, self.n_softmax_out, rng, printinfo=self.verbose)
        self.output_layer = softmax
        self.cost = softmax.negative_log_likelihood(softmax.output, self.y)
        self.error = softmax.errors(softmax.output, self.y)
        self.val_cost = softmax.negative_log_likelihood(softmax.output_val, self.y)
        self.val_error = softmax.errors(softmax.output_val, self.y)

    # -- compiling, as Theano-MPI's lib/opt.py pre_model_iter_fn(model, k=size) -------------

    def _updates(self, k):
        """(updates of get_vel, updates of descent_vel): BN gamma/beta take a local
        momentum step; the others keep gradient / k in ``vels`` (k > 1) for the
        exchange to sum into ``vels2``, and ``descent_vel`` steps with that."""
        lr, mu, eta = self.lr, self.mu, self.eta
        up_v, up_dv = [], []
        self.vels, self.vels2 = [], []
        for p, g, wt in zip(self.params, self.grads, self.weight_types):
            velocity = theano.shared(p.get_value() * 0.)
            if p.name in ('gamma', 'beta'):
                step = mu * velocity + g
                real_lr = lr if p.name == 'gamma' else 2. * lr
                up_v += [(velocity, step), (p, p - real_lr * step)]
                continue
            real_g, real_lr = (g + eta * p, lr) if wt == 'W' else (g, 2. * lr)
            if k == 1:
                step = mu * velocity + real_g
                up_v += [(velocity, step), (p, p - real_lr * step)]
                continue
            summed, history = theano.shared(p.get_value() * 0.), theano.shared(p.get_value() * 0.)
            up_v.append((velocity, real_g / float(k)))
            step = mu * history + summed
            up_dv += [(history, step), (p, p - real_lr * step)]
            self.vels.append(velocity)
            self.vels2.append(summed)
        return up_v, up_dv

    def compile_train(self, *args):
        if self.verbose:
            print('compiling training function...')
        for kwargs in args:
            self.compiled_train_fn_list.append(theano.function(**kwargs))

    def compile_val(self):
        if self.verbose:
            print('compiling validation function...')
        self.val_fn = theano.function([self.subb_ind], [self.val_cost, self.val_error],
                                      givens=[(self.x, self.shared_x_slice),
                                              (self.y, self.shared_y_slice)])

    def compile_iter_fns(self, *args, **kwargs):
        up_v, up_dv = self._updates(self.size)
        givens = [(self.x, self.shared_x_slice), (self.y, self.shared_y_slice),
                  (self.lr, self.shared_lr)]
        self.compile_train(dict(inputs=[self.subb_ind], outputs=[self.cost, self.error],
                                updates=up_v, givens=givens),
                           dict(inputs=[], outputs=[], updates=up_dv,
                                givens=[(self.lr, self.shared_lr)], on_unused_input='ignore'))
        self.get_vel, self.descent_vel = self.compiled_train_fn_list

        def cdd_iter_fn(subb_ind):
            self.descent_vel()
            return self.get_vel(subb_ind)
        self.train_iter_fn = cdd_iter_fn
        self.compile_val()
        self.val_iter_fn = self.val_fn

    # -- the loops ------------------------------------------------------------------------

    def reset_iter(self, mode):
        if mode == 'train':
            self.current_t, self.subb_t, self.last_one_t = 0, 0, False
        else:
            self.current_v, self.subb_v, self.last_one_v = 0, 0, False

    def _load(self, img, labels, index):
        """File batch ``index`` into shared_x (c01b) and shared_y."""
        self.shared_x.set_value(np.rollaxis(img[index], 0, 4))
        self.shared_y.set_value(labels[index])

    def train_iter(self, count, recorder):
        """Use the train_iter_fn compiled."""
        if self.current_t == 0 and self.subb_t == 0:
            self.data.shuffle_data(mode='train', common_seed=self.epoch)
            self.data.shard_data(mode='train', rank=self.rank, size=self.size)
        if self.subb_t == 0:     # the whole file batch, at sub-batch 0
            recorder.start()
            self._load(self.data.train_img_shard, self.data.train_labels_shard, self.current_t)
            self.last_one_t = self.current_t == self.data.n_batch_train - 1
            recorder.end('wait')
        recorder.start()
        cost, error = self.train_iter_fn(self.subb_t)
        recorder.train_error(count, cost, error)
        recorder.end('calc')
        if self.subb_t + 1 == self.n_subb:
            self.current_t = 0 if self.last_one_t else self.current_t + 1
            self.subb_t = 0
        else:
            self.subb_t += 1

    def val_iter(self, count, recorder):
        """Use the val_iter_fn compiled (running BN statistics)."""
        if self.current_v == 0 and self.subb_v == 0:
            self.data.shuffle_data(mode='val')
            self.data.shard_data(mode='val', rank=self.rank, size=self.size)
        if self.subb_v == 0:
            self._load(self.data.val_img_shard, self.data.val_labels_shard, self.current_v)
            self.last_one_v = self.current_v == self.data.n_batch_val - 1
        cost, error = self.val_iter_fn(self.subb_v)
        recorder.val_error(count, cost, error, error)
        if self.subb_v + 1 == self.n_subb:
            self.current_v = 0 if self.last_one_v else self.current_v + 1
            self.subb_v = 0
        else:
            self.subb_v += 1

    def adjust_hyperp(self, epoch):
        """To be called once per epoch."""
        if lr_policy == 'step' and epoch in lr_step:
            self.shared_lr.set_value(np.float32(self.shared_lr.get_value() / 10.))

    def scale_lr(self, size):
        self.shared_lr.set_value(np.float32(self.shared_lr.get_value() * size))

    def cleanup(self):
        pass


class ResNet20TMHooked(ResNet20TM):
    """The same model with theanompi_ext's optional hook: the worker loads file
    batch ``i`` through it and runs its step itself."""

    def load_train_batch(self, i):
        self._load(self.data.train_img_shard, self.data.train_labels_shard, i)


class TinyResNetTM(ResNet20TM):
    """A ResNet-8 of width 4 on the same layout (tests and quick runs)."""
    depth, width = 8, 4


class TinyResNetTMHooked(ResNet20TMHooked):
    depth, width = 8, 4
