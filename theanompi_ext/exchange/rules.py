"""Synchronisation rules: the new kn-sum rule and Theano-MPI's avg and cdd.

Every rule receives the worker's gradient of the loss normalised by kn
(that is how the backward pass computes it) and updates the flat parameter
vector in place, identically on every rank for exchanged parameters.
"""
import numpy as np

from ..update.momentum import Optimizer
from ..buckets.plan import exchanged_entries
from .modes import check_choice


class KnRule(object):
    """Goyal et al.: sum kn-normalised gradients, one momentum-SGD step."""
    sync_type = 'kn'

    def __init__(self, exchanger, optimizer):
        self.exchanger, self.optimizer = exchanger, optimizer

    def state(self):
        """Momentum and last rate (for checkpoints)."""
        return self.optimizer.state()

    def load_state(self, state):
        """Restore :meth:`state`."""
        self.optimizer.load_state(state)

    def step(self, values, grads, lr, reduced=False):
        """Exchange (unless the overlapped path already did) and update."""
        if not reduced:
            self.exchanger.reduce(grads)
        self.optimizer.step(values, grads, lr)


class AvgRule(object):
    """Theano-MPI ``avg``: local momentum-SGD step on the n-mean gradient,
    then every exchanged parameter is replaced by its mean over ranks."""
    sync_type = 'avg'

    def __init__(self, comm, n_exch, optimizer, workers):
        self.comm, self.n_exch, self.optimizer = comm, n_exch, optimizer
        self.k = workers

    state = KnRule.state
    load_state = KnRule.load_state

    def step(self, values, grads, lr, reduced=False):
        grads *= np.float32(self.k)          # loss over n, not kn
        self.optimizer.step(values, grads, lr)
        if self.n_exch:
            part = values[:self.n_exch]
            part *= np.float32(1.0 / self.k)
            self.comm.allreduce(part)


class CddRule(object):
    """Theano-MPI ``cdd``: ``u = mu*u + g_n (+ eta*w on weights)`` locally,
    the ranks sum ``u``, and ``w -= lr * lr_mult * sum(u)/k`` (biases 2x lr).
    Parameters not exchanged (BN) step with their local ``u``.
    """
    sync_type = 'cdd'

    def __init__(self, comm, n_exch, size, momentum, decay, lr_mult, workers):
        self.comm, self.n_exch, self.k = comm, n_exch, workers
        self.mu = np.float32(momentum)
        self.decay = decay
        self.lr_mult = lr_mult
        self.u = np.zeros(size, np.float32)
        self._sum = np.zeros(n_exch, np.float32)

    def step(self, values, grads, lr, reduced=False):
        grads *= np.float32(self.k)          # loss over n
        self.u *= self.mu
        self.u += grads
        self.u += self.decay * values
        self._sum[...] = self.u[:self.n_exch]
        self.comm.allreduce(self._sum)
        step = np.empty_like(values)
        step[:self.n_exch] = self._sum / np.float32(self.k)
        step[self.n_exch:] = self.u[self.n_exch:]
        values -= np.float32(lr) * self.lr_mult * step

    def state(self):
        """Local momentum (for checkpoints); cdd keeps no previous rate."""
        return {'velocity': self.u.copy(), 'lr_prev': np.float64(0)}

    def load_state(self, state):
        """Restore :meth:`state`."""
        self.u[...] = state['velocity']


def make_rule(sync_type, comm, layout, n_exch_params, tags, exchanger, opts):
    """Build the rule for ``sync_type`` over a flat layout.

    ``opts`` is a :class:`~theanompi_ext.train.config.TrainConfig` (or the contract
    settings of :func:`theanompi_ext.theanompi_compat.stepper.contract_settings`).
    """
    from ..update.policy import decay_vector
    check_choice('sync_type', sync_type)        # kn, avg or cdd (exchange/modes.py)
    n_exch = exchanged_entries(layout.sizes, n_exch_params)
    decay = decay_vector(layout, tags, opts.weight_decay)
    k = comm.size
    if sync_type == 'kn':
        return KnRule(exchanger, Optimizer(layout.total, opts.momentum, opts.momentum_form,
                                           opts.nesterov, decay))
    if sync_type == 'avg':
        return AvgRule(comm, n_exch, Optimizer(layout.total, opts.momentum, 'eq9',
                                               opts.nesterov, decay), k)
    # cdd
    lr_mult = np.ones(layout.total, np.float32)
    lr_mult[layout.mask([i for i, t in enumerate(tags) if 'bias' in t]) > 0] = 2.0
    # Theano-MPI decays only 'W'-type params (not biases, not BN).
    wmask = layout.mask([i for i, t in enumerate(tags)
                         if 'bias' not in t and 'bn_affine' not in t])
    return CddRule(comm, n_exch, layout.total, opts.momentum,
                   wmask * np.float32(opts.weight_decay), lr_mult, k)
