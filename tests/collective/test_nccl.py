"""NCCL / pygpu backends and exch_strategy mapping, on a machine without a GPU.

What needs no GPU is tested for real: loading libnccl from the
nvidia-nccl-cu12 wheel and reading its version, unique ids, error
strings, the error paths. The stream/event choreography of
NCCLCommunicator is tested against a fake CuPy and a fake library that
record every call. The real allreduce test runs only where a CUDA device
is present (scripts/device_nccl_check.py is the fuller GPU check).
"""
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest

from theanompi_ext.collective import nccl, nccl_lib, nccl_probe
from theanompi_ext.theanompi_compat import strategy
from theanompi_ext.collective.nccl import NCCLCommunicator
from theanompi_ext.collective.nccl_buffers import (device_buffer, device_pointer,
                                                   float32_device_buffer, is_device_array)
from theanompi_ext.collective.nccl_checks import check_sizes, check_one_rank_per_gpu
from theanompi_ext.collective.nccl_probe import probe
from theanompi_ext.collective.nccl_lib import NCCLUnavailable, NCCLError, ENV_LIB
from theanompi_ext.collective.pygpu_nccl import PygpuNCCLCommunicator, make_gpucomm
from theanompi_ext.collective.registry import create_communicator, available_backends

from support.fakes import (FakeCupyArray, FakeGpuArray, FakeGpuComm, FakeLib, FakeMPIComm,
                           OldFakeGpuComm, fake_cupy, make_comm, other_gpu as _other_gpu)
from support.paths import ROOT, TESTS
from support.procs import mpiexec as find_mpiexec


# -- the library, for real where the wheel is installed ---------------------------

def _wheel_lib(monkeypatch):
    monkeypatch.delenv(ENV_LIB, raising=False)
    if nccl_lib.wheel_library_path() is None:
        pytest.skip('no NCCL wheel (nvidia-nccl-cu12/cu13) installed')
    return nccl_lib.load_library()


def test_library_loads_from_wheel_and_reads_version(monkeypatch):
    lib = _wheel_lib(monkeypatch)
    assert lib.source == 'wheel'
    assert lib.path.endswith('nvidia/nccl/lib/libnccl.so.2')
    major, minor, patch = lib.version
    assert major == 2 and minor >= 16
    # The version NCCL reports is the wheel's version (2.28.9 -> 2.28.9).
    name, version = nccl_lib.installed_wheel()
    assert name in nccl_lib.NCCL_WHEELS
    assert version == importlib.metadata.version(name)
    assert version.startswith(lib.version_string())


def test_unique_id_and_error_strings_without_gpu(monkeypatch):
    lib = _wheel_lib(monkeypatch)
    a, b = lib.get_unique_id(), lib.get_unique_id()
    assert len(a) == 128 and a != b
    assert lib.error_string(0) == 'no error'
    assert 'invalid usage' in lib.error_string(5)
    with pytest.raises(NCCLError, match=r'ncclFoo failed: invalid argument.*ncclInvalidArgument'):
        lib.check('ncclFoo', 4)
    with pytest.raises(ValueError, match='128 bytes'):
        lib.comm_init_rank(1, b'short', 0)


def test_decode_version():
    assert nccl_lib.decode_version(22809) == (2, 28, 9)
    assert nccl_lib.decode_version(21903) == (2, 19, 3)
    assert nccl_lib.decode_version(2708) == (2, 7, 8)     # pre-2.9 encoding


# -- error paths --------------------------------------------------------------------

def test_env_path_that_does_not_exist(monkeypatch):
    monkeypatch.setenv(ENV_LIB, '/nonexistent/libnccl.so.2')
    with pytest.raises(NCCLUnavailable, match=r'/nonexistent/libnccl\.so\.2 does not exist.*'
                                              r'nvidia-nccl-cu12.*nvidia-nccl-cu13'):
        nccl_lib.load_library()
    ok, why = probe()
    assert not ok and '/nonexistent/libnccl.so.2' in why


def test_env_path_that_is_not_a_library(monkeypatch, tmp_path):
    bogus = tmp_path / 'libnccl.so.2'
    bogus.write_text('not an ELF file')
    monkeypatch.setenv(ENV_LIB, str(bogus))
    with pytest.raises(NCCLUnavailable, match='cannot load NCCL from'):
        nccl_lib.load_library()


