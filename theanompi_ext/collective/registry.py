"""Backend registry: name -> constructor, what each sums, and what is available here."""
from ..errors import BackendRefused
from .world import launcher_rank_size, world_comm


def _local(**kw):
    # A world of one inside a job of several ranks would train as many
    # separate models (collective/world.py): refuse it by name.
    rank, size = launcher_rank_size()
    if size is not None and size > 1:
        raise BackendRefused("the 'local' backend is a world of one rank, but this process is "
                         "rank %d of an MPI job of %d: choose 'mpi' or 'auto'" % (rank, size))
    from .local import LocalCommunicator
    return LocalCommunicator(**kw)


def _mpi(**kw):
    from .mpi import MPICommunicator
    return MPICommunicator(**kw)


def _nccl(**kw):
    from .nccl import NCCLCommunicator
    return NCCLCommunicator(**kw)


def _pygpu_nccl(gpucomm=None, context=None, comm=None, **kw):
    from .pygpu_nccl import PygpuNCCLCommunicator, make_gpucomm
    if gpucomm is None:
        if context is None:
            raise ValueError("the 'pygpu-nccl' backend needs gpucomm= (a "
                             "pygpu.collectives.GpuComm) or context= (the pygpu GpuContext "
                             "to build one on)")
        gpucomm = make_gpucomm(context, comm)
    return PygpuNCCLCommunicator(gpucomm, comm, **kw)


#: name -> (constructor, the memory its allreduce sums: 'host' numpy arrays or
#: 'device' GPU arrays).
BACKENDS = {'local': (_local, 'host'), 'mpi': (_mpi, 'host'), 'nccl': (_nccl, 'device'),
            'pygpu-nccl': (_pygpu_nccl, 'device')}


def backend_names():
    """Every registered backend name and ``'auto'``."""
    return tuple(sorted(BACKENDS)) + ('auto',)


def host_backends():
    """``'auto'`` and the backends that sum host (numpy) buffers: those the
    trainer can use, whose gradients are host arrays or staged through host
    memory (``step/device.py``)."""
    return ('auto',) + tuple(sorted(n for n, (_, mem) in BACKENDS.items() if mem == 'host'))


def create_communicator(name='auto', topology=None, **options):
    """Return a communicator for backend ``name`` (see package docstring).

    ``topology`` (collective/two_level.py): the mpi backend's ``flat``,
    ``two-level`` or ``auto``; ``local`` (one rank: nothing spans hosts) takes
    any, the device backends all but ``two-level``.
    """
    if name == 'auto':
        name = 'mpi' if _mpi_world_size() > 1 else 'local'
    if topology is not None:
        from .two_level import check_topology
        check_topology(topology)
        if name == 'mpi':
            options['topology'] = topology
        elif topology == 'two-level' and name != 'local':
            raise BackendRefused("topology 'two-level' needs the mpi backend, not %r" % name)
    try:
        factory, _ = BACKENDS[name]
    except KeyError:
        raise BackendRefused('unknown collective backend %r; choose from %s'
                             % (name, ', '.join(backend_names())))
    return factory(**options)


def _mpi_world_size():
    # world_comm: one rank when MPI cannot load outside a launcher; an
    # error naming mpi4py's problem inside one (ranks must not go solo).
    return world_comm().Get_size()


def available_backends():
    """[(name, available, reason)] for every backend: what loads in this process
    (MPI starts here; no device is opened, so ``pygpu-nccl`` is available where
    its module imports). ``theanompi-ext info`` tries each backend instead, in
    child processes (``cli/checks.py``)."""
    out = [('local', True, 'always')]
    try:
        from .mpi import library_version
        out.append(('mpi', True, library_version()))
    except Exception as exc:
        out.append(('mpi', False, 'mpi4py unusable: %s' % exc))
    try:
        from .nccl_probe import probe
        ok, why = probe()
    except Exception as exc:
        ok, why = False, str(exc)
    out.append(('nccl', ok, why))
    out.append(('pygpu-nccl',) + _pygpu_collectives())
    return out


def _pygpu_collectives():
    """(available, reason) of pygpu's NCCL collectives, without opening a device."""
    try:
        from pygpu import collectives  # noqa: F401
    except Exception as exc:
        return False, 'pygpu.collectives unusable: %s: %s' % (type(exc).__name__, exc)
    return True, 'pygpu.collectives (needs a CUDA context and a pygpu built with NCCL)'
