"""Every rank's timeline on rank 0's clock.

A timeline's stamps are ``time.perf_counter()``: CLOCK_MONOTONIC, which counts
from an arbitrary point of its kernel (its boot). The ranks of one machine
share it; ranks on other machines do not, and their lanes would stand hours
or days apart in the trace, and the job's exposed communication
(``timeline.job_exposed_comm``), which compares one rank's transfer end with
another's backward end, would be wrong by as much.

So before the events are gathered, each machine other than rank 0's
measures how its clock stands to rank 0's, in a few rounds of: rank 0 reads
its clock (t0) and broadcasts; every rank reads its own on receipt (t); the
readings are gathered and rank 0 reads its clock again (t1). At the moment
of ``t`` rank 0's clock was within [t0, t1], so ``(t0 + t1) / 2 - t`` is the
offset within ``(t1 - t0) / 2``; the round with the shortest ``t1 - t0`` is
kept. Ranks that share rank 0's kernel (the same ``boot_id``; emulated hosts
do) get exactly 0; the ranks of another machine all get the estimate of
that machine's lowest rank, so that they stay exactly aligned with each
other. Only collectives of the communicator are used (``bcast``,
``allgather``).
"""
import time

#: Rounds of the estimate (each a bcast and an allgather of a few bytes).
ROUNDS = 8
BOOT_ID = '/proc/sys/kernel/random/boot_id'


def kernel_id():
    """What identifies this machine's CLOCK_MONOTONIC: the kernel's boot id (the
    host name where /proc has none)."""
    try:
        with open(BOOT_ID) as f:
            return f.read().strip()
    except OSError:
        import socket
        return 'host ' + socket.gethostname()


def offsets_to_rank0(comm, rounds=ROUNDS, clock=None, kernel=None):
    """``(offset, error)`` in seconds for this rank: ``stamp + offset`` is a stamp of
    this rank's ``clock`` (default ``time.perf_counter``) on rank 0's. The offset
    is exactly 0.0 where this rank shares rank 0's ``kernel()`` (default
    :func:`kernel_id`), and every offset is within ``error`` of the truth: the
    bound of the job's alignment, the same on every rank (0.0 where every rank
    shares one kernel). Collective: every rank of ``comm`` calls it, with the same
    ``rounds``."""
    if comm.size == 1:
        return 0.0, 0.0
    clock = clock or time.perf_counter
    kernel = kernel or kernel_id
    ids = comm.allgather(kernel())
    if all(k == ids[0] for k in ids):
        return 0.0, 0.0
    best = None        # (t1 - t0, [offset of each rank]) on rank 0
    for _ in range(int(rounds)):
        t0 = clock() if comm.rank == 0 else None
        comm.bcast(t0, root=0, label='clock round')
        t = clock()
        stamps = comm.allgather(t, label='clock round')
        if comm.rank == 0:
            t1 = clock()
            if best is None or t1 - t0 < best[0]:
                mid = (t0 + t1) / 2.0
                best = (t1 - t0, [mid - s for s in stamps])
    rtt, per_rank = comm.bcast(best if comm.rank == 0 else None, root=0, label='clock offsets')
    # one offset per machine: its lowest rank's; rank 0's machine exactly 0
    first = {}
    for r, k in enumerate(ids):
        first.setdefault(k, r)
    mine = first[ids[comm.rank]]
    offset = 0.0 if ids[comm.rank] == ids[0] else per_rank[mine]
    return offset, rtt / 2.0
