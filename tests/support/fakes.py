"""Fakes of MPI, CuPy, the NCCL library and pygpu, shared by the collective tests.

They record every call instead of touching a GPU, so the stream/event order
and the cross-rank checks of the NCCL and pygpu backends can be asserted on
a machine without one. The rank scripts of tests that run them under real
MPI import them the same way (tests/ on ``sys.path``).
"""
import itertools
import types

import numpy as np

from theanompi_ext.collective.nccl import NCCLCommunicator


class FakeMPIComm(object):
    """mpi4py-like small-object API; other ranks' contributions come from ``peers``.

    ``peers(obj)`` returns the list of what ranks 1.. contribute to an
    allgather in which this rank (rank 0) contributes ``obj``.
    """

    def __init__(self, size=1, peers=None):
        self.size = size
        self.peers = peers or (lambda obj: [obj] * (size - 1))
        self.gathers = []
        self.aborted = None

    def Get_rank(self):
        return 0

    def Get_size(self):
        return self.size

    def allgather(self, obj):
        self.gathers.append(obj)
        return [obj] + list(self.peers(obj))

    def bcast(self, obj, root=0):
        return obj

    def Barrier(self):
        pass

    def Dup(self):
        return self      # the bounded barrier's communicator (collective/base.py)

    def Abort(self, code=1):
        self.aborted = code


class FakeCuda(object):
    """The slice of ``cupy.cuda`` the backend uses, logging every stream/event call."""

    def __init__(self, ndev=1):
        self.log = []
        self.ids = itertools.count(1)
        self.ndev = ndev
        cuda = self
        self.current = None

        class Stream(object):
            def __init__(self, non_blocking=False, priority=None, ptr=None):
                self.ptr = ptr if ptr is not None else 0x5000 + next(cuda.ids)
                self.non_blocking, self.priority = non_blocking, priority

            def wait_event(self, ev):
                cuda.log.append(('wait', self.ptr, ev.id))

            def synchronize(self):
                cuda.log.append(('stream_sync', self.ptr))

        class Event(object):
            def __init__(self, disable_timing=False):
                self.id = next(cuda.ids)
                self.done = False

            def record(self, stream=None):
                cuda.log.append(('record', self.id, stream.ptr))

            def synchronize(self):
                cuda.log.append(('event_sync', self.id))
                self.done = True

        class Device(object):
            def __init__(self, i=0):
                self.id = i
                self.pci_bus_id = '0000:%02x:00.0' % (i + 1)

            def use(self):
                cuda.log.append(('use', self.id))

            def __enter__(self):
                return self

            def __exit__(self, *a):
                return False

        def get_device_count():
            if cuda.ndev == 0:
                raise RuntimeError('cudaErrorNoDevice: no CUDA-capable device is detected')
            return cuda.ndev

        self.Stream, self.Event, self.Device = Stream, Event, Device
        self.ExternalStream = lambda ptr: Stream(ptr=ptr)
        self.runtime = types.SimpleNamespace(getDeviceCount=get_device_count,
                                             deviceGetStreamPriorityRange=lambda: (0, -5))
        self.current = Stream(ptr=0x1)   # the compute stream

    def get_current_stream(self):
        return self.current


def fake_cupy(ndev=1):
    """A stand-in ``cupy`` module with ``ndev`` devices (see :class:`FakeCuda`)."""
    return types.SimpleNamespace(cuda=FakeCuda(ndev))


class FakeLib(object):
    """NCCLLibrary's interface, recording calls instead of touching a GPU."""
    version = (2, 28, 9)
    source = 'fake'
    path = '/fake/libnccl.so.2'

    def __init__(self, log=None, async_error=0):
        self.log = log if log is not None else []
        self.async_error = async_error

    def version_string(self):
        return '2.28.9'

    def get_unique_id(self):
        return b'\x07' * 128

    def comm_init_rank(self, n, uid, rank):
        self.log.append(('init', n, len(uid), rank))
        self.n, self.rank = n, rank
        return 'comm'

    def comm_count(self, comm):
        return self.n

    def comm_user_rank(self, comm):
        return self.rank

    def all_reduce(self, send, recv, count, dtype, op, comm, stream):
        self.log.append(('allreduce', send, recv, count, dtype, op, stream))

    def comm_async_error(self, comm):
        return self.async_error

    def error_string(self, code):
        return 'remote process exited or there was a network error'

    def comm_destroy(self, comm):
        self.log.append(('destroy',))

    def comm_abort(self, comm):
        self.log.append(('abort',))


class FakeCupyArray(object):
    """Mirrors what the backend reads from a cupy.ndarray."""

    def __init__(self, n=8, dtype=np.float32, ptr=0xA000, contiguous=True, device=0):
        self.size = n
        self.dtype = np.dtype(dtype)
        self.data = types.SimpleNamespace(ptr=ptr)
        self.flags = types.SimpleNamespace(c_contiguous=contiguous)
        self.device = types.SimpleNamespace(id=device)


def make_comm(size=1, peers=None, ndev=1, **kw):
    """An NCCLCommunicator on the fakes; returns it, its fake CUDA, library and MPI."""
    cp, lib = fake_cupy(ndev), FakeLib()
    mpi = FakeMPIComm(size, peers)
    return NCCLCommunicator(comm=mpi, lib=lib, cupy=cp, **kw), cp.cuda, lib, mpi


def other_gpu(obj):
    """A ``peers`` for :class:`FakeMPIComm`: rank 1 gives the same answers, but on
    a GPU of its own in the init allgather."""
    if isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[1], tuple):
        return [(obj[0], ('node1', obj[1][1]))]
    return [obj]


class FakeGpuArray(object):
    """A host-backed stand-in with pygpu GpuArray's attributes."""
    _addr = itertools.count(0x10000, 0x1000)

    def __init__(self, values, contiguous=True):
        self.host = np.array(values, dtype=np.asarray(values).dtype)
        self.gpudata = next(self._addr)
        self.offset = 0
        self.size = self.host.size
        self.dtype = self.host.dtype
        self.flags = types.SimpleNamespace(c_contiguous=contiguous)
        self.context = types.SimpleNamespace(kind=b'cuda')
        self.synced = 0

    def sync(self):
        self.synced += 1


class FakeGpuComm(object):
    """pygpu.collectives.GpuComm's documented API; every rank holds the same data."""

    def __init__(self, count=2, rank=0):
        self.count, self.rank = count, rank
        self.calls = []

    def all_reduce(self, src, op, dest=None):
        if op not in ('+', 'sum', 'add'):
            raise ValueError('Invalid reduce operation')
        self.calls.append((src, op, dest))
        if dest is None:
            dest = FakeGpuArray(np.zeros_like(src.host))
        dest.host[...] = src.host * self.count
        return dest


class OldFakeGpuComm(FakeGpuComm):
    """Earlier pygpu builds: get_count()/get_rank() methods instead of properties."""

    def __init__(self, count=2, rank=0):
        FakeGpuComm.__init__(self, count, rank)
        self._c, self._r = self.__dict__.pop('count'), self.__dict__.pop('rank')

    def get_count(self):
        return self._c

    def get_rank(self):
        return self._r
