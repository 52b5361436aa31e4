"""Backend registry: name -> constructor, and what is available here."""
from .world import world_comm


def _local(**kw):
    from .local import LocalCommunicator
    return LocalCommunicator()


def _mpi(**kw):
    from .mpi import MPICommunicator
    return MPICommunicator(**kw)


def _nccl(**kw):
    from .nccl import NCCLCommunicator
    return NCCLCommunicator(**kw)


BACKENDS = {'local': _local, 'mpi': _mpi, 'nccl': _nccl}


def create_communicator(name='auto', **options):
    """Return a communicator for backend ``name`` (see package docstring)."""
    if name == 'auto':
        name = 'mpi' if _mpi_world_size() > 1 else 'local'
    try:
        factory = BACKENDS[name]
    except KeyError:
        raise ValueError('unknown collective backend %r; choose from %s'
                         % (name, sorted(BACKENDS) + ['auto']))
    return factory(**options)


def _mpi_world_size():
    # world_comm: one rank when MPI cannot load outside a launcher; an
    # error naming mpi4py's problem inside one (ranks must not go solo).
    return world_comm().Get_size()


def available_backends():
    """[(name, available, reason)] for every backend, for ``theanompi-ext info``."""
    out = [('local', True, 'always')]
    try:
        from mpi4py import MPI
        out.append(('mpi', True, MPI.Get_library_version().splitlines()[0].strip()))
    except Exception as exc:
        out.append(('mpi', False, 'mpi4py unusable: %s' % exc))
    try:
        from .nccl import probe
        ok, why = probe()
    except Exception as exc:
        ok, why = False, str(exc)
    out.append(('nccl', ok, why))
    return out
