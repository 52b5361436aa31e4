"""The chunked backward pass, the overlapped exchanger, its timeline and bench.

* chunk planning (pure);
* chunked gradients equal the monolithic ones bitwise (one process), with
  the ``on_chunk`` contract the trainer relies on;
* overlapped vs serial exchanger after T steps at 2 and 4 real MPI ranks,
  for bucket caps giving one bucket per parameter and one bucket overall;
  two overlapped runs bitwise identical;
* a bucket plan that differs between ranks is refused on every rank;
* the trainer's timeline: a Chrome trace ordered and nested as documented;
* ``theanompi-ext bench overlap --quick`` end to end.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from theanompi_ext.backward.chunked import plan_chunks
from theanompi_ext.bench.overlap import hidden_fraction, parse_comm_thread
from theanompi_ext.launch.emulated_network import format_network, parse_network
from theanompi_ext.exchange import timeline as tl

# -- planning (pure) -------------------------------------------------------------


def test_plan_chunks_one_per_layer_with_params():
    # stage1, stage2, stage3, gap (no params), fc: gap joins stage3's chunk
    assert plan_chunks([10, 20, 30, 0, 5]) == [(4, 5), (2, 4), (1, 2), (0, 1)]


def test_plan_chunks_leading_layers_without_params_join_the_input_chunk():
    assert plan_chunks([0, 7, 3]) == [(2, 3), (0, 2)]


def test_plan_chunks_min_params_and_max_chunks():
    counts = [1, 1, 1, 1, 1, 100]
    # closed at >= 2 scalars from the output back; the leftover layer 0 joins
    assert plan_chunks(counts, min_chunk_params=2) == [(5, 6), (3, 5), (0, 3)]
    assert plan_chunks(counts, max_chunks=2) == [(3, 6), (0, 3)]
    assert plan_chunks(counts, max_chunks=1) == [(0, 6)]
    with pytest.raises(ValueError):
        plan_chunks(counts, max_chunks=0)


def test_start_ready_starts_buckets_in_plan_order_once_complete():
    from theanompi_ext.buckets.plan import plan_buckets
    from theanompi_ext.exchange.knsum import KnSumExchanger

    class Recording(object):
        def __init__(self):
            self.started = []

        def start_allreduce(self, buf, name=None):
            self.started.append(name)
            return type('H', (), {'wait': lambda self: None})()

    # 4-entry tensors, 16-byte caps: one parameter per bucket
    buckets = plan_buckets([4, 4, 4, 4], 3, cap_mb=16 / 2 ** 20, first_cap_mb=16 / 2 ** 20)
    comm = Recording()
    ex = KnSumExchanger(comm, buckets, 12)
    grads = np.ones(16, np.float32)
    ex.start_ready(0, grads)
    assert comm.started == []
    ex.start_ready(2, grads)                  # params 0, 1 final
    assert comm.started == ['bucket0', 'bucket1']
    ex.start_ready(2, grads)                  # nothing new: nothing started twice
    ex.start_ready(4, grads)                  # past the exchanged prefix: the last one
    assert comm.started == ['bucket0', 'bucket1', 'bucket2']
    ex.finish(grads)
    np.testing.assert_array_equal(grads, [1] * 16)   # the local tail is the update's
    ex.start_ready(1, grads)                  # the next step starts again at bucket 0
    assert comm.started[-1] == 'bucket0'


def test_bench_option_parsing():
    assert parse_network('shm') == ('shm', None)
    assert parse_network('tbf:200mbit') == ('tbf', '200mbit')
    assert format_network(parse_network('tbf:200mbit')) == 'tbf:200mbit'
    with pytest.raises(ValueError):
        parse_network('netem:10ms')
    assert parse_comm_thread('idle') == (0, True, None, None)
    assert parse_comm_thread('nice:19') == (19, False, None, None)
    assert parse_comm_thread(None) == (None, None, None, None)
    assert parse_comm_thread('block') == (None, None, 0, None)
    assert parse_comm_thread('poll:500') == (None, None, 500.0, None)
    assert parse_comm_thread('no-handoff') == (None, None, None, False)
    assert parse_comm_thread('nice:5,poll:20,handoff') == (5, False, 20.0, True)
    for bad in ('poll:0', 'poll:', 'poll:-5', 'block,handof', ''):
        with pytest.raises(ValueError, match='poll:US'):
            parse_comm_thread(bad)
    with pytest.raises(ValueError):
        parse_comm_thread('nice:40')
    assert hidden_fraction(1.0, 2.0, 1.1) == pytest.approx(0.9)
    assert hidden_fraction(1.0, 1.001, 1.0) is None   # nothing to hide
    assert hidden_fraction(1.0, 1.04, 1.0) is None    # under MIN_COST (5%): noise
    assert hidden_fraction(1.0, 1.1, 1.05) == pytest.approx(0.5)


# -- chunked == monolithic (one process) -------------------------------------------

def _flat_params(net, exchange_bn):
    from theanompi_ext.buckets.plan import flat_order
    from theanompi_ext.update.policy import split_exchanged
    from theanompi_ext.params import ParamSet, tags_of
    params = net.params
    order, n_exch = flat_order(*split_exchanged([tags_of(p) for p in params], exchange_bn))
    return ParamSet([params[i] for i in order], [params[i].name for i in order]), n_exch


@pytest.mark.parametrize('model,kw,exchange_bn,max_chunks', [
    ('digits_cnn', {}, False, None),
    ('mlp', {'hidden': (32, 16), 'bn': True}, True, None),
    ('digits_cnn', {}, False, 2),
])
def test_chunked_gradients_equal_monolithic(model, kw, exchange_bn, max_chunks):
    from theanompi_ext.backward.chunked import ChunkedBackward
    from theanompi_ext.backward.monolithic import MonolithicBackward
    from theanompi_ext.model import build_model
    net = build_model(model, (1, 8, 8), 10, seed=0, **kw)
    ps, n_exch = _flat_params(net, exchange_bn)
    rng = np.random.RandomState(1)
    x = rng.standard_normal((16, 1, 8, 8)).astype(np.float32)
    y = rng.randint(0, 10, 16).astype(np.int32)
    mono = MonolithicBackward(net, ps.vars, 1.0 / 32)
    chunked = ChunkedBackward(net, ps.vars, 1.0 / 32, max_chunks=max_chunks)
    stats0 = [s.get_value().copy() for s in net.stats]
    g_mono = np.full(ps.layout.total, np.nan, np.float32)
    g_chunk = g_mono.copy()
    out_mono = mono.run(x, y, g_mono, ps.layout)
    stats_mono = [s.get_value().copy() for s in net.stats]
    for s, v in zip(net.stats, stats0):
        s.set_value(v)
    calls = []

    def on_chunk(c, n_ready):
        # Every gradient reported ready is already in place.
        assert not np.isnan(g_chunk[:ps.layout.offsets[n_ready - 1] +
                                    ps.layout.sizes[n_ready - 1]]).any()
        calls.append((c, n_ready))
    out_chunk = chunked.run(x, y, g_chunk, ps.layout, on_chunk)
    assert out_chunk == out_mono
    assert np.array_equal(g_chunk, g_mono), 'max abs diff %g' % np.abs(g_chunk - g_mono).max()
    for a, b in zip(stats_mono, [s.get_value() for s in net.stats]):
        assert np.array_equal(a, b)          # BN running statistics updated once, identically
    assert [c for c, _ in calls] == list(range(chunked.n_chunks))
    ready = [n for _, n in calls]
    assert ready == sorted(ready) and ready[-1] == len(ps.layout) >= n_exch
    if max_chunks:
        assert chunked.n_chunks == max_chunks
    # The timeline stamps: forward, then one per chunk, in order.
    assert [t[0] for t in chunked.times] == ['forward'] + \
        ['backward:' + n for n in chunked.chunk_names]
    starts = [t[1] for t in chunked.times]
    assert starts == sorted(starts)


@pytest.mark.parametrize('k', [2, 3])
def test_started_allreduce_sums_with_both_thread_waits(mpirun, k):
    # Includes the waiting thread running a transfer the thread has not
    # taken, and per-rank mixes of inline and thread transfers.
    res = mpirun(k, 'run_started.py', timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out['0']['ok'] and out['500']['ok']
    assert 'thread wait blocking' in out['0']['describe']
    assert 'sleeps <= 500 us' in out['500']['describe']
    for poll_us in ('0', '500'):
        # Handed over, the transfer starts before the caller's GIL-holding
        # code (as a compiled chunk); without, only as that code returns.
        on, off = out[poll_us]['handoff']['True'], out[poll_us]['handoff']['False']
        assert on['handed'] and on['start_before_hold'], out
        assert not off['handed'] and off['start_late'] and not off['start_before_hold'], out
        assert 'GIL handed over at start' in out[poll_us]['describe']


# -- overlapped vs serial at 2 and 4 ranks ---------------------------------------------

def _equiv(mpirun, tmp_path, k, model, steps, variants):
    out = str(tmp_path / ('equiv%d.npz' % k))
    res = mpirun(k, 'run_overlap.py', 'equiv', model, steps, json.dumps(variants), out,
                 timeout=240)
    assert res.returncode == 0, res.stdout + res.stderr
    data = np.load(out)
    assert data['agree'].all(), 'ranks disagree on the exchanged parameters'
    finals = [data['v%d' % i] for i in range(len(variants))]
    assert_trained(data['initial'], finals[0], int(data['n_exch'][0]))
    return finals, data['buckets']


def assert_trained(initial, final, n_exch):
    """Every exchanged entry group moved from where training started: without
    this, serial == overlapped would also hold for two runs that did nothing."""
    assert initial.shape == final.shape and np.isfinite(final).all()
    moved = np.abs(final[:n_exch] - initial[:n_exch])
    assert moved.max() > 1e-3, 'the exchanged parameters barely moved: %g' % moved.max()
    assert np.count_nonzero(moved) > 0.5 * n_exch, \
        'only %d of %d exchanged entries changed' % (np.count_nonzero(moved), n_exch)


def test_overlapped_equals_serial_2_ranks(mpirun, tmp_path):
    variants = [['ar', 4.0, 1.0], ['ar-overlap', 4.0, 1.0],
                ['ar-overlap', 1e-6, 1e-6],        # every parameter its own bucket
                ['ar-overlap', 100.0, 100.0],      # one bucket
                ['ar-overlap', 4.0, 1.0]]          # a repeat: must be bitwise identical
    finals, buckets = _equiv(mpirun, tmp_path, 2, 'digits_cnn', 4, variants)
    assert buckets[2] == 5 and buckets[3] == 1     # digits_cnn exchanges 5 tensors
    for v in finals[1:]:
        np.testing.assert_allclose(v, finals[0], rtol=1e-5, atol=1e-6)
    assert np.array_equal(finals[1], finals[4])


def test_overlapped_equals_serial_4_ranks(mpirun, tmp_path):
    variants = [['ar', 4.0, 1.0], ['ar-overlap', 1e-6, 1e-6], ['ar-overlap', 100.0, 100.0]]
    finals, buckets = _equiv(mpirun, tmp_path, 4, 'mlp', 4, variants)
    assert buckets[1] == 6 and buckets[2] == 1     # 3 Dense layers, W and b each
    for v in finals[1:]:
        np.testing.assert_allclose(v, finals[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('k', [2, 3])
def test_bucket_plans_that_differ_are_refused_on_every_rank(mpirun, k):
    caps = ','.join(['4'] * (k - 1) + ['0.001'])          # the last rank plans other buckets
    res = mpirun(k, 'run_overlap.py', 'mismatch', env={'OVERLAP_TEST_CAPS': caps},
                 timeout=120)
    assert res.returncode != 0
    for rank in range(k):
        assert 'rank %d refused: bucket plans differ across ranks' % rank in res.stderr, \
            res.stderr


# -- the timeline -------------------------------------------------------------------------

def test_trainer_timeline_trace(mpirun, tmp_path):
    prefix = str(tmp_path / 'trace')
    res = mpirun(2, 'run_overlap.py', 'trace', 'ar-overlap', 3, prefix, timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    with open(prefix + '.json') as f:
        trace = json.load(f)
    assert os.path.getsize(prefix + '.png') > 1000
    assert tl.check_trace(trace) == 6               # 3 steps x 2 ranks
    xs = [e for e in trace['traceEvents'] if e['ph'] == 'X']
    assert {e['pid'] for e in xs} == {0, 1}
    names = {(e['pid'], e['tid']): [] for e in xs}
    for e in xs:
        names[(e['pid'], e['tid'])].append(e['name'])
    compute = [n for n in names[(0, tl.COMPUTE_TID)] if not n.startswith('step ')]
    per_step = len(compute) // 3
    one = compute[:per_step]
    assert one[0] == 'forward' and one[1] == 'backward:fc'
    assert all(n.startswith('backward:') for n in one[1:-3])
    assert one[-3:] == ['stats', 'wait', 'update']
    buckets = names[(0, tl.COMM_TID)]
    assert len(buckets) % 3 == 0 and len(buckets) // 3 >= 2
    assert buckets[:len(buckets) // 3] == ['bucket%d' % b for b in range(len(buckets) // 3)]
    exposed = trace['otherData']['exposed_comm_us']
    assert len(exposed['0']) == 3 and min(min(v) for v in exposed.values()) >= 0
    job = trace['otherData']['job_exposed_comm_us']
    assert len(job) == 3 and min(job) >= 0
    meta = {(e['pid'], e['tid']): e['args']['name'] for e in trace['traceEvents']
            if e['ph'] == 'M' and e['name'] == 'thread_name'}
    assert meta[(0, tl.COMPUTE_TID)] == 'compute' and meta[(1, tl.COMM_TID)] == 'comm'
    # Each chunk carries the exchanged gradients it produces: over one step
    # they add up to the model's non-BN parameters (BN gamma/beta stay local).
    from theanompi_ext.model import build_model
    from theanompi_ext.params import tags_of
    from theanompi_ext.simulate.model import load_workload
    net = build_model('digits_cnn', (1, 8, 8), 10, seed=0)
    exch = [p.get_value().size for p in net.params if 'bn_affine' not in tags_of(p)]
    chunks = [e for e in xs if e['pid'] == 0 and e['name'].startswith('backward:')]
    first = chunks[:per_step - 4]
    assert sum(e['args']['grad_bytes'] for e in first) == 4 * sum(exch)
    assert sum(e['args']['tensors'] for e in first) == len(exch)
    # ... which is what the simulator reads as a measured workload.
    wl = load_workload(prefix + '.json')
    assert [l.name for l in wl.layers] == [e['name'][len('backward:'):] for e in first]
    assert wl.grad_bytes == 4 * sum(exch) and wl.tensors == len(exch)
    assert 'rank 0, median of 2 step(s)' in wl.name and wl.forward_s > 0


def test_check_trace_rejects_bad_nesting():
    good = tl.chrome_trace([
        {'name': 'step 0', 'ph': 'X', 'pid': 0, 'tid': 0, 'ts': 0.0, 'dur': 1.0, 'args': {}},
        {'name': 'forward', 'ph': 'X', 'pid': 0, 'tid': 0, 'ts': 0.1, 'dur': 0.2, 'args': {}},
        {'name': 'bucket0', 'ph': 'X', 'pid': 0, 'tid': 1, 'ts': 0.4, 'dur': 0.2, 'args': {}},
    ], {0: [0.0]})
    assert tl.check_trace(good) == 1
    bad = json.loads(json.dumps(good))
    bad['traceEvents'][-1]['dur'] = 5e6             # the bucket outlives its step
    with pytest.raises(ValueError, match='outside every step'):
        tl.check_trace(bad)


def test_job_exposed_comm_leaves_out_waiting_for_a_slower_rank():
    # rank 0 ends its backward at 1.0, rank 1 at 1.5; the last transfer ends
    # at 1.6 on both: the job waited 0.1 s on communication, rank 0 0.6 s.
    marks = [[(0, 1.0, 1.6), (1, 3.0, 3.0)], [(0, 1.5, 1.6), (1, 2.0, 2.5)]]
    assert tl.job_exposed_comm(marks) == pytest.approx([0.1, 0.0])
    assert tl.job_exposed_comm([[(0, 1.0, None)], [(0, 1.0, None)]]) == [0.0]


# -- the bench ------------------------------------------------------------------------------

def test_bench_overlap_quick(tmp_path):
    out = str(tmp_path / 'bench.json')
    prefix = str(tmp_path / 'tl')
    cmd = [sys.executable, '-m', 'theanompi_ext', 'bench', 'overlap', '--quick', '--json', out,
           '--timeline', prefix]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                             start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        pytest.fail('bench overlap --quick hung:\n%s\n%s' % (exc.stdout, exc.stderr))
    assert res.returncode == 0, res.stdout + res.stderr
    assert 'hidden' in res.stdout and 'digits_cnn' in res.stdout
    with open(out) as f:
        rows = json.load(f)
    assert len(rows) == 1
    row = rows[0]
    for key in ('model', 'network', 'compute_s', 'serial_s', 'overlap_s', 'allreduce_s',
                'exposed_comm_s', 'hidden_fraction', 'extra_bytes'):
        assert key in row
    assert row['model'] == 'digits_cnn' and row['network'] == 'shm'
    assert row['extra_bytes'] == 0           # buckets are views of the gradient vector
    for key in ('compute_s', 'serial_s', 'overlap_s', 'allreduce_s'):
        assert row[key] > 0
    # The serial exchanger's trace: one forward_backward, then stats, then
    # update (where the buckets go), every bucket inside its step.
    with open(prefix + '-shm-digits_cnn-serial.json') as f:
        trace = json.load(f)
    with open(prefix + '-shm-digits_cnn-serial.png', 'rb') as f:
        assert f.read(8) == b'\x89PNG\r\n\x1a\n'      # its chart, written whole
    n_steps = tl.check_trace(trace)
    assert n_steps == 2 * row['steps'] * row['reps']
    compute = [e['name'] for e in trace['traceEvents'] if e['ph'] == 'X' and e['pid'] == 0
               and e['tid'] == tl.COMPUTE_TID and not e['name'].startswith('step ')]
    assert compute[:3] == ['forward_backward', 'stats', 'update']
    assert os.path.exists(prefix + '-shm-digits_cnn-overlap.json')