def _no_library_anywhere(monkeypatch):
    monkeypatch.delenv(ENV_LIB, raising=False)
    monkeypatch.setattr(nccl_lib, 'wheel_library_path', lambda: None)
    monkeypatch.setattr(nccl_lib, 'system_library_path', lambda: None)


def test_no_library_anywhere(monkeypatch):
    _no_library_anywhere(monkeypatch)
    with pytest.raises(NCCLUnavailable, match=r'libnccl not installed.*pip install theanompi_ext\[gpu\]'):
        nccl_lib.load_library()
    assert probe() == (False, 'libnccl not installed (pip install theanompi_ext[gpu], '
                              'or [gpu-cu13] for CUDA 13)')
    with pytest.raises(NCCLUnavailable, match=r'rank 0: NCCLUnavailable: libnccl not installed'):
        NCCLCommunicator(comm=FakeMPIComm(), cupy=fake_cupy())


def test_probe_never_raises(monkeypatch):
    def boom():
        raise ZeroDivisionError('unexpected')
    monkeypatch.setattr(nccl_probe, 'load_library', boom)
    ok, why = probe()
    assert not ok and 'ZeroDivisionError' in why


def test_probe_no_device_with_fake_cupy(monkeypatch):
    monkeypatch.setattr(nccl_probe, 'load_library', lambda: FakeLib())
    ok, why = probe(_cupy=fake_cupy(ndev=0))
    assert not ok
    assert why.startswith('NCCL 2.28.9 loaded but no CUDA device')
    assert probe(_cupy=fake_cupy(ndev=2))[0]


def test_no_device_with_real_cupy():
    cupy = pytest.importorskip('cupy', reason='CuPy not installed')
    if probe()[0]:
        pytest.skip('a CUDA device is present; the no-device path cannot be shown here')
    with pytest.raises(NCCLUnavailable, match='no CUDA device visible'):
        NCCLCommunicator(comm=FakeMPIComm(), lib=FakeLib(), cupy=cupy)


def test_no_device_with_fake_cupy():
    with pytest.raises(NCCLUnavailable, match=r'1 of 1 rank.*no CUDA device visible.*cudaErrorNoDevice'):
        NCCLCommunicator(comm=FakeMPIComm(), lib=FakeLib(), cupy=fake_cupy(ndev=0))


def test_failure_on_another_rank_is_raised_everywhere():
    peers = lambda obj: [('NCCLUnavailable: no CUDA device visible', ('n2', None))]
    with pytest.raises(NCCLUnavailable, match=r'1 of 2 rank.*rank 1: NCCLUnavailable: no CUDA device'):
        make_comm(size=2, peers=peers)


def test_two_ranks_on_one_gpu_refused():
    peers = lambda obj: [obj]    # rank 1 reports the same host and the same PCI bus id
    with pytest.raises(RuntimeError, match=r'one rank per GPU.*ranks 0,1 on'):
        make_comm(size=2, peers=peers)


def test_backend_skipped_without_gpu():
    ok, why = probe()
    if not ok:
        pytest.skip('NCCL backend unavailable here: %s' % why)
    # With a GPU, probe's reason names the version and the device count.
    assert 'CUDA device' in why


# -- device buffers ------------------------------------------------------------------

def test_numpy_array_is_refused_naming_the_type():
    with pytest.raises(TypeError, match=r'got numpy\.ndarray in host memory.*"mpi" backend'):
        device_pointer(np.zeros(4, np.float32))
    with pytest.raises(TypeError, match=r'got list'):
        device_buffer([1.0, 2.0])
    comm, _, _, _ = make_comm()
    with pytest.raises(TypeError, match='numpy.ndarray'):
        comm.start_allreduce(np.zeros(4, np.float32))
    assert not is_device_array(np.zeros(3)) and not is_device_array(None)


