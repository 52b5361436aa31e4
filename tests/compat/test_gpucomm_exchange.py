"""BSP_Exchanger inside Theano-MPI's worker given a real gpucomm (way #3), against fakes.

The fakes are test_nccl.py's pygpu ``GpuComm`` and ``GpuArray``; the
2-rank test (tests/mpi/run_gpucomm.py) uses a GpuComm whose all_reduce
really sums over MPI ranks, so its numbers are compared with the host
path's on the same inputs.
"""
import types

import numpy as np
import pytest

from support.fakes import FakeGpuArray, FakeGpuComm
from support.procs import run_mpi_json
from theanompi_ext.collective.gpucomm_host import GpuCommExchange
from theanompi_ext.collective.mpi import MPICommunicator
from theanompi_ext.theanompi_compat.exchanger import exchange_communicator


class ReadableGpuArray(FakeGpuArray):
    def read(self, out):
        out[...] = self.host


CTX = types.SimpleNamespace(kind=b'cuda')


def test_gpucomm_path_equals_host_path_on_two_ranks():
    out = run_mpi_json(2, 'run_gpucomm.py', timeout=120)
    # Every bucket through gpucomm.all_reduce(dev, '+', dev), one device copy each.
    assert out['gpucomm_calls'] == [[True, '+', 300], [True, '+', 450], [True, '+', 250]]
    assert out['copies'] == [300, 450, 250] and out['equal_to_host'] is True


def test_exchange_communicator_uses_the_gpucomm():
    from mpi4py import MPI
    world = MPI.COMM_WORLD                    # one rank in this process
    host = exchange_communicator(world)
    assert isinstance(host, MPICommunicator)  # gpucomm None: as before, host MPI
    host.close()
    with pytest.raises(ValueError, match='given a gpucomm but ctx=None'):
        exchange_communicator(world, FakeGpuComm(count=1), None)
    gpucomm = FakeGpuComm(count=1)
    copies = []

    def to_device(a):
        copies.append(a.copy())
        return ReadableGpuArray(a)
    comm = exchange_communicator(world, gpucomm, CTX, to_device)
    assert isinstance(comm, GpuCommExchange) and (comm.rank, comm.size) == (0, 1)
    # A device bucket: summed in place through gpucomm, no copy.
    dev = ReadableGpuArray(np.arange(4, dtype=np.float32))
    assert comm.start_allreduce(dev, 'bucket0').wait() is dev
    assert gpucomm.calls[-1] == (dev, '+', dev) and not copies
    # A host bucket (the contract stepper's gradient): through a device copy, read back.
    host_bucket = np.array([1.5, -2.0, 3.25], np.float32)
    h = comm.start_allreduce(host_bucket, 'bucket1')
    src, op, dest = gpucomm.calls[-1]
    assert src is dest and op == '+' and src is not host_bucket
    np.testing.assert_array_equal(copies[-1], [1.5, -2.0, 3.25])
    src.host[...] = [10, 20, 30]              # what NCCL left in the device copy
    assert h.wait() is host_bucket and h.done()
    np.testing.assert_array_equal(host_bucket, [10, 20, 30])
    # Small host objects stay on MPI: gpucomm is not called for them.
    n_calls = len(gpucomm.calls)
    stats = np.array([1.0, 2.0], np.float32)
    comm.allreduce(stats, label='finite')
    assert len(gpucomm.calls) == n_calls and comm.allgather(7) == [7]
    comm.barrier()
    assert 'pygpu-nccl rank 0/1' in comm.describe()
    with pytest.raises(ValueError, match='gpucomm is rank 0 of 2 but the MPI comm is rank 0 of 1'):
        exchange_communicator(world, FakeGpuComm(count=2), CTX, to_device)
    comm.close()
