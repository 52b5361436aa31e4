"""Two models laid out as Theano-MPI's zoo lays them out, on CPU ops.

``Cifar10Like`` follows ``theanompi/models/cifar10.py``: module-level
hyper-parameters, a file batch of ``file_batch_size = 2 * batch_size``
c01b images in ``shared_x``, an ``iscalar`` sub-batch index ``subb_ind``,
``shared_x_slice``/``shared_y_slice`` given for the symbolic ``x``/``y``
(and ``shared_lr`` for ``lr``) at compile time, and the input transformed
inside the graph (mean subtraction, crop, c01b -> bc01 dimshuffle) before
the first convolution. Its train function is compiled the way Theano-MPI's
``pre_model_iter_fn(model, k=size)`` compiles it: one function computes the
cost and stores the per-worker momentum, a second applies what the exchange
left in a second buffer. ``C01bLasagneLike`` keeps c01b data and puts the
dimshuffle into the slice, as the Lasagne zoo (vgg16.py) does. The
``...Layered`` variants list their layers (``tmx_layers``) for overlap.

Rank r's file batch i is examples ``[(i*k + r)*F, (i*k + r + 1)*F)`` of the
digits data (F = file batch size), so sub-batch s of the k ranks' file
batch i together are known global examples (see :func:`global_subbatch`).
No randomness: a reference can recompute every step.
"""
import numpy as np

import theano
import theano.tensor as T

n_epochs = 2
momentum = 0.9
weight_decay = 1e-3
batch_size = 8
file_batch_size = 2 * batch_size
learning_rate = 0.05
lr_policy = 'step'
lr_step = [50]
N_BATCH_TRAIN = 3          # file batches per rank per epoch
N_BATCH_VAL = 1
CROP = 1                   # Cifar10Like crops 8x8 -> 6x6 at offset CROP
FILTERS = 4


def load_digits_c01b():
    """Digits images as float32 (n, 1, 8, 8) in [0, 1], labels int64."""
    from sklearn.datasets import load_digits
    d = load_digits()
    return (d.images[:, None] / 16.0).astype(np.float32), d.target.astype(np.int64)


def global_subbatch(k, i, s, mode='train'):
    """Indices of the examples the k ranks use together in sub-batch s of file batch i."""
    base = 0 if mode == 'train' else k * N_BATCH_TRAIN * file_batch_size
    return np.concatenate([base + (i * k + r) * file_batch_size + s * batch_size +
                           np.arange(batch_size) for r in range(k)])


def init_params(in_side, seed=4321):
    """Initial conv W, b and softmax W, b (identical on every rank)."""
    rng = np.random.RandomState(seed)
    out_side = in_side - 2
    return [(rng.randn(FILTERS, 1, 3, 3) * 0.3).astype(np.float32),
            # Not 0: digits have blank patches, and relu's derivative at exactly 0
            # is a convention (Theano: 1/2) a reference should not depend on.
            np.full(FILTERS, 0.05, np.float32),
            (rng.randn(FILTERS * out_side * out_side, 10) * 0.1).astype(np.float32),
            np.zeros(10, np.float32)]


def image_mean():
    """The mean image the Cifar10Like graph subtracts (c01 layout)."""
    X, _ = load_digits_c01b()
    return X[:64].mean(0)


class _Layer(object):
    def __init__(self, name, output, params):
        self.name, self.output, self.params = name, output, params


class _Data(object):
    """What a Theano-MPI data class carries for the worker."""

    def __init__(self, rank, size):
        X, Y = load_digits_c01b()
        F = file_batch_size
        self.rawdata = X, Y
        self.n_batch_train, self.n_batch_val = N_BATCH_TRAIN, N_BATCH_VAL
        tr = [(i * size + rank) * F for i in range(N_BATCH_TRAIN)]
        vbase = size * N_BATCH_TRAIN * F
        va = [vbase + (i * size + rank) * F for i in range(N_BATCH_VAL)]
        self.train_img = [X[s:s + F] for s in tr]
        self.train_labels = [Y[s:s + F] for s in tr]
        self.val_img = [X[s:s + F] for s in va]
        self.val_labels = [Y[s:s + F] for s in va]


