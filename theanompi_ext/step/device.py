"""The device parts of a step, chosen when the step is assembled on a device.

When Theano computes on a device, :func:`device_parts` builds, instead of
the host ones and with the same interfaces (so :mod:`.run` runs one step
for both): parameters as views of a flat device vector
(:class:`~theanompi_ext.params.device.DeviceParamSet`), the gradient as a
flat device vector the backward fills, an exchanger for device buckets
(:data:`EXCHANGE_PATHS`), and the kn rule with the compiled device update
(:class:`~theanompi_ext.update.device.DeviceOptimizer`).
"""
from ..errors import DeviceError, DeviceErrorOnRanks

# 'auto' picks the first that works on this device.
EXCHANGE_PATHS = ('auto', 'host-staged', 'nccl')


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
    collectives). ``probe``: :func:`theanompi_ext.collective.nccl_probe.probe`
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
        from ..collective.nccl_probe import probe
    ok, why = probe()
    return None if ok else why


def device_parts(comm, host_params, buckets, n_exch, settings, local_scale,
                 exchange_path='auto'):
    """``(params, device_grads, exchanger, rule, exchange_path description)`` on
    the engine's device, for the host :class:`~theanompi_ext.params.ParamSet`
    ``host_params`` (whose ``tags`` are in flat order) and the checked plan.

    Only ``sync_type=kn`` trains on a device (avg and cdd update on the host).
    """
    from ..engine.core import device, device_context
    from ..exchange.nccl_device import nccl_exchanger
    from ..params.device import DeviceParamSet, DeviceGradients
    from ..exchange.staged import HostStagedExchanger
    from ..update.device import DeviceOptimizer
    from ..update.policy import decay_vector, local_scale_vector
    from ..update.rules import DeviceKnRule
    if settings.sync_type != 'kn':
        raise DeviceError('device %s trains with sync_type=kn only (got %s; avg and cdd '
                          'update on the host)' % (device(), settings.sync_type))
    layout = host_params.layout
    path, why = exchange_choice(exchange_path, device(), comm)
    params = DeviceParamSet(host_params)
    grads = DeviceGradients(layout)
    wire = settings.wire_dtype      # checked and agreed across ranks by assemble_step
    if path == 'nccl':
        # Buckets over NCCL; comm (host) keeps the loss statistics and checks.
        exchanger = nccl_exchanger(comm, device(), device_context(), buckets, n_exch,
                                   wire=wire)
    else:
        exchanger = HostStagedExchanger(comm, buckets, n_exch, wire)
    opt = DeviceOptimizer(params.flat_var, settings.momentum, settings.momentum_form,
                          settings.nesterov, decay_vector(layout, params.tags,
                                                         settings.weight_decay),
                          local_scale_vector(layout.total, n_exch, local_scale))
    rule = DeviceKnRule(opt, params)
    on_wire = '' if wire == 'float32' else ', %s wire' % wire
    return params, grads, exchanger, rule, '%s on %s (%s)%s' % (exchanger.path, device(), why,
                                                                on_wire)