def test_pointer_contracts():
    class Pygpu(object):
        gpudata, offset, size, dtype = 0x7000, 64, 10, np.dtype('float32')
        flags = types.SimpleNamespace(c_contiguous=True)
        context = types.SimpleNamespace(kind=b'cuda')

    info = device_buffer(Pygpu())
    # pygpu >= 0.6.9: gpudata already includes the view's offset
    assert (info.kind, info.ptr, info.count) == ('pygpu', 0x7000, 10)
    assert is_device_array(Pygpu())

    class OldPygpu(Pygpu):
        flags = {'C_CONTIGUOUS': False}      # pygpu < 0.7 returned a dict
    assert not device_buffer(OldPygpu()).contiguous

    class OpenCL(Pygpu):
        context = types.SimpleNamespace(kind=b'opencl')
    with pytest.raises(TypeError, match='opencl'):
        device_buffer(OpenCL())
    assert not is_device_array(OpenCL())

    info = device_buffer(FakeCupyArray(n=5, ptr=0xB000))
    assert (info.kind, info.ptr, info.count, info.device) == ('cupy', 0xB000, 5, 0)

    class CAI(object):
        def __init__(self, strides=None, stream=None, readonly=False, typestr='<f4'):
            self.__cuda_array_interface__ = {
                'shape': (3, 4), 'typestr': typestr, 'data': (0xC000, readonly),
                'strides': strides, 'version': 3, 'stream': stream}

    info = device_buffer(CAI(stream=7))
    assert (info.kind, info.ptr, info.count, info.stream) == ('cai', 0xC000, 12, 7)
    assert device_buffer(CAI(strides=(16, 4))).contiguous
    assert all(is_device_array(x) for x in (Pygpu(), FakeCupyArray(), CAI()))
    with pytest.raises(ValueError, match='C-contiguous'):
        float32_device_buffer(CAI(strides=(4, 12)))
    with pytest.raises(ValueError, match='read-only'):
        float32_device_buffer(CAI(readonly=True))
    with pytest.raises(TypeError, match='needs float32, got float64'):
        float32_device_buffer(CAI(typestr='<f8'))


# -- size checks -------------------------------------------------------------------

def test_check_sizes_pure():
    same = [[('b0', 10), ('b1', 20)]] * 3
    check_sizes(same)
    with pytest.raises(ValueError, match=r"allreduce #1: rank 0 has 'b1' \(20 float32\), rank 2 has 'b1' \(21 float32\)"):
        check_sizes([[('b0', 10), ('b1', 20)], [('b0', 10), ('b1', 20)], [('b0', 10), ('b1', 21)]])
    with pytest.raises(ValueError, match=r'rank 0 started 2 buffer\(s\), rank 1 started 1'):
        check_sizes([[('b0', 10), ('b1', 20)], [('b0', 10)]])
    with pytest.raises(ValueError, match='same bucket plan'):
        check_sizes([[('b0', 10)], [('b1', 10)]])


def test_check_one_rank_per_gpu_pure():
    check_one_rank_per_gpu([('a', '0:1'), ('a', '0:2'), ('b', '0:1'), ('b', None), ('b', None)])
    with pytest.raises(RuntimeError, match=r'ranks 1,2 on a GPU 0:2'):
        check_one_rank_per_gpu([('a', '0:1'), ('a', '0:2'), ('a', '0:2')])


def test_mismatched_sizes_detected_by_communicator():
    def peers(obj):
        if isinstance(obj, tuple) and obj[0] == 'grad':
            return [('grad', obj[1] + 1)]     # rank 1 has one float more
        return _other_gpu(obj)
    comm, _, lib, _ = make_comm(size=2, peers=peers)
    with pytest.raises(ValueError, match=r"rank 0 has 'grad' \(8 float32\), rank 1 has 'grad' \(9 float32\)"):
        comm.start_allreduce(FakeCupyArray(8), 'grad')
    assert not [c for c in lib.log if c[0] == 'allreduce']   # NCCL never saw it


def test_size_check_modes_cost():
    comm, _, _, mpi = make_comm(size=2, peers=_other_gpu)
    n0 = len(mpi.gathers)
    for _ in range(3):
        comm.start_allreduce(FakeCupyArray(8), 'b0')
    assert len(mpi.gathers) - n0 == 1        # 'first': one allgather per name
    comm.start_allreduce(FakeCupyArray(8))
    comm.start_allreduce(FakeCupyArray(8))
    assert len(mpi.gathers) - n0 == 3        # unnamed: every time
    comm.check_plan([('b1', 4), ('b2', 6)])
    comm.start_allreduce(FakeCupyArray(4), 'b1')
    assert len(mpi.gathers) - n0 == 4        # the plan's one allgather, none after

    always, _, _, mpi = make_comm(size=2, peers=_other_gpu, size_check='always')
    n0 = len(mpi.gathers)
    always.start_allreduce(FakeCupyArray(8), 'b0')
    always.start_allreduce(FakeCupyArray(8), 'b0')
    assert len(mpi.gathers) - n0 == 2
    with pytest.raises(ValueError, match='size_check'):
        make_comm(size_check='sometimes')


