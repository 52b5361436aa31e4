"""``theanompi-ext bench allreduce`` and ``bench compare``: quick runs and their arithmetic.

The quick runs check that the commands work end to end and write
well-formed JSON; timings are not asserted (this machine is shared and the
numbers are only meaningful as ratios measured in one run, see
docs/performance.md). Each run is bounded by a subprocess timeout.
"""
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from theanompi_ext.bench import allreduce, compare

HAVE_TORCH = importlib.util.find_spec('torch') is not None


def run_bench(tmp_path, *argv, timeout):
    """``theanompi-ext bench ARGV --json FILE`` in a fresh process; returns the JSON."""
    rows, res = run_bench_process(tmp_path, *argv, timeout=timeout)
    return rows, res.stdout


def run_bench_process(tmp_path, *argv, timeout):
    """As :func:`run_bench`, returning the JSON and the finished process (its stderr too)."""
    out = tmp_path / 'result.json'
    cmd = [sys.executable, '-m', 'theanompi_ext', 'bench'] + list(argv) + ['--json', str(out)]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                             env=dict(os.environ), start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        pytest.fail('%s hung for %ss:\n%s\n%s' % (' '.join(argv), timeout, exc.stdout, exc.stderr))
    assert res.returncode == 0, res.stdout + res.stderr
    with open(out) as f:
        return json.load(f), res


# ------------------------------------------------------------------ allreduce

def test_allreduce_quick_writes_json(tmp_path):
    results, stdout = run_bench(tmp_path, 'allreduce', '--quick', timeout=120)
    assert len(results) == 1
    res = results[0]
    assert res['benchmark'] == 'allreduce' and res['ranks'] == 2 and res['network'] == 'shm'
    assert [r['bytes'] for r in res['rows']] == list(allreduce.QUICK_SIZES)
    for r in res['rows']:
        for m in allreduce.METHODS:
            assert r[m + '_s'] > 0
            assert len(r[m + '_all_s']) == res['reps']
            assert r[m + '_busbw_GBps'] == pytest.approx(
                allreduce.bus_bandwidth(r['bytes'], r[m + '_s'], 2))
        assert r['ratio_ours'] == pytest.approx(r['raw_s'] / r['ours_s'])
        assert r['ratio_started'] == pytest.approx(r['raw_s'] / r['started_s'])
    assert 'raw/ours' in stdout and '1 MB' in stdout


def test_allreduce_verdict_holds_ours_to_target_and_reports_started():
    def row(nbytes, raw, ours, started):
        r = dict(bytes=nbytes, raw_s=raw, ours_s=ours, started_s=started)
        for m in allreduce.METHODS:
            r[m + '_busbw_GBps'] = allreduce.bus_bandwidth(nbytes, r[m + '_s'], 2)
        r.update(ratio_ours=raw / ours, ratio_started=raw / started)
        return r
    res = dict(ranks=2, network='shm', mpi='x', reps=3,
               rows=[row(4096, 1.0, 2.0, 4.0),            # below 1 MB: not judged
                     row(1 << 20, 1.0, 1.02, 1.25),
                     row(4 << 20, 1.0, 1.0, 1.0)])
    text = allreduce.format_table(res)
    assert 'target raw/ours >= 0.95 from 1 MB: met)' in text
    assert 'raw/start below 0.95 from 1 MB at 1 MB 0.800)' in text
    res['rows'][2] = row(4 << 20, 1.0, 1.1, 1.0)
    text = allreduce.format_table(res)
    assert 'target raw/ours >= 0.95 from 1 MB: NOT met at 4 MB 0.909)' in text


def test_allreduce_sizes_and_bandwidth():
    assert allreduce.parse_size('4K') == 4096
    assert allreduce.parse_size('64M') == 64 << 20
    assert allreduce.parse_size('1024') == 1024
    for bad in ('3', '1.5M', 'x', '6'):
        with pytest.raises(ValueError):
            allreduce.parse_size(bad)
    assert allreduce.DEFAULT_SIZES[0] == 4096 and allreduce.DEFAULT_SIZES[-1] == 64 << 20
    # 2 ranks: each moves the whole buffer once per call
    assert allreduce.bus_bandwidth(1e9, 1.0, 2) == pytest.approx(1.0)
    assert allreduce.bus_bandwidth(1e9, 1.0, 4) == pytest.approx(1.5)
    assert allreduce.format_size(4096) == '4 KB' and allreduce.format_size(1 << 20) == '1 MB'


# -------------------------------------------------------------------- compare

