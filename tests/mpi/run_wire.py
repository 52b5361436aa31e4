"""16-bit wire sums through MPICommunicator, against references computed here.

usage: run_wire.py            check (any number of ranks); rank 0 prints one JSON line
       run_wire.py measure    time asa, op and the float32 allreduce on 1 MB buckets

Every rank draws every rank's bucket from the same seed, so each can compute
the float64 sum itself. Checked for both wires and both methods (asa, op),
sizes that are and are not multiples of the rank count (1 element to over
one cast block): the result is within the 16-bit rounding bound of the
float64 sum, the same bits on every rank, exactly representable in the
wire dtype; for asa it equals the float32 sum of the 16-bit inputs cast
once (np.float16 here, an independent path, for float16). Overflow: a value
beyond float16's range on one rank, and a NaN on one rank, raise the
documented WireOverflow on every rank, and the next sum is right again.
Alone (k = 1, without mpiexec too) nothing travels, so nothing is cast: every
sum is the buffer itself, bit for bit, even beyond float16's range.
"""
import json
import sys
import time

import numpy as np

from theanompi_ext.collective.mpi import MPICommunicator
from theanompi_ext.collective.wire import decode, encode, sum_error_bound
from theanompi_ext.errors import WireOverflow

WIRES = ('float16', 'bfloat16')
METHODS = ('asa', 'op')


def sizes(k):
    return [1, k - 1 or 1, 2 * k, 2 * k + 1, 3000 * k, 3000 * k + k - 1, 2 ** 17 + 1]


def buckets(k, n, seed):
    rng = np.random.RandomState(seed)
    # magnitudes over a few decades, both signs; float16 keeps them normal
    return [(rng.standard_normal(n) * 10.0 ** rng.uniform(-3, 2, n)).astype(np.float32)
            for _ in range(k)]


def check_sums(comm, k):
    worst = {}
    for method in METHODS:
        comm.wire_method = method
        for wire in WIRES:
            for i, n in enumerate(sizes(k)):
                xs = buckets(k, n, 1000 * i + 7)
                buf = xs[comm.rank].copy()
                handle = comm.start_allreduce(buf, name='b%d' % i, wire=wire)
                handle.wait()
                exact = np.sum([x.astype(np.float64) for x in xs], axis=0)
                abs_sum = np.sum([np.abs(x.astype(np.float64)) for x in xs], axis=0)
                bound = sum_error_bound(abs_sum, np.abs(exact), k, wire,
                                        intermediate_roundings=k - 1 if method == 'op' else 0)
                err = np.abs(buf.astype(np.float64) - exact)
                assert np.all(err <= bound), (method, wire, n, float(np.max(err - bound)))
                # the cast really happened: float32 sums would err by ~1e-7
                rel = float(np.max(err / np.maximum(np.abs(exact), 1e-30)))
                if n > 100:
                    assert rel > 2.0 ** -20, (method, wire, n, rel)
                worst[(method, wire)] = max(worst.get((method, wire), 0.0),
                                            float(np.max(err / bound)))
                # a 16-bit value, the same bits on every rank
                np.testing.assert_array_equal(decode(encode(buf, wire), wire), buf)
                digests = comm.allgather(buf.tobytes())
                assert all(d == digests[0] for d in digests), (method, wire, n)
                if method == 'asa' and wire == 'float16':
                    want = np.zeros(n, np.float32)
                    for x in xs:
                        want += x.astype(np.float16).astype(np.float32)
                    np.testing.assert_array_equal(buf, want.astype(np.float16).astype(np.float32))
    comm.wire_method = 'asa'
    return {'%s/%s' % key: round(v, 3) for key, v in worst.items()}