# -- stream choreography (fake CuPy + fake library) ---------------------------------------

def test_start_allreduce_stream_choreography():
    comm, cuda, lib, _ = make_comm()
    assert comm.device == 0 and comm.stream.non_blocking and comm.stream.priority == -5
    assert ('init', 1, 128, 0) in lib.log
    cuda.log.clear()
    buf = FakeCupyArray(n=16, ptr=0xD000)
    h = comm.start_allreduce(buf, 'bucket0')
    compute, comm_stream = cuda.current.ptr, comm.stream.ptr
    (rec_ready, wait_ready, rec_done) = cuda.log
    assert rec_ready[0] == 'record' and rec_ready[2] == compute        # ready on compute stream
    assert wait_ready == ('wait', comm_stream, rec_ready[1])            # comm waits for ready
    assert rec_done[0] == 'record' and rec_done[2] == comm_stream       # done on comm stream
    assert lib.log[-1] == ('allreduce', 0xD000, 0xD000, 16, nccl_lib.NCCL_FLOAT32,
                           nccl_lib.NCCL_SUM, comm_stream)              # in place, on comm stream
    assert not h.done()
    cuda.log.clear()
    assert h.wait() is buf                                              # stream wait, host free
    assert cuda.log == [('wait', compute, rec_done[1])]
    cuda.log.clear()
    h.wait(sync=True)                                                   # host synchronise
    assert cuda.log == [('event_sync', rec_done[1])] and h.done() and h.host_synced


def test_stream_priority_without_range_query():
    """CuPy 14 has no deviceGetStreamPriorityRange: ask beyond any range, CUDA clamps."""
    cp = fake_cupy()
    del cp.cuda.runtime.deviceGetStreamPriorityRange
    assert nccl.greatest_priority(cp) == nccl.PRIORITY_BEYOND_RANGE < -100
    comm = NCCLCommunicator(comm=FakeMPIComm(), lib=FakeLib(), cupy=cp)
    assert comm.stream.non_blocking and comm.stream.priority == nccl.PRIORITY_BEYOND_RANGE


def test_stream_without_priority_argument():
    """A CuPy whose Stream takes no priority still gets a non-blocking stream."""
    cp = fake_cupy()
    base = cp.cuda.Stream

    class OldStream(base):
        def __init__(self, non_blocking=False, ptr=None):
            base.__init__(self, non_blocking=non_blocking, ptr=ptr)
    cp.cuda.Stream = OldStream
    comm = NCCLCommunicator(comm=FakeMPIComm(), lib=FakeLib(), cupy=cp)
    assert isinstance(comm.stream, OldStream)
    assert comm.stream.non_blocking and comm.stream.priority is None


def test_allreduce_blocks_host_and_reports_async_errors():
    comm, cuda, lib, _ = make_comm()
    cuda.log.clear()
    buf = FakeCupyArray()
    assert comm.allreduce(buf) is buf
    assert cuda.log[-1][0] == 'event_sync'
    lib.async_error = 6
    with pytest.raises(NCCLError, match='remote process exited'):
        comm.allreduce(buf)


def test_wait_timeout_and_options():
    comm, cuda, _, _ = make_comm(sync_wait=True, compute_stream=0x99)
    h = comm.start_allreduce(FakeCupyArray(), 'x')
    assert cuda.log[-3][2] == 0x99            # ready recorded on the given compute stream
    with pytest.raises(TimeoutError, match="'x' did not finish"):
        h.wait(timeout=0.01)
    h.wait()                                  # sync_wait=True: host synchronise
    assert h.done()
    with pytest.raises(ValueError, match='on cuda:1, the communicator on cuda:0'):
        comm.start_allreduce(FakeCupyArray(device=1))


def test_device_choice_close_abort_describe():
    comm, cuda, lib, mpi = make_comm(ndev=4, device=3)
    assert comm.device == 3 and ('use', 3) in cuda.log
    assert 'nccl rank 0/1 (NCCL 2.28.9 from fake, cuda:3, comm stream priority -5' in comm.describe()
    with pytest.raises(NCCLUnavailable, match='rank 0: ValueError: device 2 out of range'):
        make_comm(ndev=2, device=2)
    comm.close()
    comm.close()                               # idempotent
    assert lib.log.count(('destroy',)) == 1
    with pytest.raises(RuntimeError, match='closed'):
        comm.start_allreduce(FakeCupyArray())
    other, _, lib2, mpi2 = make_comm()
    other.abort(3)
    assert ('abort',) in lib2.log and mpi2.aborted == 3


