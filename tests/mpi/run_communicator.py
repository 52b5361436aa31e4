"""The Communicator interface on the MPI backend, plain and watched, at any world size.

usage: run_communicator.py   (any number of ranks; alone, k = 1, without mpiexec too)

Rank r holds ``data(r)``; the expected sum, max and min over ranks are
computed here with numpy from every rank's ``data``. Every collective is
called with a ``label``; the bounded allgather returns every rank's value as
JSON carries it. Then the bounded barrier: the last rank arrives
late, the others must time out (CollectiveTimeout naming the label) within
the limit plus a margin; the late rank then finds the others' barrier and
passes. Then handle waits with a timeout while the other ranks start late,
in both progress modes: the timeout is honoured, a later wait gets the sum.
Alone (k = 1) no rank is late: the barrier passes and the wait returns at once.
Rank 0 prints one JSON line; any failed check raises (the rank exits != 0).
"""
import json
import sys
import time

import numpy as np

from theanompi_ext.collective import CollectiveTimeout
from theanompi_ext.collective.mpi import MPICommunicator
from theanompi_ext.collective.watchdog import watch

BARRIER_S = 0.5       # the bounded barrier's limit
LATE_S = 1.5          # how late the last rank arrives (> BARRIER_S)
MARGIN_S = 1.0        # a timeout must be raised within limit + this


def data(r, n=1001):
    """Rank r's buffer: values that differ by rank and position, some negative."""
    i = np.arange(n)
    return (((r + 1) * (i % 13)) - 3.0 * r + np.where(i % 2, -0.5, 0.25) * r).astype(np.float32)


def check_reduces(comm, k):
    everyone = np.stack([data(r) for r in range(k)])
    want = {'sum': everyone.sum(axis=0), 'max': everyone.max(axis=0),
            'min': everyone.min(axis=0)}
    for op in ('sum', 'max', 'min'):
        buf = data(comm.rank)
        assert comm.allreduce(buf, op=op, label='test %s' % op) is buf
        np.testing.assert_array_equal(buf, want[op].astype(np.float32))
    try:
        comm.allreduce(data(comm.rank), op='prod')
    except ValueError as exc:
        assert "unknown reduce op 'prod'" in str(exc), exc
    else:
        raise AssertionError('op=prod was accepted')


def check_labels(comm, k):
    assert comm.allgather(comm.rank, label='test allgather') == list(range(k))
    assert comm.bcast('from %d' % comm.rank, root=k - 1, label='test bcast') == 'from %d' % (k - 1)
    comm.barrier(label='test barrier')
    comm.barrier(timeout_s=30, label='test bounded barrier')    # every rank arrives
    h = comm.start_allreduce(np.ones(10, np.float32), name='test started')
    np.testing.assert_array_equal(h.wait(), np.full(10, k, np.float32))
    # the bounded allgather: values of different lengths, as JSON carries them
    mine = {'rank': comm.rank, 'pad': 'x' * (7 * comm.rank), 'pair': (comm.rank, None)}
    got = comm.allgather_bounded(mine, 30, label='test bounded allgather')
    assert got == [{'rank': r, 'pad': 'x' * (7 * r), 'pair': [r, None]} for r in range(k)], got
    for bad in (0, -1.0, 'soon', None):
        try:
            comm.allgather_bounded(1, bad)
        except ValueError as exc:
            assert 'timeout_s must be' in str(exc) and repr(bad) in str(exc), exc
        else:
            raise AssertionError('allgather_bounded(timeout_s=%r) was accepted' % (bad,))
        if bad is None:
            continue            # the barrier's: wait for ever
        try:
            comm.barrier(timeout_s=bad)
        except ValueError as exc:
            assert 'timeout_s must be None' in str(exc), exc
        else:
            raise AssertionError('barrier(timeout_s=%r) was accepted' % (bad,))


def check_bounded_barrier(comm, k):
    """Returns the time the early ranks waited before CollectiveTimeout."""
    comm.barrier()
    if comm.rank == k - 1:
        time.sleep(LATE_S)
        t0 = time.monotonic()
        comm.barrier(timeout_s=30, label='late arrival')     # the others' barrier is posted
        return time.monotonic() - t0
    t0 = time.monotonic()
    try:
        comm.barrier(timeout_s=BARRIER_S, label='agreement under test')
    except CollectiveTimeout as exc:
        waited = time.monotonic() - t0
        msg = str(exc)
        assert "barrier 'agreement under test'" in msg and 'within 0.5 s' in msg, msg
        assert 'rank %d of %d' % (comm.rank, k) in msg, msg
        assert BARRIER_S <= waited < BARRIER_S + MARGIN_S, waited
        return waited
    raise AssertionError('rank %d passed a barrier rank %d had not reached'
                         % (comm.rank, k - 1))


def check_wait_timeout(comm, k):
    """Rank 0 waits with a timeout while the others start late; returns its wait."""
    comm.barrier()
    buf = np.full(1000, comm.rank + 1.0, np.float32)
    waited = None
    if k == 1:                   # no others: the sum is there at once
        h = comm.start_allreduce(buf, name='late partners')
        t0 = time.monotonic()
        h.wait(timeout=0.3)
        waited = time.monotonic() - t0
        assert waited < 0.3, waited
    elif comm.rank == 0:
        h = comm.start_allreduce(buf, name='late partners')
        t0 = time.monotonic()
        try:
            h.wait(timeout=0.3)
        except CollectiveTimeout as exc:
            waited = time.monotonic() - t0
            assert "'late partners' did not finish within 0.3 s" in str(exc), exc
            assert 0.3 <= waited < 0.3 + MARGIN_S, waited
        else:
            raise AssertionError('wait(timeout=0.3) returned before the others started')
        try:
            h.wait(timeout=-1)
        except ValueError as exc:
            assert 'timeout must be None' in str(exc), exc
        else:
            raise AssertionError('wait(timeout=-1) was accepted')
    else:
        time.sleep(1.0)
        h = comm.start_allreduce(buf, name='late partners')
    h.wait()
    np.testing.assert_array_equal(buf, np.full(1000, k * (k + 1) / 2.0, np.float32))
    return waited


def main():
    out = {}
    for progress in ('thread', 'request'):
        plain = MPICommunicator(progress=progress)
        watched = watch(plain, 30.0, 10.0)
        k = plain.size
        for comm in (plain, watched):
            check_reduces(comm, k)
            check_labels(comm, k)
        out[progress] = {'barrier_s': check_bounded_barrier(plain, k),
                         'wait_s': check_wait_timeout(plain, k)}
        plain.barrier()
        watched.close()          # the watchdog, then the backend
    if plain.rank == 0:
        print(json.dumps(dict(out, size=k)))
    return 0


if __name__ == '__main__':
    sys.exit(main())
