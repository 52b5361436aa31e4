"""The NCCL exchange path for device buffers, against the fakes of tests/support/fakes.py.

No GPU: CuPy's streams/events and the NCCL library are the recording
fakes of test_nccl.py (one shared log), the flat device gradient is a
fake pygpu array whose slices are views (``gpudata`` = base + offset, as
pygpu >= 0.6.9 reports it). What is checked: each bucket goes to NCCL as
its view's pointer (non-zero offsets), the stream/event order of a step,
the plan check across ranks, and how the path is chosen or refused.
"""
import functools
import os
import types

import numpy as np

import pytest

from support.fakes import FakeLib, FakeMPIComm, fake_cupy, other_gpu as _other_gpu
from theanompi_ext.collective import nccl_lib
from theanompi_ext.collective.nccl import NCCLCommunicator
from theanompi_ext.collective.pygpu_stream import context_stream
from theanompi_ext.errors import DeviceError, DeviceErrorOnRanks
from theanompi_ext.exchange.nccl_device import DeviceNCCLExchanger, cuda_ordinal, nccl_exchanger
from theanompi_ext.step.device import exchange_choice

BASE = 0x7f0000000000     # the flat gradient's device address
COMPUTE = 0xC0FFEE        # pygpu's context stream


class FakeFlatGpuArray(object):
    """A 1-d float32 pygpu GpuArray on CUDA: a slice is a view of the same memory."""

    def __init__(self, n, base=BASE, offset=0):
        self.size, self.offset, self._base = n, offset, base
        self.dtype = np.dtype(np.float32)
        self.flags = types.SimpleNamespace(c_contiguous=True)
        self.context = types.SimpleNamespace(kind=b'cuda', ptr=0xC7C7)

    @property
    def gpudata(self):
        return self._base + self.offset      # pygpu >= 0.6.9: the view's own address

    def __getitem__(self, s):
        start, stop, _ = s.indices(self.size)
        return FakeFlatGpuArray(stop - start, self._base, self.offset + 4 * start)


def buckets(*bounds):
    """Bucket plan objects: (start, stop, last parameter index) each."""
    return [types.SimpleNamespace(index=i, start=a, stop=b, last=last)
            for i, (a, b, last) in enumerate(bounds)]


def exchanger_on_fakes(plan, size=1, peers=None, wire='float32'):
    cp = fake_cupy()
    lib = FakeLib(log=cp.cuda.log)        # one log: stream calls and NCCL calls in order
    host = types.SimpleNamespace(comm=FakeMPIComm(size, peers or _other_gpu))
    ctx = types.SimpleNamespace(kind=b'cuda', ptr=0xC7C7)
    make = functools.partial(NCCLCommunicator, lib=lib, cupy=cp)
    asked = []

    def get_stream(ptr):
        asked.append(ptr)
        return COMPUTE
    import theanompi_ext.collective.pygpu_stream as ps
    real = ps.cuda_get_stream_function
    ps.cuda_get_stream_function = lambda: get_stream
    try:
        ex = nccl_exchanger(host, 'cuda0', ctx, plan, plan[-1].stop, communicator=make,
                            wire=wire)
    finally:
        ps.cuda_get_stream_function = real
    assert asked == [0xC7C7]              # the context's raw pointer
    return ex, cp.cuda, host.comm


def test_step_order_and_bucket_pointers():
    """Two chunks, three buckets at offsets 0, 10 and 25 of one flat buffer."""
    plan = buckets((0, 10, 2), (10, 25, 2), (25, 40, 4))
    ex, cuda, _ = exchanger_on_fakes(plan)
    log = cuda.log
    del log[:]
    grads = FakeFlatGpuArray(40)
    hook = ex.chunk_hook(grads)
    log.append(('chunk', 0))              # the chunk's gradient kernels, queued on COMPUTE
    hook(0, 2)
    log.append(('chunk', 1))
    hook(1, 4)
    handles = ex.finish(grads)
    log.append(('update',))
    comm_stream = ex.comm.stream.ptr
    assert ex.compute_stream.ptr == COMPUTE and comm_stream != COMPUTE
    expected, ready, done = [], {}, {}
    events = iter(e for e in log if e[0] == 'record')
    for chunk, bs in ((0, plan[:2]), (1, plan[2:])):
        expected.append(('chunk', chunk))
        for b in bs:
            r, d = next(events), next(events)
            ready[b.index], done[b.index] = r[1], d[1]
            expected += [('record', r[1], COMPUTE),                 # after the chunk, compute
                         ('wait', comm_stream, r[1]),               # comm waits (GPU side)
                         ('allreduce', BASE + 4 * b.start, BASE + 4 * b.start,
                          b.stop - b.start, nccl_lib.NCCL_FLOAT32, nccl_lib.NCCL_SUM,
                          comm_stream),                             # in place, the view's ptr
                         ('record', d[1], comm_stream)]
    expected += [('wait', COMPUTE, done[i]) for i in range(3)]      # the update waits for all
    expected.append(('update',))
    assert log == expected
    assert not any(e[0] in ('event_sync', 'stream_sync') for e in log)   # no host sync
    assert [h.name for h in handles] == ['bucket0', 'bucket1', 'bucket2']
    assert all(h.t_start is not None and not h.host_synced for h in handles)


@pytest.mark.parametrize('wire', ['float16', 'bfloat16'])
def test_a_16_bit_wire_reaches_every_bucket(wire, monkeypatch):
    """The trainer's ``wire_dtype`` is what each bucket view is started with
    (the device step used to drop it and send float32)."""
    plan = buckets((0, 10, 1), (10, 25, 2))
    ex, _, _ = exchanger_on_fakes(plan, wire=wire)
    assert ex.wire == wire
    seen = []
    real = ex.comm.start_allreduce

    def start(buf, name=None, **kw):
        seen.append((buf.gpudata, name, kw))
        return real(buf, name)            # the float32 call: the casts need a real CuPy
    monkeypatch.setattr(ex.comm, 'start_allreduce', start)
    ex.reduce(FakeFlatGpuArray(25))
    assert seen == [(BASE, 'bucket0', {'wire': wire}), (BASE + 40, 'bucket1', {'wire': wire})]


