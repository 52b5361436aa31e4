"""16-bit gradient wire (issue 18): the cast/sum math, MPI ranks, refusals."""
import json
import struct

import numpy as np
import pytest

from theanompi_ext.collective import wire as W
from theanompi_ext.collective.base import Communicator
from theanompi_ext.collective.local import LocalCommunicator
from theanompi_ext.exchange.knsum import KnSumExchanger


def bf16_reference(x):
    """Round-to-nearest-even to bfloat16, one float32 at a time in float64
    arithmetic: the two neighbours with the low 16 bits cleared, the nearer
    one, ties to the one whose last kept bit is 0."""
    out = []
    for v in np.asarray(x, np.float32):
        if np.isnan(v):
            out.append(float('nan'))
            continue
        bits = struct.unpack('<I', struct.pack('<f', v))[0]
        lo_bits = bits & 0xFFFF0000
        lo = struct.unpack('<f', struct.pack('<I', lo_bits))[0]
        hi_bits = lo_bits + 0x10000
        hi = float('inf') if (hi_bits & 0x7FFFFFFF) >= 0x7F800000 else \
            struct.unpack('<f', struct.pack('<I', hi_bits))[0]
        if hi == float('inf') and lo < 0:
            hi = float('-inf')
        d_lo, d_hi = abs(float(v) - lo), abs(float(v) - hi) if np.isfinite(hi) else None
        if np.isinf(v) or d_lo == 0:
            out.append(float(v))
        elif d_hi is None:
            # beyond the largest bfloat16: halfway to 2**128 rounds to inf
            half_ulp = 2.0 ** 119          # half of 2**(127 - 7)
            out.append(lo if d_lo < half_ulp or (d_lo == half_ulp and not (lo_bits >> 16) & 1)
                       else hi)
        elif d_lo < d_hi or (d_lo == d_hi and not (lo_bits >> 16) & 1):
            out.append(lo)
        else:
            out.append(hi)
    return np.array(out, np.float64)


def test_bfloat16_round_to_nearest_even_against_reference():
    rng = np.random.RandomState(3)
    bits = rng.randint(0, 2 ** 32, 4000, dtype=np.uint64).astype(np.uint32)
    special = np.array([1.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -23, -(1 + 2 ** -8),
                        3.39e38, 3.3961e38, 3.4e38, -3.4e38, 1e-40, 0.0, -0.0, np.inf, -np.inf],
                       np.float32)
    x = np.concatenate([bits.view(np.float32), special])
    got = W.bfloat16_to_float32(W.float32_to_bfloat16(x)).astype(np.float64)
    want = bf16_reference(x)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(got[ok], want[ok])
    # hand-checked ties: 1 + half an ulp -> 1 (even), 1 + 1.5 ulp -> 1 + 2 ulp
    assert list(W.float32_to_bfloat16(special[:5])) == [0x3F80, 0x3F80, 0x3F82, 0x3F81, 0xBF80]


class _DeviceLike(np.ndarray):
    """A numpy array that fails where a CuPy array would make the host wait
    for the GPU: its truth value, ``any()`` and boolean-mask indexing."""

    def __bool__(self):
        raise AssertionError('host sync: truth value of a device array')

    def any(self, *a, **k):
        raise AssertionError('host sync: any() of a device array')

    def __getitem__(self, key):
        if getattr(key, 'dtype', None) == bool:
            raise AssertionError('host sync: boolean mask of a device array')
        return np.ndarray.__getitem__(self, key)

    def __setitem__(self, key, value):
        if getattr(key, 'dtype', None) == bool:
            raise AssertionError('host sync: boolean mask of a device array')
        np.ndarray.__setitem__(self, key, value)


class _DeviceXP(object):
    """The array module the casts get for a GPU bucket, as far as they use it."""

    def __init__(self):
        self.where_calls = 0

    def ascontiguousarray(self, a, dtype=None):
        return np.ascontiguousarray(a, dtype).view(_DeviceLike)

    asarray = ascontiguousarray

    def empty(self, n, dtype):
        return np.empty(n, dtype).view(_DeviceLike)

    def where(self, cond, a, b):
        self.where_calls += 1
        return np.where(cond, a, b).view(_DeviceLike)

    left_shift = staticmethod(np.left_shift)


