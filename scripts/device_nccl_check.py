#!/usr/bin/env python
"""One-command GPU check of the NCCL backend (one GPU, world size 1).

    python scripts/device_nccl_check.py [--mb 256] [--matmul 8192] [--target-ms 200]
                                        [--flat-scale 2048] [--json report.json] [--timeout 240]

Needs libnccl and CuPy (the ``[gpu]`` extra for CUDA 12, ``[gpu-cu13]`` for
CUDA 13; a stock CUDA 13 image with ``cupy-cuda13x`` and ``nvidia-nccl-cu13``
needs nothing else) and one CUDA device. Runs as one rank (NCCL refuses two
ranks on one GPU). Without a launcher it never touches MPI, so an image whose
mpi4py has no MPI library behind it will do; under ``mpirun -n 1`` it uses
``COMM_WORLD``. Finishes in well under a minute on an H100/H200 (it takes
about 13 GB of the GPU's memory for check 4; ``--flat-scale`` lowers it).

What it shows
  1. correctness through ``NCCLCommunicator`` on CuPy buffers produced on
     a non-default compute stream: a started allreduce, a stream wait and a
     host-synchronised ``allreduce`` give rank-count multiples of the input;
  2. stream ordering: the comm stream waits for work already queued on the
     compute stream (ready event), and after ``Handle.wait()`` the compute
     stream waits for the comm stream (done event). Both are made
     observable with slow work in front of a write; a control run without
     the wait shows whether the check can tell the difference;
  3. overlap: a 256 MB allreduce repeated on the comm stream and a kernel
     of known length (one thread that waits on the GPU's clock) repeated
     on a compute stream, each alone and both at once. Overlap is proven
     when the concurrent wall time is below 0.9 x the sum of the two
     alone. Beside it, as a figure only, the same allreduces against a
     float32 matmul that fills the GPU: one rank's allreduce is a copy
     through the same memory and SMs, so those two mostly share the GPU
     (first run on an H200: 9% of the shorter hidden) -- how much
     kernels that each fill the GPU slow each other, not whether the
     streams run at once;

  4. the trainer's layout: one flat float32 gradient buffer, buckets planned
     as the trainer plans them (``buckets/plan.py``) and taken as views of
     it at non-zero offsets; each bucket's pointer (``device_buffer``) is
     the base plus its offset, an out-of-place avg of every bucket view
     into a second flat buffer lands exactly where it belongs, and with one
     chunk of compute per bucket (the comm stream waiting by an event for
     the chunk that produced the bucket; each chunk a clock-wait as long
     as its bucket's allreduce) the chunks and the bucket allreduces
     overlap (concurrent < 0.9 x the sum of the two alone, and faster than
     a control in which the compute stream waits for every sum); the
     sizes are the ResNet-like mix times ``--flat-scale``, since one rank
     copies a bucket at memory speed and only large ones take long
     enough for the GPU, not the host, to set the time;
  5. the trainer's NCCL exchange path itself (``exchange/nccl_device.py``,
     ``DeviceNCCLExchanger`` over a communicator with ``compute_stream=``)
     on that layout: each chunk (slow work, then the write of its bucket)
     on the compute stream, each bucket started as its view, ``finish()``
     making the compute stream wait, the read after it seeing every sum
     (with one rank the in-place sum is the identity, so this proves the
     path runs and keeps the values, not the cross-rank sum);
  6. the 16-bit wire (``wire='float16'|'bfloat16'``): the cast to 16 bits
     and back on the comm stream around NCCL's half/bfloat16 sum gives, for
     one rank, exactly the round-to-nearest-even of every value, checked
     against a reference from outside this project (numpy's float16;
     ml_dtypes', else PyTorch's, bfloat16); a float16 overflow is inf; a
     bucket that CuPy did not make (only ``__cuda_array_interface__``, as
     pygpu's buckets reach the casts by address) at an offset of a flat
     buffer is rounded in place and its neighbours untouched; and
     ``DeviceNCCLExchanger`` with each wire on the flat layout.

Limits, stated in the report: with one rank, NCCL performs an in-place
sum as nothing at all, so the timed operation is an *out-of-place*
``ncclAllReduce`` with ``ncclAvg`` on the communicator's stream, which
one rank runs as a real NCCL kernel reading and writing the buffer. That
proves the two streams run concurrently on the GPU, not network overlap.

Exit status: 0 all checks passed, 1 a check failed, 2 NCCL cannot run here.
"""
import argparse
import faulthandler
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))      # run from a checkout without installing

