"""The two-level allreduce (collective/two_level.py) against float64 sums computed here.

usage: THEANOMPI_EXT_FAKE_RANKS_PER_HOST=R mpiexec -n K run_two_level.py
       (rank 0 prints one JSON line)

Every rank draws every rank's bucket from the same seed and computes the
float64 sum itself. For each algorithm the layout allows (rsag needs equal
hosts), blocking and started, float32 and both 16-bit wires, sizes below,
at and above the rank count: the result is within the bound of its
summation (float32: (k-1) 2**-24 sum|x|, any order; 16-bit: that plus one
cast of each host's partial sum and of the result, wire.sum_error_bound),
has the same bits on every rank, and differs from the flat MPI sum by at
most twice the float32 bound (both err within it, in different orders).
An overflow on the 16-bit wire raises on every rank, and the next sum is
right again (on one host nothing is cast, so nothing overflows).
"""
import json
import sys

import numpy as np

from theanompi_ext.collective.mpi import MPICommunicator
from theanompi_ext.collective.two_level import host_layout
from theanompi_ext.collective.world import import_mpi
from theanompi_ext.collective.wire import sum_error_bound


PIECE_BYTES = 1 << 16


def sizes(k):
    # with 64 KB pieces (PIECES below) the last is cut in 8 whose phases overlap
    return [1, k - 1 or 1, 2 * k + 1, 3000 * k + k - 1, 2 ** 17 + 3]


def buckets(k, n, seed):
    rng = np.random.RandomState(seed)
    return [(rng.standard_normal(n) * 10.0 ** rng.uniform(-3, 2, n)).astype(np.float32)
            for _ in range(k)]


def check(two, flat, k):
    worst = {}
    for wire in ('float32', 'float16', 'bfloat16'):
        for i, n in enumerate(sizes(k)):
            xs = buckets(k, n, 1000 * i + 11)
            exact = np.sum([x.astype(np.float64) for x in xs], axis=0)
            abs_sum = np.sum([np.abs(x.astype(np.float64)) for x in xs], axis=0)
            f32 = (k - 1) * 2.0 ** -24 * abs_sum * 1.01 + 1e-45
            bound = f32 if wire == 'float32' else sum_error_bound(abs_sum, np.abs(exact), k, wire)
            for how in ('blocking', 'started'):
                buf = xs[two.rank].copy()
                if how == 'blocking':
                    two.allreduce(buf, wire=wire)
                else:
                    two.start_allreduce(buf, name='b%d' % i, wire=wire).wait()
                err = np.abs(buf.astype(np.float64) - exact)
                assert np.all(err <= bound), (wire, n, how, float(np.max(err - bound)))
                worst[wire] = max(worst.get(wire, 0.0), float(np.max(err / bound)))
                digests = two.comm.allgather(buf.tobytes())
                assert all(d == digests[0] for d in digests), (wire, n, how)
                if wire == 'float32':
                    ref = xs[flat.rank].copy()
                    flat.allreduce(ref)
                    diff = np.abs(buf.astype(np.float64) - ref)
                    assert np.all(diff <= 2 * f32), (n, how, float(np.max(diff - 2 * f32)))
                    worst['vs flat'] = max(worst.get('vs flat', 0.0),
                                           float(np.max(diff / (2 * f32))))
    return {key: round(v, 3) for key, v in worst.items()}


def check_overflow(two, k, hosts):
    """On one host nothing crosses a host link, so nothing is cast: no overflow."""
    buf = np.ones(1001, np.float32)
    if two.rank == k - 1:
        buf[3] = 7.0e4
    try:
        two.start_allreduce(buf, name='big', wire='float16').wait()
    except RuntimeError as exc:
        assert hosts > 1 and 'inf or nan' in str(exc), exc
    else:
        assert hosts == 1, 'no overflow raised'
    buf = np.full(10, two.rank + 1.0, np.float32)
    two.start_allreduce(buf, wire='float16').wait()
    assert np.all(buf == k * (k + 1) / 2.0), buf
    return True


def main():
    MPI = import_mpi()
    k = MPI.COMM_WORLD.Get_size()
    hosts, per_host = host_layout(MPI.COMM_WORLD)
    flat = MPICommunicator()
    out = {'k': k, 'per_host': list(per_host), 'algorithms': {}}
    try:
        auto = MPICommunicator(topology='auto')
        out['auto'] = auto.topology_in_use
        auto.close()
        algorithms = ['rsag', 'leader'] if len(set(per_host)) == 1 else ['leader']
        for algorithm in algorithms:
            two = MPICommunicator(topology='two-level', two_level_algorithm=algorithm,
                                  two_level_piece_bytes=PIECE_BYTES)
            try:
                out['algorithms'][algorithm] = check(two, flat, k)
                out['overflow'] = check_overflow(two, k, hosts)
            finally:
                two.close()
    finally:
        flat.close()
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(json.dumps(out))
    return 0


if __name__ == '__main__':
    sys.exit(main())