class Cifar10Like(object):  # c01b input
    side = 8 - 2 * CROP

    def __init__(self, config):
        self.verbose = config['verbose']
        self.rank = config['rank']
        self.size = config['size']
        self.name = type(self).__name__
        self.data = _Data(self.rank, self.size)
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
        self.shared_x_slice = self.slice_x(subb_ind)
        self.shared_y_slice = self.shared_y[subb_ind * batch_size:(subb_ind + 1) * batch_size]
        self.build_model()
        self.params = self.conv.params + self.softmax.params
        self.weight_types = ['W', 'b', 'W', 'b']
        self.grads = T.grad(self.cost, self.params)
        self.n_subb = file_batch_size // batch_size
        self.current_t, self.subb_t, self.current_v, self.subb_v = 0, 0, 0, 0

    def slice_x(self, subb_ind):
        return self.shared_x[:, :, :, subb_ind * batch_size:(subb_ind + 1) * batch_size]

    def network_input(self):
        """c01b x -> mean subtracted, cropped, bc01 (all inside the graph)."""
        self.x = T.ftensor4('x')
        centred = self.x - T.constant(image_mean()).dimshuffle(0, 1, 2, 'x')
        cropped = centred[:, CROP:CROP + self.side, CROP:CROP + self.side, :]
        return cropped.dimshuffle(3, 0, 1, 2)

    def build_model(self):
        inp = self.network_input()
        self.y = T.lvector('y')
        self.lr = T.scalar('lr')
        W1, b1, W2, b2 = [theano.shared(v, name=nm) for v, nm in
                          zip(init_params(self.side), ('W', 'b', 'W', 'b'))]
        conv = T.nnet.relu(T.nnet.conv2d(inp, W1, filter_flip=False) +
                           b1.dimshuffle('x', 0, 'x', 'x'))
        self.conv = _Layer('conv', conv, [W1, b1])
        p = T.nnet.softmax(T.dot(conv.flatten(2), W2) + b2)
        self.softmax = _Layer('softmax', p, [W2, b2])
        self.cost = -T.mean(T.log(p[T.arange(self.y.shape[0]), self.y]))
        self.error = T.mean(T.neq(T.argmax(p, axis=1), self.y))

    def compile_iter_fns(self, *args, **kwargs):
        """As pre_model_iter_fn(k=size): momentum into vels, params from vels2 / k."""
        k = float(self.size)
        self.vels = [theano.shared(p.get_value() * 0) for p in self.params]
        self.vels2 = [theano.shared(p.get_value() * 0) for p in self.params]
        up_v, up_dv = [], []
        for p, g, wt, v, v2 in zip(self.params, self.grads, self.weight_types,
                                   self.vels, self.vels2):
            real_g = g + self.eta * p if wt == 'W' else g
            real_lr = self.lr if wt == 'W' else 2. * self.lr
            up_v.append((v, self.mu * v + real_g))
            up_dv.append((p, p - real_lr * v2 / k))
        givens = [(self.x, self.shared_x_slice), (self.y, self.shared_y_slice),
                  (self.lr, self.shared_lr)]
        self.get_vel = theano.function([self.subb_ind], [self.cost, self.error],
                                       updates=up_v, givens=givens, on_unused_input='ignore')
        self.descent_vel = theano.function([], [], updates=up_dv,
                                           givens=[(self.lr, self.shared_lr)])

        def train_iter_fn(subb):
            self.descent_vel()
            return self.get_vel(subb)
        self.train_iter_fn = train_iter_fn
        self.val_iter_fn = theano.function([self.subb_ind], [self.cost, self.error],
                                           givens=givens[:2])

    def reset_iter(self, mode):
        if mode == 'train':
            self.current_t, self.subb_t = 0, 0
        else:
            self.current_v, self.subb_v = 0, 0

    def _load(self, img, labels, t):
        self.shared_x.set_value(np.rollaxis(img[t], 0, 4))    # (b,c,0,1) -> c01b
        self.shared_y.set_value(labels[t])

    def train_iter(self, count, recorder):
        if self.subb_t == 0:     # the whole file batch at sub-batch 0
            recorder.start()
            self._load(self.data.train_img, self.data.train_labels, self.current_t)
            recorder.end('wait')
        recorder.start()
        cost, error = self.train_iter_fn(self.subb_t)
        recorder.train_error(count, cost, error)
        recorder.end('calc')
        if self.subb_t + 1 == self.n_subb:
            self.current_t = (self.current_t + 1) % self.data.n_batch_train
            self.subb_t = 0
        else:
            self.subb_t += 1

    def val_iter(self, count, recorder):
        if self.subb_v == 0:
            self._load(self.data.val_img, self.data.val_labels, self.current_v)
        cost, error = self.val_iter_fn(self.subb_v)
        recorder.val_error(count, cost, error, error)
        if self.subb_v + 1 == self.n_subb:
            self.current_v = (self.current_v + 1) % self.data.n_batch_val
            self.subb_v = 0
        else:
            self.subb_v += 1

    def adjust_hyperp(self, epoch):
        if lr_policy == 'step' and epoch in lr_step:
            self.shared_lr.set_value(np.float32(self.shared_lr.get_value() / 10.))

    def cleanup(self):
        pass


class C01bLasagneLike(Cifar10Like):
    """c01b data; the slice itself is dimshuffled to bc01 (Lasagne zoo style)."""
    side = 8

    def slice_x(self, subb_ind):
        return Cifar10Like.slice_x(self, subb_ind).dimshuffle(3, 0, 1, 2)

    def network_input(self):
        self.x = T.ftensor4('x')      # bc01
        return self.x


class Cifar10LikeLayered(Cifar10Like):
    def __init__(self, config):
        super(Cifar10LikeLayered, self).__init__(config)
        self.tmx_layers = [self.conv, self.softmax]


class C01bLasagneLikeLayered(C01bLasagneLike):
    def __init__(self, config):
        super(C01bLasagneLikeLayered, self).__init__(config)
        self.tmx_layers = [self.conv, self.softmax]


class UnfedInput(Cifar10Like):
    """The cost reads a symbolic input the model never feeds (must be refused)."""

    def build_model(self):
        super(UnfedInput, self).build_model()
        self.temperature = T.scalar('temperature')
        self.cost = self.cost * self.temperature


class NoSubbatchIndex(Cifar10Like):
    """n_subb = 2 but no sub-batch index: its feed cannot be understood."""

    def __init__(self, config):
        super(NoSubbatchIndex, self).__init__(config)
        self._hidden = self.subb_ind, self.shared_x_slice, self.shared_y_slice
        del self.subb_ind, self.shared_x_slice, self.shared_y_slice

    def compile_iter_fns(self, *args, **kwargs):
        # Its own functions still slice; only what it shows is incomplete.
        self.subb_ind, self.shared_x_slice, self.shared_y_slice = self._hidden
        super(NoSubbatchIndex, self).compile_iter_fns(*args, **kwargs)
        del self.subb_ind, self.shared_x_slice, self.shared_y_slice


class RaisesInTrainIter(Cifar10Like):
    """A model bug: its train_iter fails (the rank's message must name this line)."""

    def train_iter(self, count, recorder):
        raise KeyError('no such file batch %d' % count)