os.environ.setdefault('NCCL_DEBUG', 'WARN')     # NCCL's own words if init fails


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--mb', type=float, default=256.0, help='allreduce size in MB (default 256)')
    p.add_argument('--flat-scale', type=int, default=2048,
                   help='check 4\'s layout: the ResNet-like sizes times this (default 2048: '
                        '6.4 GB, and as much again for the second buffer)')
    p.add_argument('--matmul', type=int, default=8192, help='square matmul size (default 8192)')
    p.add_argument('--target-ms', type=float, default=200.0,
                   help='work per stream in the overlap timing (default 200 ms)')
    p.add_argument('--trials', type=int, default=3, help='overlap trials, median reported')
    p.add_argument('--json', default=None, help='also write the report as JSON here '
                   '(default: $OUT/device_nccl_check.json when $OUT is set)')
    p.add_argument('--timeout', type=int, default=240,
                   help='give up after this many seconds (a hung NCCL init, say)')
    return p.parse_args(argv)


class Report(object):
    """Collects PASS/FAIL/INFO lines and numbers; prints as it goes."""

    def __init__(self):
        self.lines, self.data, self.failed = [], {}, False

    def add(self, status, what, detail=''):
        line = '%-4s %s%s' % (status, what, (': ' + detail) if detail else '')
        print(line, flush=True)
        self.lines.append(line)
        if status == 'FAIL':
            self.failed = True

    def check(self, ok, what, detail=''):
        self.add('PASS' if ok else 'FAIL', what, detail)
        return ok


def _timeout(seconds):
    # faulthandler's watchdog is a C thread: it fires even while the main
    # thread hangs inside C (ncclCommInitRank, MPI_Init), where a Python
    # signal handler would never run. It dumps every stack, then exits 1.
    print('INFO watchdog: after %d s the stacks are dumped and the check exits 1 '
          '(NCCL_DEBUG=INFO shows where NCCL stopped)' % seconds, flush=True)
    faulthandler.dump_traceback_later(seconds, exit=True)


def correctness(rep, comm, cp, n):
    """Values through the communicator API on a non-default compute stream."""
    compute = cp.cuda.Stream(non_blocking=True)
    k = comm.size
    with compute:
        x = cp.arange(n, dtype=cp.float32)
        h = comm.start_allreduce(x, 'x')
        h.wait()                          # compute waits on done; host does not
        x *= 2
    compute.synchronize()
    expect = cp.arange(n, dtype=cp.float32) * (2 * k)
    rep.check(bool(cp.array_equal(x, expect)), 'started allreduce + stream wait on a non-default stream',
              '%d float32, world size %d' % (n, k))

    with compute:
        y = cp.full(n, 1.5, dtype=cp.float32)
        comm.allreduce(y)                  # host-synchronised
        rep.check(bool(cp.all(y == 1.5 * k)), 'host-synchronised allreduce')

    ok = False
    try:
        comm.start_allreduce(cp.asnumpy(y))
    except TypeError as exc:
        ok = 'numpy.ndarray' in str(exc)
    rep.check(ok, 'numpy buffer refused with TypeError naming the type')
    ok = False
    try:
        comm.start_allreduce(cp.zeros(4, dtype=cp.float64))
    except TypeError as exc:
        ok = 'float32' in str(exc)
    rep.check(ok, 'float64 buffer refused')


