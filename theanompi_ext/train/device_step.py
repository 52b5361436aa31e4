"""What the trainer swaps in when Theano computes on a device.

:func:`install` replaces the trainer's host pieces by device ones with the
same interfaces, so :meth:`Trainer.step <theanompi_ext.train.trainer.Trainer.step>`
runs unchanged: parameters as views of a flat device vector
(:class:`~theanompi_ext.device_params.DeviceParamSet`), the gradient as a
flat device vector the backward fills, an exchanger for device buckets
(:data:`EXCHANGE_PATHS`), and the kn rule with the compiled device update
(:class:`~theanompi_ext.update.device.DeviceOptimizer`).
"""
import numpy as np

from ..errors import DeviceError, DeviceErrorOnRanks
from ..exchange.rules import KnRule

# 'auto' picks the first that works on this device.
EXCHANGE_PATHS = ('auto', 'host-staged', 'nccl')


class DeviceKnRule(KnRule):
    """The kn-sum rule over device buffers: exchange (unless the overlapped
    backward already started it), then the compiled update."""

    def __init__(self, exchanger, optimizer, params):
        super(DeviceKnRule, self).__init__(exchanger, optimizer)
        self.params = params

    def step(self, values, grads, lr, reduced=False):
        """``values`` (the host mirror) is not read: the update runs on the device."""
        if not reduced:
            self.exchanger.reduce(grads)
        self.optimizer.step(grads, lr)
        self.params.after_update()


def choose_exchange_path(requested, device, comm=None, probe=None):
    """The exchange path for device buffers: ``'host-staged'`` or ``'nccl'``
    (:func:`exchange_choice` without the reason)."""
    return exchange_choice(requested, device, comm, probe)[0]


def exchange_choice(requested, device, comm=None, probe=None):
    """``(path, reason)``: the exchange path for device buffers and why.

    ``auto`` takes NCCL where it can run on every rank, else host-staged
    MPI; ``host-staged`` is always possible. Asking for NCCL where it cannot
    run is a :class:`DeviceErrorOnRanks` naming why, on every rank. With
    ``comm`` (the host communicator) the ranks agree: NCCL is taken only
    where every rank can run it (else ranks would wait on different
    collectives). ``probe``: :func:`theanompi_ext.collective.nccl.probe`
    (tests inject one).
    """
    if requested not in EXCHANGE_PATHS:
        raise DeviceError('unknown exchange path %r; choose from %s' % (requested, EXCHANGE_PATHS))
    if requested == 'host-staged':
        return requested, 'requested'
    why = nccl_unavailable(device, probe)
    if comm is not None and comm.size > 1:
        whys = comm.allgather(why)
        bad = ['rank %d: %s' % (r, w) for r, w in enumerate(whys) if w is not None]
        why = None if not bad else (why if len(set(whys)) == 1 else '; '.join(bad))
    if why is None:
        return 'nccl', 'requested' if requested == 'nccl' else 'auto: NCCL can run on %s' % device
    if requested == 'nccl':
        raise DeviceErrorOnRanks('exchange path nccl is not available on device %s: %s'
                                 % (device, why))
    return 'host-staged', 'auto: %s' % why


def nccl_unavailable(device, probe=None):
    """Why NCCL cannot exchange this device's buffers (None when it can)."""
    if not device.startswith('cuda'):
        return 'NCCL needs a CUDA device'
    if probe is None:
        from ..collective.nccl import probe
    ok, why = probe()
    return None if ok else why


def install(trainer, exchange_path='auto'):
    """Swap ``trainer``'s params, gradient, exchanger and rule for device ones."""
    from ..engine.core import device, device_context
    from ..exchange.nccl_device import nccl_exchanger
    from ..params.device import DeviceParamSet, DeviceGradients
    from ..exchange.staged import HostStagedExchanger
    from ..update.device import DeviceOptimizer
    from ..update.policy import decay_vector
    cfg, layout = trainer.cfg, trainer.layout
    if cfg.sync_type != 'kn':
        raise DeviceError('device %s trains with sync_type=kn only (got %s; avg and cdd '
                          'update on the host)' % (device(), cfg.sync_type))
    path, why = exchange_choice(exchange_path, device(), trainer.comm)
    params = DeviceParamSet(trainer.params)
    grads = DeviceGradients(layout)
    if path == 'nccl':
        # Buckets over NCCL; trainer.comm (host) keeps the loss statistics and checks.
        exchanger = nccl_exchanger(trainer.comm, device(), device_context(), trainer.buckets,
                                   trainer.n_exch)
    else:
        exchanger = HostStagedExchanger(trainer.comm, trainer.buckets, trainer.n_exch)
    scale = np.ones(layout.total, np.float32)
    scale[trainer.n_exch:] = trainer.exchanger.local_scale
    opt = DeviceOptimizer(params.flat_var, cfg.momentum, cfg.momentum_form, cfg.nesterov,
                          decay_vector(layout, params.tags, cfg.weight_decay), scale)
    trainer.params, trainer.grads, trainer.exchanger = params, grads.flat, exchanger
    trainer.device_grads = grads
    trainer.rule = DeviceKnRule(exchanger, opt, params)
    trainer.exchange_path = '%s on %s (%s)' % (exchanger.path, device(), why)
    return trainer