def check_overflow(comm, k):
    seen = []
    for wire, bad in (('float16', 7.0e4), ('bfloat16', np.nan)):
        buf = np.ones(1001, np.float32)
        if comm.rank == k - 1:
            buf[3] = bad
        try:
            comm.start_allreduce(buf, name='big', wire=wire).wait()
        except RuntimeError as exc:
            text = str(exc)
            assert 'bucket big: 1 value(s) of the exchanged sum are inf or nan on the %s wire'\
                % wire in text, text
            own = 1 if comm.rank == k - 1 else 0
            assert "this rank's own gradient had %d non-finite" % own in text, text
            seen.append(wire)
        else:
            raise AssertionError('no WireOverflow for %r on the %s wire' % (bad, wire))
        # the job goes on in step: the next sum is right
        buf = np.full(10, comm.rank + 1.0, np.float32)
        comm.start_allreduce(buf, wire=wire).wait()
        assert np.all(buf == k * (k + 1) / 2.0), buf
    try:
        comm.allreduce(np.full(4, 7.0e4, np.float32), wire='float16')
    except WireOverflow:
        seen.append('blocking')
    return seen


def check_threads(comm):
    """Which thread does what on the started path: the casts to and from 16 bits
    and the overflow counts on the thread that starts and waits, only the
    collectives and the float32 sum between them on the communication thread."""
    import threading
    import theanompi_ext.collective.mpi_wire as mw
    calls, saved = [], {}
    for fn in ('encode', 'decode', 'nonfinite_count', 'sum_encoded'):
        saved[fn] = getattr(mw, fn)

        def record(*a, _fn=fn, **kw):
            calls.append((_fn, threading.current_thread().name))
            return saved[_fn](*a, **kw)
        setattr(mw, fn, record)
    try:
        comm.wire_method = 'asa'
        buf = np.full(1000, comm.rank + 1.0, np.float32)
        handle = comm.start_allreduce(buf, name='t', wire='float16')
        while not handle.done():          # let the communication thread run it
            time.sleep(1e-3)
        assert not handle.ran_inline
        mid = list(calls)
        handle.wait()
        assert np.all(buf == comm.size * (comm.size + 1) / 2.0), buf
    finally:
        for fn, f in saved.items():
            setattr(mw, fn, f)
    main = threading.main_thread().name
    assert mid == [('encode', main), ('nonfinite_count', main),
                   ('sum_encoded', 'allreduce'), ('encode', 'allreduce')], mid
    assert calls[len(mid):] == [('nonfinite_count', main), ('decode', main)], calls
    return True


def check_alone(comm):
    """One rank: no wire, no cast; every started and blocking sum leaves the buffer as it is."""
    for method in METHODS:
        comm.wire_method = method
        for wire in WIRES:
            for i, n in enumerate(sizes(1)):
                buf = buckets(1, n, 1000 * i + 7)[0]
                before = buf.copy()
                comm.start_allreduce(buf, name='b%d' % i, wire=wire).wait()
                np.testing.assert_array_equal(buf, before)
    big = np.full(4, 7.0e4, np.float32)           # beyond float16's range: not cast, kept
    comm.allreduce(big, wire='float16')
    assert np.all(big == np.float32(7.0e4)), big
    comm.wire_method = 'asa'
    return True


def measure(comm, reps=30):
    n = 2 ** 18                      # 1 MB of float32
    buf = np.ones(n, np.float32)
    out = {}
    for _ in range(2):               # second round counts: warm caches, created ops
        for label, wire, method in (('float32', 'float32', 'asa'), ('asa16', 'float16', 'asa'),
                                    ('op16', 'float16', 'op')):
            comm.wire_method = method
            comm.barrier()
            t0 = time.perf_counter()
            for _ in range(reps):
                buf[...] = 1
                comm.start_allreduce(buf, wire=wire).wait()
            out[label] = 1e3 * comm.comm.allreduce(time.perf_counter() - t0,
                                                   op=__import__('mpi4py').MPI.MAX) / reps
    return {k: round(v, 3) for k, v in out.items()}


def main():
    comm = MPICommunicator()
    k = comm.size
    if sys.argv[1:] == ['measure']:
        res = {'k': k, 'ms_per_1MB_bucket': measure(comm)}
    elif k == 1:
        res = {'k': k, 'alone_unchanged': check_alone(comm)}
    else:
        res = {'k': k, 'worst_error_over_bound': check_sums(comm, k),
               'overflow': check_overflow(comm, k), 'threads': check_threads(comm)}
    comm.close()
    if comm.rank == 0:
        print(json.dumps(res))


if __name__ == '__main__':
    main()
