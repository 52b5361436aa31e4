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


def choose_exchange_path(requested, device):
    """The exchange path for device buffers: ``'host-staged'`` or ``'nccl'``.

    ``auto`` takes NCCL where it can run, else host-staged MPI. Asking for
    NCCL where it cannot run is a DeviceError naming why.
    """
    if requested not in EXCHANGE_PATHS:
        raise DeviceError('unknown exchange path %r; choose from %s' % (requested, EXCHANGE_PATHS))
    if requested == 'host-staged':
        return requested
    why = nccl_unavailable(device)
    if why is None:
        return 'nccl'
    if requested == 'nccl':
        # every rank finds this the same way
        raise DeviceErrorOnRanks('exchange path nccl is not available on device %s: %s'
                                 % (device, why))
    return 'host-staged'


def nccl_unavailable(device):
    """Why NCCL cannot exchange this device's buffers (None when it can)."""
    if not device.startswith('cuda'):
        return 'NCCL needs a CUDA device'
    return ('the NCCL exchange of device buckets has not been built and tested on a GPU '
            'yet (docs/gpu.md)')


def install(trainer, exchange_path='auto'):
    """Swap ``trainer``'s params, gradient, exchanger and rule for device ones."""
    from ..engine import device
    from ..device_params import DeviceParamSet, DeviceGradients
    from ..exchange.staged import HostStagedExchanger
    from ..update.device import DeviceOptimizer
    from ..update.policy import decay_vector
    cfg, layout = trainer.cfg, trainer.layout
    if cfg.sync_type != 'kn':
        raise DeviceError('device %s trains with sync_type=kn only (got %s; avg and cdd '
                          'update on the host)' % (device(), cfg.sync_type))
    path = choose_exchange_path(exchange_path, device())
    params = DeviceParamSet(trainer.params)
    grads = DeviceGradients(layout)
    exchanger = HostStagedExchanger(trainer.comm, trainer.buckets, trainer.n_exch)
    scale = np.ones(layout.total, np.float32)
    scale[trainer.n_exch:] = trainer.exchanger.local_scale
    opt = DeviceOptimizer(params.flat_var, cfg.momentum, cfg.momentum_form, cfg.nesterov,
                          decay_vector(layout, params.tags, cfg.weight_decay), scale)
    trainer.params, trainer.grads, trainer.exchanger = params, grads.flat, exchanger
    trainer.device_grads = grads
    trainer.rule = DeviceKnRule(exchanger, opt, params)
    trainer.exchange_path = '%s on %s' % (exchanger.path if path == 'host-staged' else path,
                                          device())
    return trainer