def ordering(rep, comm, cp, size):
    """Make both event waits observable: slow work, then a write, then a read elsewhere."""
    compute = cp.cuda.Stream(non_blocking=True)
    a = cp.ones((size, size), dtype=cp.float32)
    x = cp.zeros(1 << 20, dtype=cp.float32)
    cp.cuda.Device().synchronize()

    # Ready: compute does slow work then writes 3; the comm stream, after
    # start_allreduce, copies x. It must see 3.
    with compute:
        for _ in range(3):
            a @ a
        x.fill(3)
        comm.start_allreduce(x, 'ready')
    with comm.stream:
        seen = x.copy()
    comm.stream.synchronize()
    rep.check(bool(cp.all(seen == 3 * comm.size)), 'comm stream waits for queued compute work (ready event)')

    def done_case(wait):
        cp.cuda.Device().synchronize()
        x.fill(0)
        cp.cuda.Device().synchronize()
        # Slow work then a write *on the comm stream*, queued before the
        # allreduce, so it precedes the done event.
        with comm.stream:
            for _ in range(3):
                a @ a
            x.fill(5)
        with compute:
            h = comm.start_allreduce(x, 'done')
            if wait:
                h.wait()
            snap = x.copy()
        cp.cuda.Device().synchronize()
        return bool(cp.all(snap == 5 * comm.size))

    rep.check(done_case(True), 'compute stream waits for the comm stream after Handle.wait() (done event)')
    # Control: the ready event already orders the allreduce after the
    # compute stream, not the other way, so without wait() the compute
    # copy can run before the comm stream's write.
    stale = not done_case(False)
    rep.add('INFO', 'control without wait()', 'stale read seen (the check above has teeth)' if stale
            else 'no stale read this time (the race went the other way; check above less conclusive)')


def _time(cp, fn):
    cp.cuda.Device().synchronize()
    t = time.perf_counter()
    fn()
    cp.cuda.Device().synchronize()
    return time.perf_counter() - t


SPIN_SRC = r"""
extern "C" __global__ void spin_ns(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
"""


def spinner(cp, stream):
    """``spin(seconds)``: one thread on ``stream`` busy for that long by the
    GPU's own clock, leaving every other SM to the other stream.

    The stand-in for compute in the pass/fail overlap checks: a kernel
    that takes a known time without competing for SMs or memory shows
    whether two streams' work really runs at the same time (our events
    and waits), apart from how much two kernels that each fill the GPU
    slow each other down (reported beside it, from a matmul).
    """
    import numpy as np
    kernel = cp.RawKernel(SPIN_SRC, 'spin_ns')

    def spin(seconds):
        with stream:
            kernel((1,), (1,), (np.uint64(int(seconds * 1e9)),))
    return spin