def test_registry_and_strategy_build_nccl():
    comm = create_communicator('nccl', comm=FakeMPIComm(), lib=FakeLib(), cupy=fake_cupy())
    assert comm.name == 'nccl'
    comm = strategy.create_for_strategy('nccl32', comm=FakeMPIComm(), lib=FakeLib(),
                                        cupy=fake_cupy())
    assert isinstance(comm, NCCLCommunicator)
    names = [row[0] for row in available_backends()]
    assert 'nccl' in names


TWO_RANKS = textwrap.dedent("""
    import sys
    sys.path[:0] = [%(tests)r, %(root)r]     # the checkout, installed or not (the GPU machine)
    from mpi4py import MPI
    from support.fakes import FakeLib, fake_cupy, FakeCupyArray
    from theanompi_ext.collective.nccl import NCCLCommunicator
    from theanompi_ext.collective.nccl_lib import NCCLUnavailable
    w = MPI.COMM_WORLD
    r = w.Get_rank()
    log = open('%(out)s.%%d' %% r, 'w')      # one file per rank: stdout lines interleave
    def print(*a):
        log.write(' '.join(map(str, a)) + '\\n')
        log.flush()
    lib = FakeLib()
    c = NCCLCommunicator(comm=w, lib=lib, cupy=fake_cupy(ndev=2))
    assert c.device == r, c.device                      # local rank picks the GPU
    assert lib.log[0] == ('init', 2, 128, r), lib.log   # one id, every rank
    c.start_allreduce(FakeCupyArray(8, device=r), 'a')
    try:
        c.start_allreduce(FakeCupyArray(8 + r, device=r), 'g')
        print('rank', r, 'size mismatch NOT detected')
    except ValueError as e:
        print('rank', r, 'size mismatch detected:', e)
    try:
        NCCLCommunicator(comm=w, lib=FakeLib(), cupy=fake_cupy(ndev=2 if r == 0 else 0))
        print('rank', r, 'device failure NOT raised')
    except NCCLUnavailable as e:
        print('rank', r, 'device failure raised:', e)
    try:
        NCCLCommunicator(comm=w, lib=FakeLib(), cupy=fake_cupy(ndev=1))
        print('rank', r, 'shared GPU NOT refused')
    except RuntimeError as e:
        print('rank', r, 'shared GPU refused:', e)
""")


def test_two_real_mpi_ranks_fail_together(tmp_path):
    """Real MPI, fake GPU: every rank raises the same error instead of some hanging."""
    mpiexec = find_mpiexec()
    if not shutil.which(mpiexec):
        pytest.skip('no mpiexec next to %s or on PATH' % sys.executable)
    script = tmp_path / 'two_ranks.py'
    script.write_text(TWO_RANKS % {'tests': TESTS, 'root': ROOT,
                                   'out': str(tmp_path / 'out')})
    try:
        # env: Python's view of it, not the C one. Once this process has
        # started MPI alone (a test above), Open MPI 4's singleton has put
        # variables in the C environment that make a child mpiexec exit 1
        # without a word (Open MPI 4.1.6 on the GPU machine; the launcher
        # always passes its env too).
        out = subprocess.run([mpiexec, '-n', '2', sys.executable, str(script)],
                             capture_output=True, text=True, timeout=120,
                             start_new_session=True, env=dict(os.environ))
    except subprocess.TimeoutExpired as exc:
        pytest.fail('2-rank NCCL init check hung:\n%s\n%s' % (exc.stdout, exc.stderr))
    assert out.returncode == 0, out.stdout + out.stderr
    for r in (0, 1):
        said = (tmp_path / ('out.%d' % r)).read_text()
        assert ("rank %d size mismatch detected: allreduce buffers differ across ranks: "
                "allreduce #0: rank 0 has 'g' (8 float32), rank 1 has 'g' (9 float32)" % r) in said
        assert ('rank %d device failure raised: NCCL backend unusable on 1 of 2 rank(s): '
                'rank 1: NCCLUnavailable: no CUDA device' % r) in said
        assert 'rank %d shared GPU refused: NCCL needs one rank per GPU, but ranks 0,1' % r in said


# -- the device check script, where no GPU is (CI) ---------------------------------------