def test_bfloat16_casts_on_a_device_never_wait_for_it():
    """With CuPy the casts run on the comm stream inside start_allreduce: a
    NaN test by any()/mask made the host wait for the GPU once per block
    (46 ms for a 64 MB bucket on an H200). Same bits as numpy's path, one
    pass, no truth value asked."""
    rng = np.random.RandomState(8)
    x = rng.standard_normal(W.BLOCK * 3 + 7).astype(np.float32) * 1e3
    x[[5, W.BLOCK + 1]] = np.nan
    x[[6, 7]] = [np.float32(-np.nan), np.inf]
    xp = _DeviceXP()
    w = W.float32_to_bfloat16(x, xp=xp)
    assert xp.where_calls == 1               # one pass over the bucket, not one per block
    np.testing.assert_array_equal(np.asarray(w), W.float32_to_bfloat16(x))
    back = W.bfloat16_to_float32(w, xp=xp)
    np.testing.assert_array_equal(np.asarray(back).view(np.uint32),
                                  W.bfloat16_to_float32(W.float32_to_bfloat16(x)).view(np.uint32))
    with pytest.raises(AssertionError, match='host sync'):    # the stand-in has teeth
        bool(xp.asarray(x[:2]) > 0)


def test_float16_wire_is_numpys_cast_and_decode_is_exact():
    x = np.random.RandomState(0).standard_normal(W.BLOCK * 2 + 5).astype(np.float32) * 100
    w = W.encode(x, 'float16')
    np.testing.assert_array_equal(w, x.astype(np.float16).view(np.uint16))
    np.testing.assert_array_equal(W.decode(w, 'float16'), x.astype(np.float16).astype(np.float32))
    for wire in ('float16', 'bfloat16'):
        back = W.decode(W.encode(x, wire), wire)
        rel = np.abs(back - x) / np.abs(x)
        assert rel.max() <= W.unit_roundoff(wire) and rel.max() > W.unit_roundoff(wire) / 2


def _float16_boundaries():
    """float32 bit patterns around every float16 value and every midpoint
    between neighbours (the rounding ties), +- one float32 ulp, both signs,
    plus random patterns (every exponent: NaN payloads, overflow, subnormals)."""
    h = np.arange(0x7C00, dtype=np.uint16).view(np.float16).astype(np.float64)
    mid = ((h[:-1] + h[1:]) / 2).astype(np.float32).view(np.uint32)
    at = h.astype(np.float32).view(np.uint32)
    rand = np.random.RandomState(5).randint(0, 2 ** 32, 200000, dtype=np.uint64).astype(np.uint32)
    u = np.concatenate([at, at + 1, at - 1, mid, mid + 1, mid - 1, rand,
                        np.array([0x477FEFFF, 0x477FF000, 0x477FF001, 0x47800000, 0x7F800000,
                                  0x7F800001, 0x7F801FFF, 0x7FC00000, 0x7FFFFFFF, 0x33000000,
                                  0x33000001, 0x32FFFFFF], np.uint32)])
    return np.concatenate([u, u | np.uint32(0x80000000)])


def test_float16_casts_are_numpys_bits_without_numpys_cost_on_small_values():
    u = _float16_boundaries()
    with np.errstate(all='ignore'):
        want = u.view(np.float32).astype(np.float16).view(np.uint16)
    got = W.float32_to_float16(u.view(np.float32))
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, ['%08x -> %04x, numpy %04x' % (u[i], got[i], want[i]) for i in bad[:5]]
    # every float16 (inf and NaN payloads included) decodes to numpy's float32 bits
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    np.testing.assert_array_equal(W.float16_to_float32(h).view(np.uint32),
                                  h.view(np.float16).astype(np.float32).view(np.uint32))
    # hand-checked: 65520 (a tie) rounds to even, i.e. inf; 2**-25 (half the
    # smallest subnormal, a tie) to 0 and a hair above it to 2**-24
    assert list(W.float32_to_float16(np.array([65519.996, 65520.0, 2.0 ** -25, 2.0 ** -25 * (1 + 2.0 ** -23), -0.0],
                                              np.float32))) == [0x7BFF, 0x7C00, 0x0000, 0x0001, 0x8000]
    # into any float32 array: a transposed one too (its flat view would be a copy)
    for wire in ('float16', 'bfloat16'):
        x = np.array([1.5, -2.0 ** -20, 3.0, 0.25, -8.0, 2.0 ** -24], np.float32)
        out = np.zeros((2, 3), np.float32).T
        assert W.decode(W.encode(x, wire), wire, out) is out
        np.testing.assert_array_equal(out, x.reshape(3, 2))
    # no floating-point warning from the NaN lanes
    with np.errstate(all='raise'):
        W.float16_to_float32(W.float32_to_float16(np.array([np.nan, 1e-8, 1.0], np.float32)))


