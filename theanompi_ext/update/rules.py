"""Synchronisation rules: the update of the new kn-sum rule and of Theano-MPI's avg and cdd.

Every rule receives the worker's gradient of the loss normalised by kn
(that is how the backward pass computes it) and updates the flat parameter
vector in place, identically on every rank for exchanged parameters.

Rules only update. The gradient exchange of ``kn`` (``exchanges_gradient``)
is started and finished by the step (:mod:`theanompi_ext.step.run`) before
:meth:`update` is called. ``avg`` and ``cdd`` exchange no gradient: what they
sum across ranks (the parameters, the momenta) is part of their update, as in
Theano-MPI, so they hold the communicator for it.
"""
import numpy as np

from .momentum import Optimizer
from .policy import decay_vector, scale_local_tail

SYNC_TYPES = ('kn', 'avg', 'cdd')


class KnRule(object):
    """Goyal et al.: one momentum-SGD step on the kn-sum of the gradients.

    ``update`` takes the summed gradient; its local tail (``n_exch`` on,
    BN gamma/beta not exchanged) is first rescaled by ``local_scale`` (k)
    into the worker's own n-mean (:func:`~theanompi_ext.update.policy.scale_local_tail`).
    """
    sync_type = 'kn'
    exchanges_gradient = True

    def __init__(self, optimizer, n_exch, local_scale):
        self.optimizer = optimizer
        self.n_exch, self.local_scale = int(n_exch), np.float32(local_scale)

    def state(self):
        """Momentum and last rate (for checkpoints)."""
        return self.optimizer.state()

    def load_state(self, state):
        """Restore :meth:`state`."""
        self.optimizer.load_state(state)

    def update(self, values, grads, lr):
        """One momentum-SGD step of ``values`` from the summed ``grads`` at rate ``lr``."""
        scale_local_tail(grads, self.n_exch, self.local_scale)
        self.optimizer.step(values, grads, lr)


class DeviceKnRule(KnRule):
    """The kn rule with the compiled device update
    (:class:`~theanompi_ext.update.device.DeviceOptimizer`, which applies
    the local-tail scale itself: :func:`~theanompi_ext.update.policy.local_scale_vector`)."""

    def __init__(self, optimizer, params):
        KnRule.__init__(self, optimizer, 0, 1)
        self.params = params

    def update(self, values, grads, lr):
        """``values`` (the host mirror) is not read: the update runs on the device."""
        self.optimizer.step(grads, lr)
        self.params.after_update()


class AvgRule(object):
    """Theano-MPI ``avg``: local momentum-SGD step on the n-mean gradient,
    then every exchanged parameter is replaced by its mean over ranks."""
    sync_type = 'avg'
    exchanges_gradient = False

    def __init__(self, comm, n_exch, optimizer, workers):
        self.comm, self.n_exch, self.optimizer = comm, n_exch, optimizer
        self.k = workers

    state = KnRule.state
    load_state = KnRule.load_state

    def update(self, values, grads, lr):
        """Local step on the n-mean gradient, then the exchanged parameters averaged."""
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
    exchanges_gradient = False

    def __init__(self, comm, n_exch, size, momentum, decay, lr_mult, workers):
        self.comm, self.n_exch, self.k = comm, n_exch, workers
        self.mu = np.float32(momentum)
        self.decay = decay
        self.lr_mult = lr_mult
        self.u = np.zeros(size, np.float32)
        self._sum = np.zeros(n_exch, np.float32)

    def update(self, values, grads, lr):
        """Local momentum over n, the momenta summed across ranks, the step."""
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


def make_rule(sync_type, comm, layout, n_exch, tags, opts, local_scale):
    """Build the host rule for ``sync_type`` over a flat layout.

    ``n_exch``: the exchanged entries (the prefix of the layout);
    ``local_scale``: what the kn rule multiplies the local tail by (k, or
    k x groups for a single-process reference). ``opts`` is a
    :class:`~theanompi_ext.train.config.TrainConfig` (or the contract
    settings of :func:`theanompi_ext.theanompi_compat.stepper.contract_settings`).
    """
    if sync_type not in SYNC_TYPES:
        raise ValueError('unknown sync_type %r; choose from %s' % (sync_type, SYNC_TYPES))
    decay = decay_vector(layout, tags, opts.weight_decay)
    k = comm.size
    if sync_type == 'kn':
        return KnRule(Optimizer(layout.total, opts.momentum, opts.momentum_form,
                                opts.nesterov, decay), n_exch, local_scale)
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