def test_device_check_script(tmp_path):
    """scripts/device_nccl_check.py: all checks pass on a GPU; elsewhere exit 2 with the reason."""
    script = os.path.join(ROOT, 'scripts', 'device_nccl_check.py')
    report = tmp_path / 'report.json'
    env = dict(os.environ)
    env.pop('OUT', None)
    out = subprocess.run([sys.executable, script, '--json', str(report), '--timeout', '240'],
                         capture_output=True, text=True, timeout=300, env=env)
    ok, why = probe()
    said = json.loads(report.read_text())
    assert said['status'] == out.returncode, out.stdout + out.stderr
    if ok:
        assert out.returncode == 0, out.stdout + out.stderr
        assert 'RESULT all checks passed' in out.stdout
    else:
        assert out.returncode == 2, out.stdout + out.stderr
        assert 'FAIL NCCL backend cannot run here: %s' % why in out.stdout
        assert out.stdout.rstrip().endswith('RESULT NCCL unavailable')
        assert said['data']['probe'] == why


HANG = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, %(scripts)r)
    import device_nccl_check
    from theanompi_ext.collective import nccl_probe
    def probe():
        time.sleep(60)          # stands in for a hang in NCCL or MPI init
    nccl_probe.probe = probe
    device_nccl_check.main(['--timeout', '1'])
    print('NOT ENDED')