def test_compare_quick_writes_json(tmp_path):
    rows, res = run_bench_process(tmp_path, 'compare', '--quick', timeout=400)
    stdout = res.stdout
    systems = [r['system'] for r in rows]
    expected = list(compare.SYSTEMS if HAVE_TORCH else compare.SYSTEMS[:2])
    assert systems == expected
    for r in rows:
        for key in compare.JSON_KEYS:
            assert key in r
        assert r['model'] == 'digits_cnn' and r['network'] == 'shm'
        assert r['compute_s'] > 0 and r['step_s'] > 0
        assert isinstance(r['comm_overhead'], float) and r['comm_overhead_err'] >= 0
        assert_hidden_fraction_from_times(r)
    # Both projects move the same gradient bytes (BN gamma/beta included).
    assert len({r['grad_bytes'] for r in rows}) == 1
    if HAVE_TORCH:
        assert 'targets vs pytorch/ddp-gloo' in stdout
        assert 'skipping PyTorch DDP' not in res.stderr
    else:
        # Without the [bench] extra: status 0 (checked above), our two exchangers
        # measured, and one line saying why DDP was left out and how to add it.
        assert "theanompi-ext bench compare: PyTorch is not installed (pip install " \
            "'theanompi_ext[bench]', which pins torch==2.13.0); skipping PyTorch DDP" \
            in res.stderr, res.stderr
        assert 'pytorch/ddp' not in stdout


def assert_hidden_fraction_from_times(row):
    """The row's cost and hidden fraction, recomputed from its raw per-rank step
    times as compare's docstring defines them: a float where the cost is over
    1% and over twice its error, None (not measurable) only where it is not."""
    c, t, s = [np.max(np.asarray(row['times_s'][m], float), axis=0)
               for m in ('compute', 'step', 'serial')]
    n = min(len(c), len(t), len(s))
    c, t, s = c[:n], t[:n], s[:n]
    cost = float(np.median((s - c) / c))
    assert row['comm_cost'] == pytest.approx(cost), row['system']
    if cost > max(0.01, 2.0 * row['comm_cost_err']):
        assert row['hidden_fraction'] == pytest.approx(float(np.median((s - t) / c)) / cost)
    else:
        assert row['hidden_fraction'] is None, row['system']


def test_time_modes_alternates_and_counts():
    calls = []
    run = {m: (lambda m=m: calls.append(m)) for m in 'abc'}
    barriers = []
    times = compare.time_modes(run, 'abc', steps=2, reps=3, barrier=lambda: barriers.append(1),
                               warmup=1)
    assert calls[:3] == ['a', 'b', 'c']                      # warm-up
    blocks = calls[3:][::2]
    assert blocks == list('abc') + list('bca') + list('cab')  # rotating order
    assert {m: len(t) for m, t in times.items()} == {'a': 6, 'b': 6, 'c': 6}
    assert len(barriers) == 3 + 9


def test_rows_and_targets():
    # per rank, per step; identical steps: no noise
    ours = dict(compute=[[1.0, 1.0], [0.9, 0.9]], compute_chunked=[[1.1], [1.1]],
                serial=[[2.0, 2.0], [2.0, 2.0]], overlap=[[1.4, 1.4], [1.3, 1.3]],
                allreduce=[[0.9], [0.9]], grad_bytes=8, params=2, buckets=1, chunks=2, ranks=2)
    ddp = dict(compute=[[0.5], [0.5]], serial=[[1.0], [1.0]], full=[[0.9], [0.9]],
               allreduce=[[0.4], [0.4]], grad_bytes=8, params=2, torch='x')
    spec = dict(batch=32, threads=1)
    rows = compare.summarize('m', 'shm', spec, [ours], {25.0: [ddp], 4.0: [ddp]})
    by = {r['system']: r for r in rows}
    assert sorted(by) == ['pytorch/ddp-gloo', 'pytorch/ddp-gloo-4mb', 'theanompi_ext/ar',
                          'theanompi_ext/ar-overlap']
    ov, ser, dd = by['theanompi_ext/ar-overlap'], by['theanompi_ext/ar'], by['pytorch/ddp-gloo']
    assert ov['comm_overhead'] == pytest.approx(0.4)
    assert ov['hidden_fraction'] == pytest.approx(0.6)
    assert ser['hidden_fraction'] == pytest.approx(0.0)
    assert dd['comm_overhead'] == pytest.approx(0.8)
    assert dd['hidden_fraction'] == pytest.approx(0.2)
    text = compare.targets(rows)
    assert 'vs pytorch/ddp-gloo: overhead +40.0% vs +80.0%: met' in text
    assert '0.60 +- 0.00 vs 0.20 +- 0.00: met' in text and 'vs pytorch/ddp-gloo-4mb' in text
    assert ov['comm_overhead_err'] == 0 and ov['times_s']['step'] == [[1.4, 1.4], [1.3, 1.3]]
    # two jobs: each rank's steps are pooled
    assert compare._all([ours, ours], 'compute') == [[1.0] * 4, [0.9] * 4]
    # communication too small to measure: no hidden fraction
    row = compare.make_row('s', 'm', 'shm', [[1.0]], [[1.001]], [[1.002]])
    assert row['hidden_fraction'] is None
    assert 'n/a' in compare.format_table([row])
    # ... or within the noise of the steps
    noisy = compare.make_row('s', 'm', 'shm', [[1.0, 1.0, 1.0]], [[1.0, 1.0, 1.0]],
                             [[1.3, 0.9, 1.02]])
    assert noisy['comm_cost_err'] > 0.05 and noisy['hidden_fraction'] is None
    # a slow drift of the load cancels in the paired figures
    drift = compare.make_row('s', 'm', 'shm', [[1.0, 2.0, 3.0]], [[1.1, 2.2, 3.3]],
                             [[1.2, 2.4, 3.6]])
    assert drift['comm_overhead'] == pytest.approx(0.1) and drift['comm_overhead_err'] < 1e-9
    assert drift['hidden_fraction'] == pytest.approx(0.5)
    assert drift['hidden_fraction_err'] == pytest.approx(0.0, abs=1e-12)
    med, err = compare.median_and_error([1.0, 1.0, 1.0, 9.0])
    assert med == 1.0 and err == 0.0        # one stalled step does not count