def test_drain_waits_on_the_compute_stream():
    """An error mid-step: the started buckets are waited for by the compute stream
    (the next kernels that touch the buffer), and the step can be redone."""
    plan = buckets((0, 8, 1), (8, 16, 2))
    ex, cuda, _ = exchanger_on_fakes(plan)
    grads = FakeFlatGpuArray(16)
    with pytest.raises(RuntimeError, match='chunk 1 failed'):
        with ex.settling():
            ex.start_ready(1, grads)
            del cuda.log[:]
            raise RuntimeError('chunk 1 failed')
    assert [e[:2] for e in cuda.log] == [('wait', COMPUTE)]
    ex.reduce(grads)                      # the next step starts from a clean state
    assert [e[1] for e in cuda.log if e[0] == 'allreduce'] == [BASE, BASE + 32]


def test_plan_checked_across_ranks_once():
    plan = buckets((0, 8, 1), (8, 16, 2))
    _, _, mpi = exchanger_on_fakes(plan, size=2)
    assert [('bucket0', 8), ('bucket1', 8)] in mpi.gathers
    with pytest.raises(ValueError, match=r"rank 1 has 'bucket1' \(9 float32\)"):
        exchanger_on_fakes(plan, size=2, peers=lambda obj: [
            [('bucket0', 8), ('bucket1', 9)]] if isinstance(obj, list) else _other_gpu(obj))


def test_refusals_of_the_exchanger_pieces():
    cp = fake_cupy()
    comm = NCCLCommunicator(comm=FakeMPIComm(), lib=FakeLib(), cupy=cp)
    with pytest.raises(ValueError, match='needs an NCCLCommunicator built with compute_stream='):
        DeviceNCCLExchanger(comm, buckets((0, 4, 1)), 4)
    with pytest.raises(TypeError, match='context is opencl, not CUDA'):
        context_stream(types.SimpleNamespace(kind=b'opencl', ptr=1), get_stream=lambda p: 1)
    assert context_stream(types.SimpleNamespace(kind=b'cuda', ptr=5), lambda p: None) == 0
    assert (cuda_ordinal('cuda1'), cuda_ordinal('cuda')) == (1, None)
    with pytest.raises(ValueError, match='NCCL needs a CUDA device'):
        cuda_ordinal('opencl0:0')


def test_libgpuarray_has_the_stream_extension():
    """The lookup (not the call) in this machine's libgpuarray (make gpu-deps installs it)."""
    from theanompi_ext.collective.pygpu_stream import cuda_get_stream_function, load_libgpuarray
    try:
        lib = load_libgpuarray()
    except OSError as exc:
        msg = 'libgpuarray not installed (make gpu-deps): %s' % exc
        if os.environ.get('CI'):
            pytest.fail(msg + ' [CI is set: not skipping]')   # CI installs it
        pytest.skip(msg)
    assert callable(cuda_get_stream_function(lib))


# -- choosing the path -------------------------------------------------------------

def can_run():
    return True, 'NCCL 2.28.9 from /fake (fake), 1 CUDA device(s)'


def cannot_run():
    return False, 'libnccl not installed (pip install theanompi_ext[gpu])'


class Ranks(object):
    """A host communicator whose other ranks answer ``others`` to an allgather."""

    def __init__(self, *others):
        self.size, self.others = 1 + len(others), list(others)

    def allgather(self, obj):
        return [obj] + self.others


def test_exchange_choice_and_reasons():
    assert exchange_choice('auto', 'cuda0', probe=can_run) == ('nccl', 'auto: NCCL can run on cuda0')
    assert exchange_choice('nccl', 'cuda1', probe=can_run) == ('nccl', 'requested')
    assert exchange_choice('auto', 'cuda0', probe=cannot_run) == (
        'host-staged', 'auto: libnccl not installed (pip install theanompi_ext[gpu])')
    assert exchange_choice('auto', 'opencl0:0', probe=can_run) == (
        'host-staged', 'auto: NCCL needs a CUDA device')
    assert exchange_choice('host-staged', 'cuda0', probe=can_run) == ('host-staged', 'requested')
    with pytest.raises(DeviceErrorOnRanks, match='exchange path nccl is not available on device '
                       r'cuda0: libnccl not installed \(pip install'):
        exchange_choice('nccl', 'cuda0', probe=cannot_run)
    with pytest.raises(DeviceErrorOnRanks, match='on device opencl0:0: NCCL needs a CUDA device'):
        exchange_choice('nccl', 'opencl0:0', probe=can_run)
    with pytest.raises(DeviceError, match="unknown exchange path 'rdma'"):
        exchange_choice('rdma', 'cuda0')


def test_ranks_agree_on_the_path():
    """One rank without NCCL: auto takes host-staged on every rank, nccl fails on every rank."""
    other = 'NCCL 2.28.9 loaded but no CUDA device visible to this process'
    assert exchange_choice('auto', 'cuda0', Ranks(None), probe=can_run)[0] == 'nccl'
    assert exchange_choice('auto', 'cuda0', Ranks(other), probe=can_run) == (
        'host-staged', 'auto: rank 1: ' + other)
    with pytest.raises(DeviceErrorOnRanks, match='cuda0: rank 1: NCCL 2.28.9 loaded but no CUDA'):
        exchange_choice('nccl', 'cuda0', Ranks(other), probe=can_run)