""")


def test_device_check_script_ends_a_hang(tmp_path):
    """The watchdog ends the check (exit 1, stacks dumped) when init hangs."""
    scripts = os.path.join(ROOT, 'scripts')
    wrapper = tmp_path / 'hang.py'
    wrapper.write_text(HANG % {'scripts': scripts})
    out = subprocess.run([sys.executable, str(wrapper)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 1, out.stdout + out.stderr
    assert 'NOT ENDED' not in out.stdout
    assert 'Timeout (0:00:01)!' in out.stderr and 'in probe' in out.stderr


# -- exch_strategy mapping and automatic choice ------------------------------------------

def test_strategy_mapping():
    assert strategy.backend_for_strategy('ar') == 'mpi'
    assert strategy.backend_for_strategy('nccl32') == 'nccl'
    assert strategy.backend_for_strategy('NCCL32') == 'nccl'
    with pytest.raises(NotImplementedError, match=r"'nccl16'.*fp16.*not implemented.*'nccl32'"):
        strategy.backend_for_strategy('nccl16')
    with pytest.raises(NotImplementedError, match='asa32'):
        strategy.backend_for_strategy('asa32')
    with pytest.raises(ValueError, match=r"unknown exch_strategy 'copper'.*\['ar', 'nccl32'\]"):
        strategy.backend_for_strategy('copper')


def test_choose_backend():
    yes = lambda: (True, 'NCCL 2.28.9, 8 CUDA device(s)')
    no = lambda: (False, 'libnccl not installed (pip install nvidia-nccl-cu12, or theanompi_ext[gpu])')
    assert strategy.choose_backend(None, probe=yes) == 'mpi'
    assert strategy.choose_backend(np.zeros(3, np.float32), probe=yes) == 'mpi'
    assert strategy.choose_backend(FakeCupyArray(), probe=yes) == 'nccl'
    with pytest.raises(NCCLUnavailable, match=r'FakeCupyArray live on a GPU.*libnccl not installed.*pip install theanompi_ext\[gpu\]'):
        strategy.choose_backend(FakeCupyArray(), probe=no)
    # Default probe: host buffers never need it.
    assert strategy.choose_backend(np.zeros(3, np.float32)) == 'mpi'


def test_pygpu_backend_with_fake_gpucomm():
    gpucomm = FakeGpuComm(count=2)
    comm = PygpuNCCLCommunicator(gpucomm, FakeMPIComm(size=2))
    assert (comm.rank, comm.size) == (0, 2)
    buf = FakeGpuArray(np.arange(4, dtype=np.float32))
    h = comm.start_allreduce(buf, 'b0')
    src, op, dest = gpucomm.calls[-1]
    assert src is buf and dest is buf and op == '+'          # in place, '+'
    assert h.done() and h.wait() is buf and buf.synced == 0   # stream order, host free
    np.testing.assert_array_equal(buf.host, [0, 2, 4, 6])
    comm.allreduce(buf)
    assert buf.synced == 1
    np.testing.assert_array_equal(buf.host, [0, 4, 8, 12])
    with pytest.raises(TypeError, match='float32, got float64'):
        comm.start_allreduce(FakeGpuArray(np.zeros(3)))
    with pytest.raises(TypeError, match=r'numpy\.ndarray'):
        comm.start_allreduce(np.zeros(3, np.float32))
    with pytest.raises(TypeError, match='needs a pygpu GpuArray, got FakeCupyArray'):
        comm.start_allreduce(FakeCupyArray())
    with pytest.raises(ValueError, match='C-contiguous'):
        comm.start_allreduce(FakeGpuArray(np.zeros(3, np.float32), contiguous=False))
    assert 'pygpu-nccl rank 0/2' in comm.describe()


def test_pygpu_backend_size_check_and_rank_mismatch():
    mpi = FakeMPIComm(size=2, peers=lambda obj: [('b0', 5)])
    comm = PygpuNCCLCommunicator(OldFakeGpuComm(count=2), mpi)
    with pytest.raises(ValueError, match=r"rank 1 has 'b0' \(5 float32\)"):
        comm.start_allreduce(FakeGpuArray(np.zeros(4, np.float32)), 'b0')
    with pytest.raises(ValueError, match='gpucomm is rank 0 of 4 but the MPI comm is rank 0 of 2'):
        PygpuNCCLCommunicator(FakeGpuComm(count=4), FakeMPIComm(size=2))


def test_make_gpucomm_with_fake_pygpu(monkeypatch):
    made = {}

    class CliqueId(object):
        def __init__(self, context=None):
            self.context = context
            self.comm_id = b'\x01' * 128

    class GpuComm(object):
        def __init__(self, cid, ndev, rank):
            made.update(cid=cid, ndev=ndev, rank=rank)

    collectives = types.SimpleNamespace(GpuCommCliqueId=CliqueId, GpuComm=GpuComm)
    monkeypatch.setitem(sys.modules, 'pygpu', types.SimpleNamespace(collectives=collectives))
    monkeypatch.setitem(sys.modules, 'pygpu.collectives', collectives)
    make_gpucomm('ctx', FakeMPIComm(size=1))
    assert made['ndev'] == 1 and made['rank'] == 0
    # pygpu's setter takes a writable buffer (unsigned char[:]): bytearray, not bytes.
    assert isinstance(made['cid'].comm_id, bytearray) and made['cid'].context == 'ctx'


# -- the real thing, only with a GPU ------------------------------------------------------

_PROBE = probe()     # once, at collection: it imports CuPy


@pytest.mark.skipif(not _PROBE[0], reason='NCCL backend unavailable here: %s' % _PROBE[1])
def test_real_nccl_allreduce_on_gpu():
    import cupy as cp
    comm = NCCLCommunicator()
    try:
        compute = cp.cuda.Stream(non_blocking=True)
        with compute:
            x = cp.arange(1 << 20, dtype=cp.float32)
            h = comm.start_allreduce(x, 'x')
            h.wait()
            x *= 2
        compute.synchronize()
        expect = np.arange(1 << 20, dtype=np.float32) * comm.size * 2
        np.testing.assert_allclose(cp.asnumpy(x), expect)
    finally:
        comm.close()


@pytest.mark.skipif(not _PROBE[0], reason='NCCL backend unavailable here: %s' % _PROBE[1])
@pytest.mark.parametrize('wire', ['float16', 'bfloat16'])
def test_real_16_bit_wire_on_gpu_rounds_as_the_host_wire_does(wire):
    """CuPy's casts around NCCL's 16-bit sum give the host wire's bits (NaN,
    inf, float16 overflow and subnormals included); one rank: exact."""
    import cupy as cp
    from theanompi_ext.collective import wire as W
    comm = NCCLCommunicator()
    try:
        rng = np.random.RandomState(4)
        x = (rng.standard_normal(1 << 18) * 10.0 ** rng.randint(-7, 5, 1 << 18)).astype(np.float32)
        x[:5] = [np.nan, np.inf, -np.inf, 7e4, 65504.0]
        y = cp.asarray(x)
        comm.start_allreduce(y, 'w', wire=wire).wait(sync=True)
        want = W.decode(W.encode(x, wire), wire)
        if comm.size == 1:
            np.testing.assert_array_equal(cp.asnumpy(y), want)
        else:
            np.testing.assert_allclose(cp.asnumpy(y), want * comm.size, rtol=4e-3)
    finally:
        comm.close()
