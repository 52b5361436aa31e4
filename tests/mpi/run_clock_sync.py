"""Rank program for tests/exchange/test_clock_sync.py.

usage: run_clock_sync.py SKEWS_JSON KERNELS_JSON
    Rank r's ``time.perf_counter`` reads ``SKEWS[r]`` seconds ahead of the true
    one, and its machine (the boot id) is ``KERNELS[r]``. Every rank records
    two steps stamped with that clock just after a barrier (so the true
    moments agree across ranks within the barrier's spread) and its timeline
    is gathered (which moves the stamps onto rank 0's clock). Rank 0 prints
    one JSON line: the trace's ``otherData`` and each rank's ``step 0`` start.
"""
import json
import sys
import time

import numpy as np

from theanompi_ext.collective import create_communicator
from theanompi_ext.collective.base import CompletedHandle
from theanompi_ext.exchange import clock_sync
from theanompi_ext.exchange.timeline import Timeline


def main(skews, kernels):
    comm = create_communicator('auto')
    real, skew, kernel = time.perf_counter, skews[comm.rank], kernels[comm.rank]
    time.perf_counter = lambda: real() + skew       # this rank's machine's clock
    clock_sync.kernel_id = lambda: kernel
    timeline = Timeline(comm.rank)
    # rank 0 computes longest (backward 30 ms, the others 20 ms); every transfer ends
    # at 35 ms: the job waited 5 ms after the last backward pass, each rank on its own
    # 5 ms (rank 0) or 15 ms
    backward = 0.030 if comm.rank == 0 else 0.020
    for it in range(2):
        comm.barrier()
        t = time.perf_counter()
        h = CompletedHandle(np.zeros(4, np.float32), 'bucket 0')
        h.t_queued, h.t_start, h.t_end = t + 0.010, t + 0.010, t + 0.035
        timeline.record_step(it, t, t + 0.040, [('backward:a', t, t + backward)],
                             [('update', t + 0.035, t + 0.040)], [h])
        time.sleep(0.05)
    trace = timeline.gather(comm)
    if comm.rank == 0:
        starts = {e['pid']: e['ts'] for e in trace['traceEvents'] if e.get('name') == 'step 0'}
        print(json.dumps({'other': trace['otherData'], 'step0_us': starts}))
    comm.close()


if __name__ == '__main__':
    main(json.loads(sys.argv[1]), json.loads(sys.argv[2]))