def test_hidden_fraction_error_and_noise_verdict():
    # Paired steps whose hidden fraction scatters: saved/compute alternates
    # 0.05 / 0.15 around a cost of 0.2, so the estimate is 0.5 or 0.75 or
    # 0.25 depending on the resample: its bootstrap error is well above 0.
    n = 40
    c = np.ones(n)
    s = c + 0.2
    t = s - np.where(np.arange(n) % 2, 0.05, 0.15)
    assert compare.paired_hidden_fraction(c, t, s) == pytest.approx(0.5)
    err = compare.bootstrap_error(compare.paired_hidden_fraction, (c, t, s))
    assert 0.05 < err < 0.5
    # the same seed gives the same error; no cost at all: no estimate
    assert compare.bootstrap_error(compare.paired_hidden_fraction, (c, t, s)) == err
    assert compare.bootstrap_error(compare.paired_hidden_fraction, (c, c, c)) is None
    rows = [compare.make_row(compare.SYSTEMS[0], 'm', 'shm', [list(c)], [list(t)], [list(s)]),
            compare.make_row('pytorch/ddp-gloo', 'm', 'shm', [list(c)], [list(t - 0.01)],
                             [list(s)])]
    assert rows[0]['hidden_fraction_err'] == pytest.approx(err)
    text = compare.targets(rows)
    # DDP 0.55 against ours 0.50: not met, but well inside the combined error
    assert '0.50 +- ' in text and 'NOT met (within noise, +-' in text
    assert '+- ' in compare.format_table(rows).splitlines()[2]


@pytest.mark.skipif(not HAVE_TORCH, reason='PyTorch (the [bench] extra) not installed')
def test_pytorch_twins_have_our_parameter_counts():
    from theanompi_ext.bench.ddp_worker import build_model, count_params
    from theanompi_ext.model import build_model as ours
    from theanompi_ext.model.resnet import cifar_resnet
    for name, spec in compare.MODEL_SPECS.items():
        shape = tuple(spec['input_shape'])
        if spec['kind'] == 'cifar_resnet':
            net = cifar_resnet(shape, 10, depth=spec['depth'], width=spec['width'])
        else:
            net = ours(spec['kind'], shape, 10, width=spec['width'])
        mine = sum(int(p.get_value(borrow=True).size) for p in net.params)
        assert count_params(build_model(spec, 10)) == mine, name
    # the zoo's figures
    assert count_params(build_model(compare.MODEL_SPECS['resnet20'])) == 272474
    assert count_params(build_model(compare.MODEL_SPECS['resnet20_wide'])) == 4327754


def test_compare_without_torch_skips_ddp(tmp_path, monkeypatch, capsys):
    from theanompi_ext.bench import ddp_worker
    from theanompi_ext.cli import build_parser
    seen = {}

    def fake_setting(spec, model, net, ranks, ddp, timeout):
        seen['ddp'] = ddp
        t = [[1.0], [1.0]]
        return compare.summarize(model, 'shm', spec, [dict(
            compute=t, compute_chunked=t, serial=[[1.5], [1.5]], overlap=[[1.2], [1.2]],
            allreduce=[[0.4], [0.4]], grad_bytes=8, params=2, buckets=1, chunks=1, ranks=2)],
            {})
    monkeypatch.setattr(ddp_worker, 'torch_problem', lambda: 'PyTorch is not installed')
    monkeypatch.setattr(compare, 'run_setting', fake_setting)
    out = tmp_path / 'rows.json'
    args = build_parser().parse_args(['bench', 'compare', '--quick', '--json', str(out)])
    assert args.func(args) == 0
    assert seen['ddp'] is False
    assert 'skipping PyTorch DDP' in capsys.readouterr().err
    rows = json.loads(out.read_text())
    assert [r['system'] for r in rows] == list(compare.SYSTEMS[:2])
    assert rows[0]['hidden_fraction'] == pytest.approx(0.6)