def test_sum_is_float32_of_decoded_parts_never_16_bit():
    # 2048 + 1 + 1 in float16: a 16-bit accumulator would stay at 2048
    # (2049 is not a float16); float32 sums reach 2050, a float16 value.
    parts = np.stack([W.encode(np.array([v], np.float32), 'float16') for v in (2048, 1, 1)])
    assert W.sum_encoded(parts, 'float16')[0] == 2050.0
    rng = np.random.RandomState(1)
    xs = rng.standard_normal((3, W.BLOCK + 7)).astype(np.float32)
    enc = np.stack([W.encode(x, 'bfloat16') for x in xs])
    want = np.zeros(xs.shape[1], np.float32)
    for x in xs:
        want += bf16_reference(x).astype(np.float32)
    np.testing.assert_array_equal(W.sum_encoded(enc, 'bfloat16'), want)


def test_nonfinite_count_and_ranges():
    x = np.array([1.0, 65504.0, 65520.0, -1e5, np.nan, np.inf, 3.4e38], np.float32)
    assert W.nonfinite_count(W.encode(x, 'float16'), 'float16') == 5      # 65520 rounds up
    assert W.nonfinite_count(W.encode(x, 'bfloat16'), 'bfloat16') == 3   # nan, inf, 3.4e38
    assert W.max_finite('float16') == 65504.0
    assert W.chunk_counts(7, 3) == [3, 2, 2] and W.chunk_counts(2, 3) == [1, 1, 0]
    with pytest.raises(ValueError, match="unknown wire dtype 'half'; choose from float32, "
                                         "float16, bfloat16"):
        W.check_wire_dtype('half')


