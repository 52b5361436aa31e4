"""Where each rank runs, said at the start of a run, and whether every host sees
the output folder.

One allgather at start-up: each rank's host, local rank (its index among the
ranks of its host, which picks its entry of a device list), device, and
whether its host sees the launcher's ``--out`` (``outdir.unseen_by_this_host``).
Rank 0 prints one line per rank; a host that does not see ``--out`` ends
every rank with :class:`OutputFolderUnseen` (exit status 2) naming the
ranks, their hosts and the folder, before anything is trained.
"""
from ..errors import AllRanks, OutputFolderError
from ..launch.places import gather_places, placement_text
from . import outdir


class OutputFolderUnseen(AllRanks, OutputFolderError):
    """Some host does not see ``--out`` (raised on every rank; exit status 2)."""


def announce_placement(cfg, comm, dev, log=print):
    """Gather every rank's place; rank 0 logs them (unless ``cfg.quiet``, or one
    rank); raise :class:`OutputFolderUnseen` on every rank when a host does not see
    ``cfg.out``. Collective: every rank of ``comm`` calls it. Returns the places,
    ``[(host, local rank, device)]`` in rank order."""
    every = gather_places(comm, dev, outdir.unseen_by_this_host(cfg.out))
    if comm.rank == 0 and comm.size > 1 and not cfg.quiet:
        log(placement_text(every))
    unseen = [(r, h, why) for r, (h, _, _, why) in enumerate(every) if why]
    if unseen:
        raise OutputFolderUnseen(
            '--out %s is not seen by %s: rank 0 writes the outputs and checkpoints there and '
            'every rank reads the checkpoint on --resume, so it must be one folder that every '
            'host sees (a shared filesystem, docs/multinode.md)' % (
                cfg.out, '; '.join('rank %d on host %s (%s)' % u for u in unseen)))
    return [(h, l, d) for h, l, d, _ in every]
