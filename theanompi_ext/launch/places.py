"""Where each rank of a job runs: host, local rank, device; gathered once and
said by rank 0 in the first lines of a run (``train`` and the Theano-MPI
session's worker)."""
import socket

from ..collective.world import local_rank


def placement_line(rank, size, host, local, dev):
    """``rank 2 of 4: host tmxh1, local rank 0, device cpu``."""
    return 'rank %d of %d: host %s, local rank %s, device %s' % (
        rank, size, host, '?' if local is None else local, dev)


def gather_places(comm, dev, extra=None):
    """``[(host, local rank, device, extra)]`` of every rank, in rank order (an
    allgather: every rank of ``comm`` calls it; the local rank is MPI's answer when
    ``comm`` holds an mpi4py communicator, ``comm.comm``)."""
    mine = (socket.gethostname(), local_rank(getattr(comm, 'comm', None)), dev, extra)
    return comm.allgather(mine) if comm.size > 1 else [mine]


def placement_text(places):
    """The lines of :func:`placement_line` for ``places`` (from :func:`gather_places`)."""
    return '\n'.join(placement_line(r, len(places), h, l, d)
                     for r, (h, l, d, _) in enumerate(places))