def _concurrency(cp, a_op, n_a, b_op, n_b, trials):
    """Median ``(t_a, t_b, t_both)`` over ``trials``: ``a_op`` x n_a alone,
    ``b_op`` x n_b alone, and both enqueued in proportion."""

    def run_both():
        i = j = 0
        while i < n_a or j < n_b:
            if j >= n_b or (i < n_a and i * n_b <= j * n_a):
                a_op()
                i += 1
            else:
                b_op()
                j += 1
    rows = []
    for _ in range(max(1, trials)):
        rows.append((_time(cp, lambda: [a_op() for _ in range(n_a)]),
                     _time(cp, lambda: [b_op() for _ in range(n_b)]), _time(cp, run_both)))
    rows.sort(key=lambda r: r[2])
    return rows[len(rows) // 2], rows


def _hidden(t_a, t_b, t_both):
    return (t_a + t_b - t_both) / min(t_a, t_b)


def overlap(rep, comm, cp, mb, size, target_ms, trials):
    """Allreduces on the comm stream beside work on a compute stream, each
    alone and both at once: a kernel of known length (pass/fail), then a
    matmul that fills the GPU (a figure)."""
    from theanompi_ext.collective.nccl_lib import NCCL_FLOAT32, NCCL_AVG
    count = int(mb * (1 << 20)) // 4
    src = cp.ones(count, dtype=cp.float32)
    dst = cp.empty_like(src)
    a = cp.random.rand(size, size, dtype=cp.float32)
    b = cp.random.rand(size, size, dtype=cp.float32)
    c = cp.empty_like(a)
    compute = cp.cuda.Stream(non_blocking=True)
    lib, stream = comm.lib, comm.stream
    spin = spinner(cp, compute)

    def ar():
        # Out-of-place avg: with one rank NCCL runs a real kernel for this,
        # while an in-place sum would be skipped entirely.
        lib.all_reduce(src.data.ptr, dst.data.ptr, count, NCCL_FLOAT32, NCCL_AVG,
                       comm.nccl_comm, stream.ptr)

    def mm():
        with compute:
            cp.matmul(a, b, out=c)

    for f in (ar, mm, lambda: spin(1e-3)):   # warm-up: cuBLAS, NCCL kernels, the spin's build
        for _ in range(3):
            f()
    ok = bool(cp.allclose(dst, src))
    rep.check(ok, 'out-of-place ncclAllReduce(avg) on the comm stream', '%.0f MB' % mb)

    t_ar1 = _time(cp, lambda: [ar() for _ in range(20)]) / 20
    t_mm1 = _time(cp, lambda: [mm() for _ in range(5)]) / 5
    n_ar = int(min(4000, max(1, round(target_ms / 1e3 / t_ar1))))
    n_mm = int(min(1000, max(1, round(target_ms / 1e3 / t_mm1))))
    rep.add('INFO', 'single ops', 'allreduce %.0f MB %.3f ms (%.0f GB/s read+write), matmul %d^3 %.2f ms (%.1f TFLOP/s)'
            % (mb, t_ar1 * 1e3, 2 * count * 4 / t_ar1 / 1e9, size, t_mm1 * 1e3,
               2.0 * size ** 3 / t_mm1 / 1e12))

    # Pass/fail: 20 spins of target_ms/20 on the compute stream.
    n_sp = 20
    (t_ar, t_sp, t_both), rows = _concurrency(
        cp, ar, n_ar, lambda: spin(target_ms / 1e3 / n_sp), n_sp, trials)
    rep.data.update(allreduce_mb=mb, n_allreduce=n_ar, spin_ms=target_ms, t_allreduce_s=t_ar,
                    t_spin_s=t_sp, t_both_s=t_both, overlap_fraction=_hidden(t_ar, t_sp, t_both),
                    trials=rows)
    # 10% margin: work that does not overlap lands within a few percent of
    # the sum, so a smaller saving would not be evidence.
    rep.check(t_both < 0.9 * (t_ar + t_sp), 'overlap: allreduces on the comm stream run while '
              'the compute stream is busy (concurrent < 0.9 x the sum alone)',
              'allreduce x%d alone %.1f ms, compute stream busy %.1f ms, concurrent %.1f ms; '
              '%.0f%% of the shorter one hidden' % (n_ar, t_ar * 1e3, t_sp * 1e3, t_both * 1e3,
                                                    100 * _hidden(t_ar, t_sp, t_both)))
    # A figure: a matmul fills every SM and one rank's allreduce is a copy
    # through the same memory, so here they mostly share the GPU. Across
    # ranks NCCL's kernels spend their time waiting on the link instead.
    (t_ar, t_mm, t_both), rows = _concurrency(cp, ar, n_ar, mm, n_mm, trials)
    rep.data['matmul'] = dict(size=size, n_matmul=n_mm, t_allreduce_s=t_ar, t_matmul_s=t_mm,
                              t_both_s=t_both, trials=rows)
    rep.add('INFO', 'beside a matmul that fills the GPU',
            'allreduce x%d alone %.1f ms, matmul x%d alone %.1f ms, concurrent %.1f ms; %.0f%% '
            'of the shorter one hidden (one rank\'s allreduce copies through the memory the '
            'matmul uses; no link to wait on)' % (n_ar, t_ar * 1e3, n_mm, t_mm * 1e3,
                                                  t_both * 1e3, 100 * _hidden(t_ar, t_mm, t_both)))


# A ResNet-like mix of tensor sizes (conv kernels, BN vectors, a classifier).
FLAT_SIZES = [640, 10] + [64] * 4 + [147456, 256, 256, 73728, 128, 128, 36864, 64, 64] * 3 \
    + [1728]


def flat_plan(scale=1):
    """``(buckets, total)``: :data:`FLAT_SIZES` times ``scale`` planned as the
    trainer plans them (bucket caps scaled too, so the plan keeps its shape)."""
    from theanompi_ext.buckets.plan import plan_buckets
    sizes = [n * scale for n in FLAT_SIZES]
    return plan_buckets(sizes, len(sizes), 0.5 * scale, 0.05 * scale), sum(sizes)


def flat_layout(rep, comm, cp, scale, trials):
    """Check 4: bucket views of one flat gradient buffer, as the trainer lays them out.

    The layout is :data:`FLAT_SIZES` times ``scale`` (bucket caps too, so
    the plan keeps its shape): one rank's allreduce of a bucket is a copy
    at memory speed, and only buckets of hundreds of MB take long enough
    (a fraction of a ms) for the timing to be the GPU's, not the host's.
    """
    from theanompi_ext.collective.nccl_buffers import device_buffer
    from theanompi_ext.collective.nccl_lib import NCCL_FLOAT32, NCCL_AVG
    buckets, total = flat_plan(scale)
    src = cp.arange(total, dtype=cp.float32)
    src %= 997
    dst = cp.zeros_like(src)
    # Made on the default stream, which the (non-blocking) comm stream does
    # not wait for: a large buffer is still being written when NCCL reads it.
    cp.cuda.Device().synchronize()
    base = src.data.ptr
    ptr_ok = all(device_buffer(src[b.start:b.stop]).ptr == base + 4 * b.start for b in buckets)
    rep.check(ptr_ok and len(buckets) > 1 and all(b.start > 0 for b in buckets[1:]),
              'bucket views of a flat buffer at their offsets (pointer = base + 4 x start)',
              '%d buckets over %d floats (%.1f GB)' % (len(buckets), total, 4e-9 * total))
    lib, stream = comm.lib, comm.stream

    def ar(b):
        n = b.stop - b.start
        lib.all_reduce(device_buffer(src[b.start:b.stop]).ptr,
                       device_buffer(dst[b.start:b.stop]).ptr, n, NCCL_FLOAT32, NCCL_AVG,
                       comm.nccl_comm, stream.ptr)

    for b in buckets:
        ar(b)
    stream.synchronize()
    rep.check(bool(cp.array_equal(dst, src)), 'out-of-place avg of every bucket view lands at '
              'its offset in a second flat buffer')
    compute = cp.cuda.Stream(non_blocking=True)
    spin = spinner(cp, compute)
    spin(1e-3)
    # Each bucket's chunk lasts as long as its allreduce alone (the GPU's
    # clock, median of 3): the two streams then have equal work, and
    # overlapping them can save up to half the sum.
    t_b = []
    for b in buckets:
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        runs = []
        for _ in range(3):
            e0.record(stream)
            ar(b)
            e1.record(stream)
            e1.synchronize()
            runs.append(cp.cuda.get_elapsed_time(e0, e1) / 1e3)
        t_b.append(sorted(runs)[1])

    def chunks(with_comm, serial=False):
        for b, t in zip(buckets, t_b):    # one backward "chunk" per bucket, output side first
            spin(t)
            if with_comm:
                ev = cp.cuda.Event(disable_timing=True)
                ev.record(compute)
                stream.wait_event(ev)      # the comm stream waits for its chunk, not the host
                ar(b)
                if serial:                 # control: the compute stream waits for each sum
                    done = cp.cuda.Event(disable_timing=True)
                    done.record(stream)
                    compute.wait_event(done)

    def comm_only():
        for b in buckets:
            ar(b)

    reps = 5
    rows = []
    for _ in range(max(1, trials)):
        rows.append((_time(cp, lambda: [chunks(False) for _ in range(reps)]),
                     _time(cp, lambda: [comm_only() for _ in range(reps)]),
                     _time(cp, lambda: [chunks(True) for _ in range(reps)]),
                     _time(cp, lambda: [chunks(True, serial=True) for _ in range(reps)])))
    rows.sort(key=lambda r: r[2])
    t_mm, t_ar, t_both, t_serial = rows[len(rows) // 2]
    rep.data.update(flat_layout=dict(scale=scale, buckets=len(buckets), floats=total,
                                     bucket_ms=[t * 1e3 for t in t_b], t_chunks_s=t_mm,
                                     t_buckets_s=t_ar, t_both_s=t_both, t_serial_s=t_serial,
                                     trials=rows))
    detail = ('%d x (%d chunks %.2f ms alone, %d bucket allreduces %.2f ms alone, '
              'interleaved %.2f ms; each sum waited for: %.2f ms)'
              % (reps, len(buckets), t_mm * 1e3 / reps, len(buckets), t_ar * 1e3 / reps,
                 t_both * 1e3 / reps, t_serial * 1e3 / reps))
    rep.check(t_both < 0.9 * (t_ar + t_mm) and t_serial > t_both,
              'overlap on the flat layout: chunks + bucket allreduces interleaved < 0.9 x the '
              'sum alone (and faster than with each sum waited for)', detail)


def exchange_path(rep, ranks, cp, size):
    """Check 5: the trainer's NCCL exchange path (exchange/nccl_device.py) on the flat layout.

    Each "chunk" is slow work then the write of its bucket's gradient on
    the compute stream; the exchanger starts the bucket (its view, on the
    comm stream after the chunk's event); finish() makes the compute
    stream wait; the "update" then reads the flat buffer on the compute
    stream. The host must not block before the final synchronize.
    """
    from theanompi_ext.collective.nccl import NCCLCommunicator
    from theanompi_ext.exchange.nccl_device import DeviceNCCLExchanger
    buckets, total = flat_plan()
    compute = cp.cuda.Stream(non_blocking=True)
    comm = NCCLCommunicator(comm=ranks, compute_stream=compute)
    try:
        ex = DeviceNCCLExchanger(comm, buckets, total)
        flat = cp.zeros(total, dtype=cp.float32)
        a = cp.random.rand(size, size, dtype=cp.float32)
        c = cp.empty_like(a)
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        for b in buckets:
            with compute:
                for _ in range(2):
                    cp.matmul(a, a, out=c)
                flat[b.start:b.stop] = b.index + 1
            ex.start_ready(b.last, flat)
        ex.finish(flat)
        with compute:
            seen = flat.copy()          # the update reads after every sum
        t_host = time.perf_counter() - t0
        compute.synchronize()
        t_all = time.perf_counter() - t0
        want = cp.zeros(total, dtype=cp.float32)
        for b in buckets:
            want[b.start:b.stop] = (b.index + 1) * comm.size
        rep.check(bool(cp.array_equal(seen, want)), 'the trainer\'s NCCL exchange path '
                  '(DeviceNCCLExchanger): every bucket view summed, read after finish() on the '
                  'compute stream', '%d buckets, world size %d' % (len(buckets), comm.size))
        rep.add('INFO', 'exchange path host time', 'enqueue %.1f ms of %.1f ms until the '
                'compute stream was done (no host sync before it)' % (t_host * 1e3, t_all * 1e3))
    finally:
        comm.close()


def bfloat16_reference(x):
    """float32 ``x`` rounded to bfloat16 and back, by a library outside this
    project; returns ``(values, source)``."""
    import numpy as np
    try:
        import ml_dtypes
        return x.astype(ml_dtypes.bfloat16).astype(np.float32), 'ml_dtypes %s' % ml_dtypes.__version__
    except ImportError:
        pass
    try:
        import torch
        t = torch.from_numpy(x).to(torch.bfloat16).to(torch.float32)
        return t.numpy(), 'torch %s' % torch.__version__
    except ImportError:
        return None, 'neither ml_dtypes nor torch installed'


def wire_reference(x, wire):
    """``(values, source)``: float32 ``x`` through a 16-bit ``wire`` and back."""
    import numpy as np
    if wire == 'float16':
        with np.errstate(over='ignore'):
            return x.astype(np.float16).astype(np.float32), 'numpy %s float16' % np.__version__
    return bfloat16_reference(x)


class CAIBuffer(object):
    """Device memory known only by ``__cuda_array_interface__`` (as a
    pygpu bucket is known only by its address)."""

    def __init__(self, ptr, count, owner):
        self.owner = owner
        self.__cuda_array_interface__ = dict(shape=(count,), typestr='<f4', data=(ptr, False),
                                             version=2, strides=None)


def wire_values(n, seed=0):
    """Random float32 values over ten binades (float16's subnormals among
    them), after a float16 overflow, its largest value and a tie."""
    import numpy as np
    rng = np.random.RandomState(seed)
    x = (rng.standard_normal(n) * 10.0 ** rng.randint(-6, 4, n)).astype(np.float32)
    x[:4] = [7e4, -7e4, 65504.0, 1.0 + 2.0 ** -11]    # float16 overflow, its max, a tie
    return x


def wire_checks(rep, comm, cp, n):
    """Check 6: the 16-bit wire, exact against references from outside the project.

    ``comm`` was built with ``compute_stream=``: every buffer is written on
    that stream (or before a device synchronize), as the trainer's are.
    """
    import numpy as np
    from theanompi_ext.exchange.nccl_device import DeviceNCCLExchanger
    x = wire_values(n)
    compute, k = comm.compute_stream, comm.size
    exact = k == 1      # one rank: NCCL's sum is the identity, the casts are all there is
    if not exact:
        rep.add('INFO', 'wire checks', 'world size %d: sums compared to rtol 4e-3' % k)

    def same(got, want):
        with np.errstate(over='ignore', invalid='ignore'):
            want = want * np.float32(k)
            return bool(np.array_equal(got, want) if exact
                        else np.allclose(got, want, rtol=4e-3))

    for wire in ('float16', 'bfloat16'):
        want, source = wire_reference(x, wire)
        if want is None:
            rep.add('FAIL', '%s wire' % wire, 'no reference: %s' % source)
            continue
        with compute:
            y = cp.asarray(x)
            comm.start_allreduce(y, 'wire', wire=wire).wait()
            got = cp.asnumpy(y)
        compute.synchronize()
        rep.check(same(got, want), '%s wire: cast, NCCL %s sum, cast back on the comm stream'
                  % (wire, wire), '%d values equal to %s%s' % (n, source, '' if exact else ' x k'))
        if wire == 'float16':
            rep.check(bool(np.isinf(got[:2]).all() and got[2] == 65504.0 * k),
                      'float16 wire: 7e4 overflows to inf, 65504 is kept')
        # A bucket CuPy did not make, at an offset of a flat buffer.
        flat = cp.asarray(np.full(n + 64, 3.0, np.float32))
        flat[32:32 + n] = cp.asarray(x)
        cp.cuda.Device().synchronize()
        comm.start_allreduce(CAIBuffer(flat.data.ptr + 4 * 32, n, flat), 'cai',
                             wire=wire).wait(sync=True)
        compute.synchronize()
        got = cp.asnumpy(flat)
        rep.check(same(got[32:32 + n], want) and bool((got[:32] == 3).all()
                                                      and (got[32 + n:] == 3).all()),
                  '%s wire on a buffer known only by its address, at an offset' % wire,
                  'rounded in place, neighbours untouched')
    # The casts' cost (with one rank they are all the wire adds): a figure.
    big = cp.ones(16 << 20, dtype=cp.float32)
    for wire in ('float16', 'bfloat16'):
        comm.start_allreduce(big, 'big', wire=wire).wait(sync=True)
        t = _time(cp, lambda: [comm.start_allreduce(big, 'big', wire=wire).wait(sync=True)
                               for _ in range(10)]) / 10
        rep.add('INFO', '%s wire, 64 MB bucket' % wire, '%.3f ms a start-to-wait (casts%s)'
                % (t * 1e3, '' if exact else ' and the sum'))
        rep.data['wire_%s_64MB_ms' % wire] = t * 1e3
    buckets, total = flat_plan()
    vals = np.zeros(total, np.float32)
    for b in buckets:
        vals[b.start:b.stop] = np.float32(b.index + 1) / np.float32(3)
    for wire in ('float16', 'bfloat16'):
        want, source = wire_reference(vals, wire)
        if want is None:
            continue
        ex = DeviceNCCLExchanger(comm, buckets, total, wire=wire)
        flat = cp.zeros(total, dtype=cp.float32)
        cp.cuda.Device().synchronize()
        for b in buckets:
            with compute:
                flat[b.start:b.stop] = cp.asarray(vals[b.start:b.stop])
            ex.start_ready(b.last, flat)
        ex.finish(flat)
        compute.synchronize()
        got = cp.asnumpy(flat)
        rep.check(same(got, want) and not np.array_equal(got, vals * k),
                  'DeviceNCCLExchanger, %s wire: every bucket view rounded as %s says'
                  % (wire, source), '%d buckets' % len(buckets))


def main(argv=None):
    args = parse_args(argv)
    _timeout(args.timeout)
    rep = Report()
    t0 = time.perf_counter()
    from theanompi_ext.collective.nccl import NCCLCommunicator
    from theanompi_ext.collective.nccl_probe import probe
    ok, why = probe()
    rep.add('INFO', 'probe', why)
    rep.data['probe'] = why
    if not ok:
        rep.add('FAIL', 'NCCL backend cannot run here', why)
        return _finish(rep, args, 2)
    import cupy as cp
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    name = props['name'].decode() if isinstance(props['name'], bytes) else props['name']
    rep.add('INFO', 'device', '%s, CuPy %s, CUDA_VISIBLE_DEVICES=%s'
            % (name, cp.__version__, os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')))
    from theanompi_ext.collective.world import in_mpi_job, OneRankWorld
    # Outside a launcher, a world of one without MPI: an image's MPI may be
    # missing, or slow to start as a singleton, and one rank needs none.
    ranks = None if in_mpi_job() else OneRankWorld()
    rep.add('INFO', 'ranks', 'MPI COMM_WORLD (started by a launcher)' if ranks is None
            else 'one process, MPI not used (no launcher)')
    try:
        comm = NCCLCommunicator(comm=ranks)
    except Exception as exc:   # MPI, NCCL init: say which
        rep.add('FAIL', 'NCCLCommunicator()', '%s: %s' % (type(exc).__name__, exc))
        return _finish(rep, args, 1)
    rep.add('INFO', 'communicator', comm.describe())
    if comm.size != 1:
        rep.add('INFO', 'world size %d' % comm.size, 'each rank reports its own numbers')
    try:
        correctness(rep, comm, cp, 1 << 22)
        ordering(rep, comm, cp, min(args.matmul, 8192))
        overlap(rep, comm, cp, args.mb, args.matmul, args.target_ms, args.trials)
        flat_layout(rep, comm, cp, args.flat_scale, args.trials)
        exchange_path(rep, ranks, cp, min(args.matmul, 4096))
        wire_comm = NCCLCommunicator(comm=ranks, compute_stream=cp.cuda.Stream(non_blocking=True))
        try:
            wire_checks(rep, wire_comm, cp, 1 << 16)
        finally:
            wire_comm.close()
    except Exception as exc:   # report what broke, then the exit status says FAIL
        import traceback
        traceback.print_exc()
        rep.add('FAIL', 'unexpected error', '%s: %s' % (type(exc).__name__, exc))
    finally:
        comm.close()
    rep.add('INFO', 'wall time', '%.1f s' % (time.perf_counter() - t0))
    return _finish(rep, args, 1 if rep.failed else 0)


def _finish(rep, args, status):
    faulthandler.cancel_dump_traceback_later()
    print('RESULT %s' % {0: 'all checks passed', 1: 'a check FAILED', 2: 'NCCL unavailable'}[status],
          flush=True)
    path = args.json
    if path is None and os.environ.get('OUT'):
        path = os.path.join(os.environ['OUT'], 'device_nccl_check.json')
    if path:
        with open(path, 'w') as f:
            json.dump({'status': status, 'lines': rep.lines, 'data': rep.data}, f, indent=1)
    return status


if __name__ == '__main__':
    sys.exit(main())
