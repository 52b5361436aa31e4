"""A model written only to Theano-MPI's model contract (no theanompi_ext layers).

A 1-hidden-layer MLP on scikit-learn's 8x8 digits. Like Theano-MPI models it
keeps the minibatch in shared variables (``shared_x``/``shared_y``), builds
its cost on symbolic inputs ``x``/``y`` and compiles its train function
with ``givens`` and its own momentum update. Rank r's batch i is examples
``[(i*size + r)*n, (i*size + r + 1)*n)`` of the first 1600, so the k ranks'
batch i together are the global examples ``[i*kn, (i+1)*kn)``.

``DigitsMLP`` has no ``load_train_batch`` (the worker falls back to
``train_iter`` + restore); ``DigitsMLPHooked`` has the optional hook;
``DigitsMLPLayered`` also lists its layers (``tmx_layers``, objects with
``.output``/``.params`` as Theano-MPI's layer classes have), which lets
the worker overlap the exchange with a chunked backward pass.
"""
import numpy as np

import theanompi_ext.engine.core  # noqa: F401  (configures Theano: floatX, cache)
import theano
import theano.tensor as T

N_TRAIN = 1600
BATCH = 16
HIDDEN = 32


def load_digits_arrays():
    """(X float32 [0,1], y int32) of scikit-learn's digits, in file order."""
    from sklearn.datasets import load_digits
    d = load_digits()
    return (d.data / 16.0).astype(np.float32), d.target.astype(np.int32)


def init_params(seed=1234):
    """Initial W1, b1, W2, b2 (identical on every rank)."""
    rng = np.random.RandomState(seed)
    return [(rng.randn(64, HIDDEN) * 0.1).astype(np.float32), np.zeros(HIDDEN, np.float32),
            (rng.randn(HIDDEN, 10) * 0.1).astype(np.float32), np.zeros(10, np.float32)]


class _Data(object):
    def __init__(self, n_batch_train, n_batch_val):
        self.n_batch_train, self.n_batch_val = n_batch_train, n_batch_val


class DigitsMLP(object):
    """The contract: params, grads, cost, error, data, hyper-parameters, iter fns."""

    def __init__(self, config):
        self.verbose = config['verbose']
        self.rank, self.size = config['rank'], config['size']
        self.batch_size = n = BATCH
        self.n_epochs = 2
        self.n_subb = 1
        self.base_lr = 0.05
        self.shared_lr = theano.shared(np.float32(self.base_lr))
        self.mu, self.eta = 0.9, 1e-3
        self.use_momentum, self.use_nesterov_momentum = True, False
        X, Y = load_digits_arrays()
        self.X_train, self.y_train = X[:N_TRAIN], Y[:N_TRAIN]
        self.X_val, self.y_val = X[N_TRAIN:], Y[N_TRAIN:]
        self.data = _Data(N_TRAIN // (n * self.size), len(self.y_val) // (n * self.size))
        self.shared_x = theano.shared(np.zeros((n, 64), np.float32), name='shared_x')
        self.shared_y = theano.shared(np.zeros(n, np.int32), name='shared_y')
        self.x, self.y = T.matrix('x'), T.ivector('y')
        W1, b1, W2, b2 = [theano.shared(v, name=nm) for v, nm in
                          zip(init_params(), ('W', 'b', 'W', 'b'))]
        self.params = [W1, b1, W2, b2]
        self.weight_types = ['W', 'b', 'W', 'b']
        self.h = h = T.tanh(T.dot(self.x, W1) + b1)
        self.p = p = T.nnet.softmax(T.dot(h, W2) + b2)
        self.cost = -T.mean(T.log(p[T.arange(self.y.shape[0]), self.y]))
        self.error = T.mean(T.neq(T.argmax(p, axis=1), self.y))
        self.grads = T.grad(self.cost, self.params)
        self.epoch = 0

    def compile_iter_fns(self, sync_type='avg'):
        """Theano-MPI style: a train function with the model's own momentum step."""
        self.vels = [theano.shared(np.zeros_like(p.get_value())) for p in self.params]
        updates = []
        for p, g, v in zip(self.params, self.grads, self.vels):
            v_new = self.mu * v - self.shared_lr * g
            updates += [(v, v_new), (p, p + v_new)]
        givens = {self.x: self.shared_x, self.y: self.shared_y}
        self.train_fn = theano.function([], [self.cost, self.error], updates=updates,
                                        givens=givens)
        self.val_fn = theano.function([], [self.cost, self.error], givens=givens)

    def _load(self, X, Y, i):
        s = (i * self.size + self.rank) * self.batch_size
        self.shared_x.set_value(X[s:s + self.batch_size])
        self.shared_y.set_value(Y[s:s + self.batch_size])

    def train_iter(self, i, recorder):
        self._load(self.X_train, self.y_train, i)
        recorder.start()
        cost, err = self.train_fn()
        recorder.end('calc')
        recorder.train_error(i, cost, err)

    def val_iter(self, i, recorder):
        self._load(self.X_val, self.y_val, i)
        cost, err = self.val_fn()
        recorder.val_error(i, cost, err, err)

    def reset_iter(self, mode):
        pass

    def adjust_hyperp(self, epoch):
        if epoch + 1 in (30, 60):
            self.shared_lr.set_value(np.float32(self.shared_lr.get_value() / 10))

    def cleanup(self):
        pass


class DigitsMLPHooked(DigitsMLP):
    """The same model with the optional batch-loading hook."""

    def load_train_batch(self, i):
        self._load(self.X_train, self.y_train, i)


class _Layer(object):
    """What Theano-MPI's layer classes carry: a symbolic output and params."""

    def __init__(self, name, output, params):
        self.name, self.output, self.params = name, output, params


class DigitsMLPLayered(DigitsMLPHooked):
    """The hooked model plus the one optional attribute that enables overlap."""

    def __init__(self, config):
        super(DigitsMLPLayered, self).__init__(config)
        W1, b1, W2, b2 = self.params
        self.tmx_layers = [_Layer('hidden', self.h, [W1, b1]),
                           _Layer('softmax', self.p, [W2, b2])]
