"""Started allreduces of several sizes through MPICommunicator, both thread waits.

usage: run_started.py   (any number of ranks; alone, k = 1, without mpiexec too)

Rank r fills bucket i with ``(r + 1) * (i + 1) + arange(size) % 7``; the
sum over ranks is computed here independently with numpy. Both ways the
communication thread waits are checked (blocking Allreduce, and Iallreduce
tested with sleeps), plus CPU seconds the thread-side wait costs while the
main thread sleeps. A wait on a handle the thread has not taken must run
the transfer on the waiting thread (forced here by holding the
communicator's condition so the thread cannot take it), and mixed timing
(rank 0 waits at once and runs transfers itself, the others let the thread
run them) must still sum correctly: every rank issues them in start order.
Starting a bucket while the thread is idle hands it the GIL (the default):
the transfer must have started before the caller goes on into code that
holds the GIL (a long builtin ``sum``, as a compiled Theano chunk does);
without the hand-off it starts only as that code returns.
Alone (k = 1) nothing travels: every handle is complete when started, so there
is no communication thread and nothing runs inline (``n_inline`` is null).
Rank 0 prints one JSON line.
"""
import json
import time

import numpy as np

from theanompi_ext.collective.mpi import MPICommunicator

SIZES = [1, 1000, 2 ** 18, 2 ** 21 + 3]       # up to 8 MB of float32


def check(comm, k):
    bufs = [((comm.rank + 1) * (i + 1) + np.arange(n) % 7).astype(np.float32)
            for i, n in enumerate(SIZES)]
    handles = [comm.start_allreduce(b, name='b%d' % i) for i, b in enumerate(bufs)]
    for i, (h, b) in enumerate(zip(handles, bufs)):
        h.wait()
        want = (k * (k + 1) / 2.0) * (i + 1) + k * (np.arange(SIZES[i]) % 7)
        np.testing.assert_array_equal(b, want.astype(np.float32))
        assert h.t_queued <= h.t_start <= h.t_end
    return True


def check_inline(comm, k):
    """The waiting thread runs a transfer the communication thread has not taken."""
    b = np.full(3000, comm.rank + 1.0, np.float32)
    handoff, comm.thread_handoff = comm.thread_handoff, False   # it would wait for the
    # thread that holding the condition keeps back
    with comm._cond:            # the thread cannot take work meanwhile
        h = comm.start_allreduce(b)
        h.wait()
    np.testing.assert_array_equal(b, np.full(3000, k * (k + 1) / 2.0, np.float32))
    assert h.ran_inline
    # Not next in line: the first must go first (thread or waiter), never the second.
    bufs = [np.full(100 + i, comm.rank + 1.0 + i, np.float32) for i in range(2)]
    with comm._cond:
        hs = [comm.start_allreduce(x) for x in bufs]
        assert not comm._run_inline(hs[1])
    hs[1].wait()
    hs[0].wait()
    for i, x in enumerate(bufs):
        np.testing.assert_array_equal(x, np.full(x.size, k * (k + 1) / 2.0 + k * i, np.float32))
    # Mixed timing: rank 0 waits at once (mostly inline), others after a pause
    # (the thread runs them); 40 buffers, started and waited in order.
    rng = np.random.RandomState(comm.rank)
    n_inline = 0
    for rep in range(40):
        x = ((comm.rank + 1) * (rep + 1) + np.arange(5000 + rep) % 5).astype(np.float32)
        h = comm.start_allreduce(x)
        if comm.rank != 0:
            time.sleep(rng.uniform(0, 0.002))
        h.wait()
        n_inline += h.ran_inline
        want = (k * (k + 1) / 2.0) * (rep + 1) + k * (np.arange(x.size) % 5)
        np.testing.assert_array_equal(x, want.astype(np.float32))
    comm.thread_handoff = handoff
    return n_inline


def hold_gil(n=3 * 10 ** 6):
    """Run C code that keeps the GIL (no bytecode runs inside a builtin ``sum``
    over a range); return its (start, end) ``perf_counter`` stamps."""
    t0 = time.perf_counter()
    sum(range(n))
    return t0, time.perf_counter()


def check_handoff(comm, k, handoff):
    """When a bucket's transfer starts, against GIL-holding code right after."""
    before, comm.thread_handoff = comm.thread_handoff, handoff
    comm.start_allreduce(np.ones(10, np.float32)).wait()    # the thread exists and idles
    comm.barrier()
    b = np.full(50000, comm.rank + 1.0, np.float32)
    h = comm.start_allreduce(b)
    held = hold_gil()
    h.wait()
    np.testing.assert_array_equal(b, np.full(b.size, k * (k + 1) / 2.0, np.float32))
    comm.thread_handoff = before
    # (a thread waiting for the GIL gets it as the sum returns, before the
    # caller's next stamp: "late" is past the middle of the hold)
    return dict(start_before_hold=h.t_start < held[0],
                start_late=h.t_start > 0.5 * (held[0] + held[1]),
                handed=h.t_handed is not None, hold_ms=1e3 * (held[1] - held[0]))


def check_alone(comm):
    """One rank: a started allreduce is complete at once and leaves the buffer as it is."""
    b = np.arange(3000, dtype=np.float32)
    h = comm.start_allreduce(b)
    assert h.done() and not hasattr(h, 'ran_inline'), h
    np.testing.assert_array_equal(h.wait(), np.arange(3000, dtype=np.float32))
    return None


def main():
    results = {}
    for poll_us in (0, 500):
        comm = MPICommunicator(thread_poll_us=poll_us)
        k = comm.size
        for _ in range(3):
            check(comm, k)
        n_inline = check_inline(comm, k) if k > 1 else check_alone(comm)
        handoff = ({str(on): check_handoff(comm, k, on) for on in (True, False)}
                   if k > 1 else None)
        # One rank arrives 0.3 s late: what the waiting thread burns meanwhile.
        comm.barrier()
        c0 = time.process_time()
        if comm.rank == 1:
            time.sleep(0.3)
        h = comm.start_allreduce(np.ones(1024, np.float32))
        if comm.rank == 0:
            time.sleep(0.3)
        h.wait()
        results[str(poll_us)] = dict(ok=True, cpu_s=time.process_time() - c0, n_inline=n_inline,
                                     handoff=handoff, describe=comm.describe())
        comm.close()
    if comm.rank == 0:
        print(json.dumps(results))


if __name__ == '__main__':
    main()
