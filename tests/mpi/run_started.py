"""Started allreduces of several sizes through MPICommunicator, both thread waits.

usage: run_started.py   (any number of ranks)

Rank r fills bucket i with ``(r + 1) * (i + 1) + arange(size) % 7``; the
sum over ranks is computed here independently with numpy. Both ways the
communication thread waits are checked (blocking Allreduce, and Iallreduce
tested with sleeps), plus CPU seconds the thread-side wait costs while the
main thread sleeps. Rank 0 prints one JSON line.
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


def main():
    results = {}
    for poll_us in (0, 500):
        comm = MPICommunicator(thread_poll_us=poll_us)
        k = comm.size
        for _ in range(3):
            check(comm, k)
        # One rank arrives 0.3 s late: what the waiting thread burns meanwhile.
        comm.barrier()
        c0 = time.process_time()
        if comm.rank == 1:
            time.sleep(0.3)
        h = comm.start_allreduce(np.ones(1024, np.float32))
        if comm.rank == 0:
            time.sleep(0.3)
        h.wait()
        results[str(poll_us)] = dict(ok=True, cpu_s=time.process_time() - c0,
                                     describe=comm.describe())
        comm.close()
    if comm.rank == 0:
        print(json.dumps(results))


if __name__ == '__main__':
    main()
