"""Theano-MPI's gpucomm path of BSP_Exchanger's communicator, over real MPI ranks.

usage: run_gpucomm.py   (2 or more ranks)

The GpuComm is a fake with pygpu's documented API whose ``all_reduce``
really sums over the ranks (an MPI Allreduce of the fake device arrays'
host memory), so the numbers of the gpucomm path can be compared with the
host MPI path on the same inputs: rank r's flat gradient ``grad(r)``
exchanged bucket by bucket by the kn-sum exchanger, once through
``exchange_communicator(comm, gpucomm, ctx)`` and once through
``exchange_communicator(comm)``; both must equal the numpy sum over ranks.
Rank 0 prints one JSON line; a failed check raises (exit != 0).
"""
import json
import types

import numpy as np
from mpi4py import MPI

from theanompi_ext.exchange.knsum import KnSumExchanger
from theanompi_ext.collective.gpucomm_host import GpuCommExchange
from theanompi_ext.theanompi_compat.exchanger import exchange_communicator


class FakeDeviceArray(object):
    """pygpu GpuArray's attributes; the memory is a host array."""

    def __init__(self, values, ctx):
        self.host = np.array(values, np.float32)
        self.gpudata, self.size, self.dtype = id(self.host), self.host.size, self.host.dtype
        self.flags = types.SimpleNamespace(c_contiguous=True)
        self.context = ctx

    def read(self, out):
        out[...] = self.host


class MPIGpuComm(object):
    """pygpu.collectives.GpuComm's API, summing over the MPI ranks."""

    def __init__(self, comm):
        self.comm, self.count, self.rank = comm, comm.Get_size(), comm.Get_rank()
        self.calls = []

    def all_reduce(self, src, op, dest=None):
        self.calls.append((src is dest, op, src.size))
        self.comm.Allreduce(src.host.copy(), dest.host, op={'+': MPI.SUM}[op])
        return dest


def grad(r, n=1000):
    i = np.arange(n)
    return ((r + 1) * np.sin(i * 0.37) - 0.25 * r * (i % 7)).astype(np.float32)


def main():
    world = MPI.COMM_WORLD
    k, rank = world.Get_size(), world.Get_rank()
    bounds = [(0, 300), (300, 750), (750, 1000)]
    plan = [types.SimpleNamespace(index=i, start=a, stop=b, last=i + 1)
            for i, (a, b) in enumerate(bounds)]
    ctx = types.SimpleNamespace(kind=b'cuda')
    gpucomm = MPIGpuComm(world)
    copies = []

    def to_device(a):
        copies.append(a.size)
        return FakeDeviceArray(a, ctx)

    results = {}
    for path, comm in (('gpucomm', exchange_communicator(world, gpucomm, ctx, to_device)),
                       ('host', exchange_communicator(world))):
        assert isinstance(comm, GpuCommExchange) == (path == 'gpucomm'), comm
        g = grad(rank)
        KnSumExchanger(comm, plan, 1000).reduce(g)
        stats = np.array([rank + 1.0], np.float32)
        comm.allreduce(stats)                     # host MPI on both paths
        assert stats[0] == k * (k + 1) / 2, stats
        results[path] = g
        comm.close()
    want = np.sum([grad(r) for r in range(k)], axis=0)
    np.testing.assert_allclose(results['gpucomm'], want, rtol=1e-6, atol=1e-6)
    assert np.array_equal(results['gpucomm'], results['host'])
    assert gpucomm.calls == [(True, '+', b - a) for a, b in bounds], gpucomm.calls
    assert copies == [b - a for a, b in bounds], copies
    if rank == 0:
        print(json.dumps({'ranks': k, 'gpucomm_calls': gpucomm.calls, 'copies': copies,
                          'equal_to_host': True}))


if __name__ == '__main__':
    main()