@pytest.mark.parametrize('k', [2, 3])
def test_wire_sums_on_real_ranks(mpirun, k):
    """tests/mpi/run_wire.py: float64 references, bounds, identical ranks, overflow."""
    res = mpirun(k, 'run_wire.py', timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out['k'] == k
    assert sorted(out['worst_error_over_bound']) == ['asa/bfloat16', 'asa/float16',
                                                     'op/bfloat16', 'op/float16']
    assert all(0 < v <= 1 for v in out['worst_error_over_bound'].values())
    assert out['overflow'] == ['float16', 'bfloat16', 'blocking']
    assert out['threads'] is True      # the casts stay off the communication thread


class _Float32Only(Communicator):
    name = 'pygpu-nccl'
    size = 2


def test_backend_that_cannot_send_16_bits_is_refused_by_name():
    with pytest.raises(ValueError, match='the pygpu-nccl backend cannot send gradients as '
                                         r'float16 \(wire dtypes it can send: float32\)'):
        KnSumExchanger(_Float32Only(), [], 0, wire='float16')
    with pytest.raises(ValueError, match="unknown wire dtype 'fp8'"):
        KnSumExchanger(LocalCommunicator(), [], 0, wire='fp8')
    from theanompi_ext.collective.pygpu_nccl import PygpuNCCLCommunicator
    assert PygpuNCCLCommunicator.wire_dtypes == ('float32',)


def test_local_world_sends_nothing_so_casts_nothing():
    buf = np.array([1 + 2 ** -20], np.float32)
    LocalCommunicator().start_allreduce(buf, wire='bfloat16').wait()
    assert buf[0] == np.float32(1 + 2 ** -20)


def test_train_option_file_key_and_refusals(tmp_path):
    from theanompi_ext.train.options import build_parser, config_from, read_kv_file, config_keys
    cfg = config_from(build_parser().parse_args(['--wire-dtype', 'bfloat16']))
    assert cfg.wire_dtype == 'bfloat16'
    f = tmp_path / 's.cfg'
    f.write_text('WIRE_DTYPE = float16\n')
    assert config_from(build_parser().parse_args([]),
                       read_kv_file(str(f), config_keys())).wire_dtype == 'float16'
    with pytest.raises(SystemExit):
        build_parser().parse_args(['--wire-dtype', 'int8'])
    with pytest.raises(ValueError, match="invalid option wire_dtype='float16': a 16-bit wire "
                                         "exists only for sync_type=kn"):
        config_from(build_parser().parse_args(['--wire-dtype', 'float16', '--sync-type', 'avg']))


def test_bsp_option_checked_before_any_rank_starts(tmp_path):
    from theanompi_ext import BSP
    model = tmp_path / 'm.py'
    model.write_text('class M(object):\n    pass\n')
    with pytest.raises(ValueError, match="unknown wire dtype 'f16'"):
        BSP().init(['cpu0', 'cpu1'], str(model), 'M', wire_dtype='f16')
    rule = BSP()
    rule.sync_type = 'avg'
    with pytest.raises(ValueError, match="invalid option wire_dtype='float16': a 16-bit wire "
                                         "exists only for sync_type=kn"):
        rule.init(['cpu0', 'cpu1'], str(model), 'M', wire_dtype='float16')
    assert rule.proc is None
    from theanompi_ext.theanompi_compat.options import OPTION_DEFAULTS
    assert OPTION_DEFAULTS['wire_dtype'][0] == 'float32'


def test_request_progress_cannot_carry_a_16_bit_wire():
    from theanompi_ext.collective.mpi import MPICommunicator
    comm = MPICommunicator(progress='request')
    try:
        comm.size = 2            # pretend: the check comes before any transfer
        with pytest.raises(ValueError, match="a float16 wire needs progress='thread'"):
            comm.start_allreduce(np.ones(3, np.float32), wire='float16')
    finally:
        comm.size = 1
        comm.close()
    with pytest.raises(ValueError, match='wire_method must be one of asa, op'):
        MPICommunicator(wire_method='ring')


def test_nccl_sends_its_native_16_bit_types_from_a_wire_copy(monkeypatch):
    """Fake CuPy + fake library (no GPU here): the cast, NCCL's half/bfloat16
    allreduce of the 16-bit copy and the cast back, in that order, on the
    comm stream; bfloat16 refused by name on an NCCL older than 2.10."""
    from support.fakes import make_comm, FakeCupyArray
    from theanompi_ext.collective import nccl, nccl_lib
    comm, cuda, lib, _ = make_comm()
    stream_cls = type(comm.stream)
    entered = []
    monkeypatch.setattr(stream_cls, '__enter__', lambda s: entered.append(s.ptr) or s,
                        raising=False)
    monkeypatch.setattr(stream_cls, '__exit__', lambda s, *a: False, raising=False)
    comm._cp.asarray = lambda b: b
    calls = []

    class Wire(object):
        size, data = 16, type('D', (), {'ptr': 0xE000})()

    def to_wire(cp, x, wire):
        calls.append(('to', x.data.ptr, wire, len(lib.log)))
        return Wire()

    def from_wire(cp, w, x, wire):
        calls.append(('from', x.data.ptr, wire, len(lib.log)))

    monkeypatch.setattr(nccl, 'device_to_wire', to_wire)
    monkeypatch.setattr(nccl, 'device_from_wire', from_wire)
    for wire, code in (('float16', nccl_lib.NCCL_FLOAT16), ('bfloat16', nccl_lib.NCCL_BFLOAT16)):
        calls.clear()
        comm.start_allreduce(FakeCupyArray(n=16, ptr=0xD000), 'b0', wire=wire)
        n = len(lib.log)
        assert lib.log[-1] == ('allreduce', 0xE000, 0xE000, 16, code, nccl_lib.NCCL_SUM,
                               comm.stream.ptr)
        assert calls == [('to', 0xD000, wire, n - 1), ('from', 0xD000, wire, n)]
        assert entered[-1] == comm.stream.ptr
    lib.version = (2, 9, 9)
    with pytest.raises(nccl_lib.NCCLUnavailable, match='a bfloat16 wire needs NCCL >= 2.10'):
        comm.start_allreduce(FakeCupyArray(n=16), 'b0', wire='bfloat16')


def test_a_bucket_known_by_its_address_is_cast_through_a_view_of_it(monkeypatch):
    """A pygpu bucket (no ``__cuda_array_interface__`` for ``cupy.asarray``)
    reaches the casts as CuPy memory it does not own, at the bucket's own
    address and length, kept alive by the bucket; a CuPy bucket as itself."""
    import types
    from support.fakes import make_comm, FakeCupyArray
    from theanompi_ext.collective import nccl
    comm, cuda, lib, _ = make_comm()
    cp = comm._cp
    made = {}
    monkeypatch.setattr(cuda, 'UnownedMemory', lambda ptr, size, owner, dev:
                        made.update(mem=(ptr, size, owner, dev)) or 'mem', raising=False)
    monkeypatch.setattr(cuda, 'MemoryPointer', lambda mem, off:
                        made.update(memptr=(mem, off)) or 'memptr', raising=False)
    cp.float32 = np.float32
    cp.ndarray = lambda shape, dtype, memptr: made.update(array=(shape, dtype, memptr)) or 'view'
    cp.asarray = lambda b: ('asarray', b)

    class PygpuLike(object):
        gpudata, size, dtype, offset = 0xF040, 12, np.dtype(np.float32), 0x40
        flags = {'C_CONTIGUOUS': True}
        context = types.SimpleNamespace(kind=b'cuda')

    bucket = PygpuLike()
    info = nccl.float32_device_buffer(bucket)
    assert nccl.cupy_view(cp, bucket, info) == 'view'
    assert made['mem'] == (0xF040, 48, bucket, -1 if info.device is None else info.device)
    assert made['memptr'] == ('mem', 0) and made['array'] == ((12,), np.float32, 'memptr')
    arr = FakeCupyArray(n=8)
    assert nccl.cupy_view(cp, arr, nccl.float32_device_buffer(arr)) == ('asarray', arr)


def test_wire_casts_take_an_array_module():
    """The device path runs the same functions with CuPy: they use only ``xp``."""
    import types
    calls = []
    xp = types.SimpleNamespace(**{n: getattr(np, n) for n in ('empty', 'asarray')})
    xp.ascontiguousarray = lambda *a, **k: calls.append('contig') or np.ascontiguousarray(*a, **k)
    xp.where = lambda *a, **k: calls.append('where') or np.where(*a, **k)
    xp.left_shift = lambda *a, **k: calls.append('shift') or np.left_shift(*a, **k)
    x = np.array([1.5, -2.25, 3e38], np.float32)
    back = W.bfloat16_to_float32(W.float32_to_bfloat16(x, xp=xp), xp=xp)
    np.testing.assert_array_equal(back, bf16_reference(x).astype(np.float32))
    assert calls == ['contig', 'where', 'shift']


def test_overflow_in_training_ends_every_rank_with_the_message(mpirun):
    res = mpirun(2, 'run_wire_train.py', timeout=200)
    assert res.returncode != 0
    assert 'inf or nan on the float16 wire (largest finite float16: 65504)' in res.stderr, \
        res.stderr[-3000:]
    assert 'use --wire-dtype bfloat16' in res.stderr


def test_bench_allreduce_times_the_16_bit_wire_in_the_same_run(tmp_path):
    import subprocess
    import sys
    js = tmp_path / 'a.json'
    r = subprocess.run([sys.executable, '-m', 'theanompi_ext', 'bench', 'allreduce', '--quick',
                        '--sizes', '4K,64K', '--wire-dtype', 'float16', '--json', str(js)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert 'float16 wire (started path, float32 sums): 4 KB ' in r.stdout
    rows = json.loads(js.read_text())[0]['rows']
    for row in rows:
        assert row['wire_s'] > 0 and len(row['wire_all_s']) == 3
        assert row['ratio_started_wire'] == pytest.approx(row['started_s'] / row['wire_s'])
