"""A Theano-MPI-style model with every kind of state a restart must bring back
(tests/compat/test_tm_restarts.py; the contract: theanompi_compat/resume.py).

On the digits MLP of ``digits_contract``: a batch-norm-like hidden layer
with a running mean (a shared variable with a ``default_update``, moved by
each training step, read by validation) and a local ``gamma`` (not
exchanged: per worker); a cumulative shuffle in ``reset_iter('train')``
seeded with ``self.epoch`` through NumPy's global generator, as Theano-MPI's
``shuffle_data(common_seed=self.epoch)``; noise added to each training batch
from the model's own ``RandomState``; the rate divided by 2 after epoch 2.
"""
import os
import sys

import numpy as np
import theano
import theano.tensor as T

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from digits_contract import DigitsMLP, HIDDEN  # noqa: E402

N_EPOCHS = 3


class ResumableMLP(DigitsMLP):
    """:class:`DigitsMLP` with BN-like state, a shuffle, augmentation and a decay."""

    def __init__(self, config):
        super(ResumableMLP, self).__init__(config)
        self.n_epochs = N_EPOCHS
        W1, b1, W2, b2 = self.params
        self.gamma = theano.shared(np.ones(HIDDEN, np.float32), name='gamma')
        self.running_mean = theano.shared(np.zeros(HIDDEN, np.float32), name='mean')
        pre = T.dot(self.x, W1) + b1
        mean = pre.mean(axis=0)
        self.running_mean.default_update = (np.float32(0.9) * self.running_mean +
                                             np.float32(0.1) * mean)
        # Lasagne's way of tying the statistic to the training graph.
        h = T.tanh(self.gamma * (pre - mean) + 0 * self.running_mean)
        h_val = T.tanh(self.gamma * (pre - self.running_mean))
        self.params = [W1, b1, self.gamma, W2, b2]
        self.weight_types = ['W', 'b', 'W', 'W', 'b']
        p = T.nnet.softmax(T.dot(h, W2) + b2)
        p_val = T.nnet.softmax(T.dot(h_val, W2) + b2)
        rows = T.arange(self.y.shape[0])
        self.cost = -T.mean(T.log(p[rows, self.y]))
        self.error = T.mean(T.neq(T.argmax(p, axis=1), self.y))
        self.val_cost = -T.mean(T.log(p_val[rows, self.y]))
        self.val_error = T.mean(T.neq(T.argmax(p_val, axis=1), self.y))
        self.grads = T.grad(self.cost, self.params)
        self.perm = np.arange(len(self.y_train))
        self.aug_rng = np.random.RandomState(100 + self.rank)

    def compile_iter_fns(self, sync_type='avg'):
        super(ResumableMLP, self).compile_iter_fns(sync_type)
        givens = {self.x: self.shared_x, self.y: self.shared_y}
        self.val_fn = theano.function([], [self.val_cost, self.val_error], givens=givens)

    def train_iter(self, i, recorder):
        s = (i * self.size + self.rank) * self.batch_size
        idx = self.perm[s:s + self.batch_size]
        noise = self.aug_rng.normal(0, 0.05, (self.batch_size, 64)).astype(np.float32)
        self.shared_x.set_value(self.X_train[idx] + noise)
        self.shared_y.set_value(self.y_train[idx])
        cost, err = self.train_fn()
        recorder.train_error(i, cost, err)

    def reset_iter(self, mode):
        if mode == 'train':
            np.random.seed(self.epoch)       # common_seed=self.epoch: the same on every rank
            self.perm = self.perm[np.random.permutation(len(self.perm))]

    def adjust_hyperp(self, epoch):
        if epoch + 1 == 2:
            self.shared_lr.set_value(np.float32(self.shared_lr.get_value() / 2))

