"""Open this rank's device and load the engine on it, agreeing with every rank.

Above both :mod:`.devices` (which must not import the engine:
the device is chosen before Theano loads) and :mod:`.core`.
"""
from ..collective.world import local_rank
from ..errors import DeviceError, DeviceErrorOnRanks
from .devices import configure, device_for_rank


def open_on_every_rank(spec, comm):
    """Configure this rank's device from ``spec``, load the engine, and agree.

    Every rank learns every rank's failure (an allgather), so a device that
    cannot be opened on one rank ends every rank with the same
    :class:`DeviceErrorOnRanks` naming the device(s), instead of leaving the
    others waiting. Returns this rank's device. Collective: every rank of
    ``comm`` calls it (its local rank is MPI's, when ``comm`` holds an MPI
    communicator).
    """
    err, dev = None, None
    try:
        # A backend's mpi4py communicator (``comm.comm``) says which ranks share a host.
        dev = configure(device_for_rank(spec, comm.rank, local_rank(getattr(comm, 'comm', None))))
        from . import core  # noqa: F401  (imports Theano on that device)
    except DeviceError as exc:
        err = str(exc)
    errors = comm.allgather(err) if comm.size > 1 else [err]
    failed = [(r, e) for r, e in enumerate(errors) if e]
    if failed:
        raise DeviceErrorOnRanks('; '.join(('rank %d: %s' % (r, e)) if comm.size > 1 else e
                                           for r, e in failed))
    return dev
