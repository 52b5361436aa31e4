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

from theanompi_ext.bench import (allreduce, casts, compare, compare_stats, compare_systems,
                                  compare_verdicts, timing)

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


# ------------------------------------------------------------------ casts

def test_casts_times_both_wires_at_each_scale(tmp_path):
    res, stdout = run_bench(tmp_path, 'casts', '--elements', '3000', '--reps', '3',
                            '--scales', '1,1e-6', timeout=120)
    rows = res['rows']
    assert [(r['wire'], r['scale']) for r in rows] == [
        ('float16', 1.0), ('float16', 1e-6), ('bfloat16', 1.0), ('bfloat16', 1e-6)]
    for r in rows:
        assert r['elements'] == 3000 and r['encode_ns'] > 0 and r['decode_ns'] > 0
        assert (r['numpy_encode_ns'] is None) == (r['wire'] == 'bfloat16')
    assert 'numpy/ours' in stdout and 'on 3000 elements' in stdout


def test_casts_table_by_hand_and_bad_scales_refused(tmp_path):
    row = dict(wire='float16', scale=1e-5, elements=10, encode_ns=5.0, decode_ns=4.0,
               numpy_encode_ns=120.0, numpy_decode_ns=16.0)
    bf = dict(row, wire='bfloat16', numpy_encode_ns=None, numpy_decode_ns=None)
    lines = casts.format_table([row, bf]).splitlines()
    assert lines[2].split() == ['float16', '1e-05', '5.00', '120.00', '4.00', '16.00', 'x24.0']
    assert lines[3].split()[-3:] == ['4.00', 'n/a', 'n/a']
    for bad in ('1,x', '0', '-1', 'nan', ''):
        with pytest.raises(ValueError, match='--scales'):
            casts.parse_scales(bad)
    res = subprocess.run([sys.executable, '-m', 'theanompi_ext', 'bench', 'casts', '--scales',
                          '1,inf'], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "--scales: 'inf' is not a positive number" in res.stderr


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


@pytest.mark.root
@pytest.mark.parametrize('sig', ['SIGTERM', 'SIGHUP'])
def test_signal_stops_the_ranks_and_deletes_the_namespace(sig):
    """A benchmark stopped by a signal ends every rank it started and deletes its
    network namespace, with status 128 + the signal."""
    import signal
    import time
    from theanompi_ext.launch.emulated_network import (delete_namespace, namespace_name,
                                                       namespaces, netns_problem)
    from support.procs import alive as _alive, descendants as _descendants
    if netns_problem():
        pytest.skip(netns_problem())
    proc = subprocess.Popen([sys.executable, '-m', 'theanompi_ext', 'bench', 'allreduce',
                             '--network', 'tbf:1gbit', '--sizes', '64M', '--reps', '50'],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    ns = namespace_name(proc.pid)
    try:
        deadline, ranks = time.time() + 90, []
        while time.time() < deadline and proc.poll() is None:
            listed = namespaces()
            ranks = [p for p in _descendants(proc.pid)     # not mpiexec, not ip
                     if _cmdline(p).startswith(sys.executable + ' -u -m theanompi_ext.bench.allreduce')]
            if ns in listed and len(ranks) == 2:
                break
            time.sleep(0.2)
        assert len(ranks) == 2 and proc.poll() is None, proc.communicate()
        time.sleep(1.0)                       # the ranks inside their allreduces
        proc.send_signal(getattr(signal, sig))
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 128 + getattr(signal, sig), err
        assert ns not in namespaces()
        assert not [p for p in ranks if _alive(p)]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
        delete_namespace(ns)


def _cmdline(pid):
    try:
        with open('/proc/%d/cmdline' % pid, 'rb') as f:
            return f.read().replace(b'\0', b' ').decode('utf-8', 'replace')
    except OSError:
        return ''


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

# One quick run serves the tests below: our float32 and float16 systems, DDP
# with and without its fp16 hook (~12 s more than float32 and DDP alone), a
# variable for our ranks (MPICH's yield between polls: no change of results).
QUICK_ENV = {'MPIR_CVAR_ENABLE_HEAVY_YIELD': '1', 'TMX_BENCH_MARK': 'a=b'}
QUICK_COMPARE = ('compare', '--quick', '--wire-dtype', 'float32,float16', '--ddp-fp16-hook') + \
    sum((('--mpi-env', '%s=%s' % kv) for kv in sorted(QUICK_ENV.items())), ())


def logging_python(folder, flags=''):
    """A script that runs this Python (with ``flags``) after writing its arguments
    to ``folder/calls``: another interpreter, for ``--ddp-python``."""
    path = folder / 'python'
    path.write_text('#!/bin/sh\necho "$@" >> %s\nexec %s %s "$@"\n'
                    % (folder / 'calls', sys.executable, flags))
    path.chmod(0o755)
    return path


@pytest.fixture(scope='module')
def quick_compare(tmp_path_factory):
    """(rows, finished process) of ``bench`` :data:`QUICK_COMPARE`, DDP run by
    another interpreter's path (:func:`logging_python`: its calls in ``res.calls``)."""
    tmp = tmp_path_factory.mktemp('compare')
    python = logging_python(tmp)
    rows, res = run_bench_process(tmp, *QUICK_COMPARE + ('--ddp-python', str(python)),
                                  timeout=400)
    calls = tmp / 'calls'
    res.calls = calls.read_text().splitlines() if calls.exists() else []
    return rows, res


def test_compare_quick_writes_json(quick_compare):
    rows, res = quick_compare
    stdout = res.stdout
    systems = [r['system'] for r in rows]
    ours = list(compare_systems.SYSTEMS[:2])
    expected = ours + [s + '-fp16' for s in ours]
    if HAVE_TORCH:
        expected += [compare_systems.SYSTEMS[2], compare_systems.SYSTEMS[2] + '-fp16']
    assert systems == expected
    for r in rows:
        for key in compare.JSON_KEYS:
            assert key in r
        assert r['model'] == 'digits_cnn' and r['network'] == 'shm'
        assert r['compute_s'] > 0 and r['step_s'] > 0
        assert isinstance(r['comm_overhead'], float) and r['comm_overhead_err'] >= 0
        assert_hidden_fraction_from_times(r)
        assert r['wire_dtype'] == ('float16' if r['system'].endswith('-fp16') else 'float32')
        # --mpi-env reached our ranks (as they saw it), not DDP's
        assert r.get('mpi_env') == (None if r['system'].startswith('pytorch/') else QUICK_ENV)
        # ours as `train` runs it: --topology auto, flat with every rank on one host
        assert r.get('topology') == (None if r['system'].startswith('pytorch/') else 'flat')
    # Both projects move the same gradient bytes (BN gamma/beta included).
    assert len({r['grad_bytes'] for r in rows}) == 1
    # The compute step is shared by our wires: the same paired times.
    assert rows[0]['times_s']['compute'] == rows[2]['times_s']['compute']
    assert_new_targets_from_times(rows[:4])
    if HAVE_TORCH:
        assert 'targets vs pytorch/ddp-gloo' in stdout
        assert 'skipping PyTorch DDP' not in res.stderr
        # --ddp-python ran DDP's ranks (2 ranks x 2 systems) and nothing of ours
        workers = [c for c in res.calls if 'theanompi_ext.bench.ddp_worker' in c]
        assert len(workers) == 4 and res.calls[0] == '-c import torch.distributed', res.calls
        assert not [c for c in res.calls if 'compare_rank' in c], res.calls
    else:
        # Without the [bench] extra: status 0 (checked above), our two exchangers
        # measured, and one line saying why DDP was left out and how to add it.
        assert "theanompi-ext bench compare: PyTorch is not installed (pip install " \
            "'theanompi_ext[bench]', which pins torch==2.13.0); skipping PyTorch DDP" \
            in res.stderr, res.stderr
        assert 'pytorch/ddp' not in stdout
    assert 'target float16 exchange time / float32: x' in stdout
    assert 'target theanompi_ext/ar-overlap-fp16: step over max(compute, allreduce)' in stdout


def test_a_ddp_python_without_torch_is_named_and_ddp_left_out(tmp_path):
    from theanompi_ext.bench.ddp_worker import torch_problem
    python = logging_python(tmp_path, '-S')       # no site-packages: no torch
    assert torch_problem(str(python)).startswith(
        '--ddp-python %s cannot import torch.distributed (ModuleNotFoundError: ' % python)
    missing = tmp_path / 'no-such-python'
    assert torch_problem(str(missing)).startswith('--ddp-python %s cannot run (' % missing)


def assert_new_targets_from_times(ours):
    """Our rows' wire time ratio and bound excess, recomputed from their times."""
    ov32, _, ov16, ser16 = ours
    a16, a32 = [np.max(np.asarray(r['times_s']['allreduce'], float), axis=0)
                for r in (ov16, ov32)]
    n = min(len(a16), len(a32))
    ratio = compare_stats.median_and_error(a16[:n] / a32[:n])
    assert (ov16['wire_time_ratio'], ov16['wire_time_ratio_err']) == pytest.approx(ratio)
    assert ser16['wire_time_ratio'] == ov16['wire_time_ratio']
    assert 'wire_time_ratio' not in ov32 and 'bound_excess' not in ser16
    for r in (ov32, ov16):
        c, t, a = [np.max(np.asarray(r['times_s'][m], float), axis=0)
                   for m in ('compute', 'step', 'allreduce')]
        n = min(len(c), len(t), len(a))
        assert r['bound_excess'] == pytest.approx(
            float(np.median(t[:n] / np.maximum(c[:n], a[:n]))) - 1.0)


@pytest.mark.skipif(not HAVE_TORCH, reason='PyTorch (the [bench] extra) not installed')
@pytest.mark.parametrize('item', ['NOEQUALS', '=1', 'A B=1', 'A-B=1'])
def test_mpi_env_wants_key_value(item):
    import argparse
    from theanompi_ext.bench.common import add_mpi_env_option
    p = argparse.ArgumentParser()
    add_mpi_env_option(p)
    assert p.parse_args(['--mpi-env', 'K_1=x=y', '--mpi-env', 'E=']).mpi_env == [
        ('K_1', 'x=y'), ('E', '')]
    with pytest.raises(SystemExit):
        p.parse_args(['--mpi-env', item])


def test_compare_topology_reaches_our_ranks(tmp_path):
    """``--topology two-level`` is what our ranks' allreduce runs as (one host of 2
    ranks: the two-level sum within it), and the table's first line says so; the
    ranks built the communicator as `train` does, not a flat one of their own."""
    rows, res = run_bench_process(tmp_path, 'compare', '--quick', '--no-ddp', '--topology',
                                  'two-level', timeout=300)
    assert [r['topology'] for r in rows] == ['two-level rsag'] * 2
    assert res.stdout.splitlines()[0].endswith('0.06 MB of gradients, our allreduce '
                                               'two-level rsag'), res.stdout


def test_compare_quick_ddp_fp16_hook(quick_compare):
    rows, res = quick_compare
    by = {r['system']: r for r in rows}
    hooked, plain = by['pytorch/ddp-gloo-fp16'], by['pytorch/ddp-gloo']
    assert hooked['ddp_comm_hook'] == 'fp16' and plain['ddp_comm_hook'] == 'none'
    assert plain['hook_check'] is None
    # The job checked, before timing, that its DDP gradients came through the
    # hook: float16 values, the ranks' mean within float16 rounding, and not
    # the float32 mean itself.
    check = hooked['hook_check']
    assert check['float16_exact'] and check['within_bound']
    assert check['changed_by_rounding'] > 0
    assert check['max_abs_err'] <= check['max_bound']
    assert_hidden_fraction_from_times(hooked)
    assert 'targets of theanompi_ext/ar-overlap-fp16 vs pytorch/ddp-gloo-fp16' in res.stdout


def assert_hidden_fraction_from_times(row):
    """The row's cost and hidden fraction, recomputed from its raw per-rank step
    times as compare's docstring defines them: a float where the cost is over
    MIN_COST and over twice its error, None (not measurable) only where it is not."""
    c, t, s = [np.max(np.asarray(row['times_s'][m], float), axis=0)
               for m in ('compute', 'step', 'serial')]
    n = min(len(c), len(t), len(s))
    c, t, s = c[:n], t[:n], s[:n]
    cost = float(np.median((s - c) / c))
    assert row['comm_cost'] == pytest.approx(cost), row['system']
    if cost > max(compare_stats.MIN_COST, 2.0 * row['comm_cost_err']):
        assert row['hidden_fraction'] == pytest.approx(float(np.median((s - t) / c)) / cost)
    else:
        assert row['hidden_fraction'] is None, row['system']


def test_time_modes_alternates_and_counts():
    calls = []
    run = {m: (lambda m=m: calls.append(m)) for m in 'abc'}
    barriers = []
    times = timing.time_modes(run, 'abc', steps=2, reps=3, barrier=lambda: barriers.append(1),
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
    rows = compare_stats.summarize('m', 'shm', spec, [ours], {25.0: [ddp], 4.0: [ddp]})
    by = {r['system']: r for r in rows}
    assert sorted(by) == ['pytorch/ddp-gloo', 'pytorch/ddp-gloo-4mb', 'theanompi_ext/ar',
                          'theanompi_ext/ar-overlap']
    ov, ser, dd = by['theanompi_ext/ar-overlap'], by['theanompi_ext/ar'], by['pytorch/ddp-gloo']
    assert ov['comm_overhead'] == pytest.approx(0.4)
    assert ov['hidden_fraction'] == pytest.approx(0.6)
    assert ser['hidden_fraction'] == pytest.approx(0.0)
    assert dd['comm_overhead'] == pytest.approx(0.8)
    assert dd['hidden_fraction'] == pytest.approx(0.2)
    text = compare_verdicts.targets(rows)
    assert 'vs pytorch/ddp-gloo: overhead +40.0% vs +80.0%: met' in text
    assert '0.60 +- 0.00 vs 0.20 +- 0.00: met' in text and 'vs pytorch/ddp-gloo-4mb' in text
    assert ov['comm_overhead_err'] == 0 and ov['times_s']['step'] == [[1.4, 1.4], [1.3, 1.3]]
    # two jobs: each rank's steps are pooled
    assert compare_stats._all([ours, ours], 'compute') == [[1.0] * 4, [0.9] * 4]
    # communication too small to measure: no hidden fraction
    row = compare_stats.make_row('s', 'm', 'shm', [[1.0]], [[1.001]], [[1.002]])
    assert row['hidden_fraction'] is None
    assert 'n/a' in compare_verdicts.format_table([row])
    # ... or within the noise of the steps
    noisy = compare_stats.make_row('s', 'm', 'shm', [[1.0, 1.0, 1.0]], [[1.0, 1.0, 1.0]],
                                   [[1.3, 0.9, 1.02]])
    assert noisy['comm_cost_err'] > 0.05 and noisy['hidden_fraction'] is None
    # a slow drift of the load cancels in the paired figures
    drift = compare_stats.make_row('s', 'm', 'shm', [[1.0, 2.0, 3.0]], [[1.1, 2.2, 3.3]],
                                   [[1.2, 2.4, 3.6]])
    assert drift['comm_overhead'] == pytest.approx(0.1) and drift['comm_overhead_err'] < 1e-9
    assert drift['hidden_fraction'] == pytest.approx(0.5)
    assert drift['hidden_fraction_err'] == pytest.approx(0.0, abs=1e-12)
    med, err = compare_stats.median_and_error([1.0, 1.0, 1.0, 9.0])
    assert med == 1.0 and err == 0.0        # one stalled step does not count


def test_hidden_fraction_error_and_noise_verdict():
    # Paired steps whose hidden fraction scatters: saved/compute alternates
    # 0.05 / 0.15 around a cost of 0.2, so the estimate is 0.5 or 0.75 or
    # 0.25 depending on the resample: its bootstrap error is well above 0.
    n = 40
    c = np.ones(n)
    s = c + 0.2
    t = s - np.where(np.arange(n) % 2, 0.05, 0.15)
    assert compare_stats.paired_hidden_fraction(c, t, s) == pytest.approx(0.5)
    err = compare_stats.bootstrap_error(compare_stats.paired_hidden_fraction, (c, t, s))
    assert 0.05 < err < 0.5
    # the same seed gives the same error; no cost at all: no estimate
    assert compare_stats.bootstrap_error(compare_stats.paired_hidden_fraction, (c, t, s)) == err
    assert compare_stats.bootstrap_error(compare_stats.paired_hidden_fraction, (c, c, c)) is None
    rows = [compare_stats.make_row(compare_systems.SYSTEMS[0], 'm', 'shm', [list(c)], [list(t)],
                                   [list(s)]),
            compare_stats.make_row('pytorch/ddp-gloo', 'm', 'shm', [list(c)], [list(t - 0.01)],
                                   [list(s)])]
    assert rows[0]['hidden_fraction_err'] == pytest.approx(err)
    text = compare_verdicts.targets(rows)
    # DDP 0.55 against ours 0.50: not met, but well inside the combined error
    assert '0.50 +- ' in text and 'NOT met (within noise, +-' in text
    assert '+- ' in compare_verdicts.format_table(rows).splitlines()[2]


@pytest.mark.skipif(not HAVE_TORCH, reason='PyTorch (the [bench] extra) not installed')
def test_pytorch_twins_have_our_parameter_counts():
    from theanompi_ext.bench.ddp_worker import build_model, count_params
    from theanompi_ext.model import build_model as ours
    from theanompi_ext.model.resnet import cifar_resnet
    for name, spec in compare_systems.MODEL_SPECS.items():
        shape = tuple(spec['input_shape'])
        if spec['kind'] == 'cifar_resnet':
            net = cifar_resnet(shape, 10, depth=spec['depth'], width=spec['width'])
        else:
            net = ours(spec['kind'], shape, 10, width=spec['width'])
        mine = sum(int(p.get_value(borrow=True).size) for p in net.params)
        assert count_params(build_model(spec, 10)) == mine, name
    # the zoo's figures
    assert count_params(build_model(compare_systems.MODEL_SPECS['resnet20'])) == 272474
    assert count_params(build_model(compare_systems.MODEL_SPECS['resnet20_wide'])) == 4327754


def test_compare_without_torch_skips_ddp(tmp_path, monkeypatch, capsys):
    from theanompi_ext.bench import ddp_worker
    from theanompi_ext.cli.commands import build_parser
    seen = {}

    def fake_setting(spec, model, net, ranks, ddp, timeout):
        seen['ddp'] = ddp
        t = [[1.0], [1.0]]
        return compare_stats.summarize(model, 'shm', spec, [dict(
            compute=t, compute_chunked=t, serial=[[1.5], [1.5]], overlap=[[1.2], [1.2]],
            allreduce=[[0.4], [0.4]], grad_bytes=8, params=2, buckets=1, chunks=1, ranks=2)],
            {})
    monkeypatch.setattr(ddp_worker, 'torch_problem', lambda python=None: 'PyTorch is not installed')
    monkeypatch.setattr(compare, 'run_setting', fake_setting)
    out = tmp_path / 'rows.json'
    args = build_parser().parse_args(['bench', 'compare', '--quick', '--json', str(out)])
    assert args.func(args) == 0
    assert seen['ddp'] is None
    assert 'skipping PyTorch DDP' in capsys.readouterr().err
    rows = json.loads(out.read_text())
    assert [r['system'] for r in rows] == list(compare_systems.SYSTEMS[:2])
    assert rows[0]['hidden_fraction'] == pytest.approx(0.6)


def test_wire_ratio_and_bound_excess_by_hand():
    # per rank, per step: the job's step is the slower rank's
    r32 = dict(times_s=dict(allreduce=[[2.0, 4.0, 1.0], [1.0, 3.0, 1.5]]))
    r16 = dict(times_s=dict(allreduce=[[1.0, 1.0, 0.9], [0.5, 2.0, 0.1]]))
    # slower ranks: float32 2, 4, 1.5; float16 1, 2, 0.9 -> ratios 0.5, 0.5, 0.6
    ratio, err = compare_stats.wire_ratio(r16, r32)
    assert ratio == pytest.approx(0.5)
    assert err == pytest.approx(0.0)                 # MAD of (0.5, 0.5, 0.6) is 0
    # step 1.1 over max(1.0, 0.5); 2.0 over max(1.0, 1.6); 3.3 over max(3.0, 1.0)
    row = dict(times_s=dict(compute=[[1.0, 1.0, 3.0]], step=[[1.1, 2.0, 3.3]],
                            allreduce=[[0.5, 1.6, 1.0]]))
    excess, err = compare_stats.bound_excess(row)
    assert excess == pytest.approx(0.1)              # median of 0.1, 0.25, 0.1
    assert err == pytest.approx(0.0)
    # unequal lengths: cut to the shortest, as the other paired figures are
    row['times_s']['allreduce'] = [[0.5]]
    assert compare_stats.bound_excess(row)[0] == pytest.approx(0.1)


def fp16_rows():
    """summarize() over hand-made jobs: float32 and float16 wires, DDP with and
    without its hook at a 0.1 MB cap."""
    t = [[1.0, 1.0], [1.0, 1.0]]
    ours = dict(compute=t, compute_chunked=t, serial=[[2.0, 2.0]] * 2,
                overlap=[[1.4, 1.4]] * 2, allreduce=[[0.8, 0.8]] * 2,
                grad_bytes=8, params=2, buckets=1, chunks=2, ranks=2)
    ours.update({'serial-fp16': [[1.5, 1.5]] * 2, 'overlap-fp16': [[1.02, 1.02]] * 2,
                 'allreduce-fp16': [[0.44, 0.44]] * 2})
    ddp = dict(compute=t, serial=[[1.5, 1.5]] * 2, full=[[1.3, 1.3]] * 2,
               allreduce=[[0.5, 0.5]] * 2, grad_bytes=8, params=2, torch='x')
    spec = dict(batch=8, threads=1, wire_dtypes=['float32', 'float16'])
    return compare_stats.summarize(
        'm', 'shm', spec, [ours],
        {(0.1, 'none'): [ddp], (0.1, 'fp16'): [dict(ddp, hook_check={})]})


def test_fp16_systems_rows_and_targets():
    rows = fp16_rows()
    assert [r['system'] for r in rows] == [
        'theanompi_ext/ar-overlap', 'theanompi_ext/ar', 'theanompi_ext/ar-overlap-fp16',
        'theanompi_ext/ar-fp16', 'pytorch/ddp-gloo-0.1mb', 'pytorch/ddp-gloo-0.1mb-fp16']
    by = {r['system']: r for r in rows}
    ov16 = by['theanompi_ext/ar-overlap-fp16']
    # the 16-bit serial step is the fp16 'ar' step: cost 0.5, saved 0.48
    assert ov16['hidden_fraction'] == pytest.approx(0.96)
    assert ov16['wire_time_ratio'] == pytest.approx(0.55)      # 0.44 / 0.8
    assert ov16['bound_excess'] == pytest.approx(0.02)         # 1.02 / max(1, 0.44) - 1
    assert by['theanompi_ext/ar-overlap']['bound_excess'] == pytest.approx(0.4)
    assert [by[s]['wire_dtype'] for s in ('pytorch/ddp-gloo-0.1mb',
                                          'pytorch/ddp-gloo-0.1mb-fp16')] == ['float32', 'float16']
    text = compare_verdicts.targets(rows)
    # float32 against the plain DDP only, the 16-bit system against the hook only
    assert 'targets vs pytorch/ddp-gloo-0.1mb: overhead +40.0% vs +30.0%: NOT met' in text
    assert 'targets vs pytorch/ddp-gloo-0.1mb-fp16' not in text
    assert ('targets of theanompi_ext/ar-overlap-fp16 vs pytorch/ddp-gloo-0.1mb-fp16: '
            'overhead +2.0% vs +30.0%: met; hidden fraction 0.96 +- 0.00 vs 0.40 +- 0.00: met'
            in text)
    assert 'theanompi_ext/ar-overlap-fp16 vs pytorch/ddp-gloo-0.1mb:' not in text
    assert 'target float16 exchange time / float32: x0.550 +- 0.000 (x0.55 or less): met' in text
    assert ('target theanompi_ext/ar-overlap: step over max(compute, allreduce) +40.0% +- 0.0% '
            '(5% or less): NOT met' in text)
    assert 'target theanompi_ext/ar-overlap-fp16: step over max(compute, allreduce) +2.0%' in text


def test_fp16_hidden_fraction_met_only_above_the_combined_error():
    rows = fp16_rows()
    ours = next(r for r in rows if r['system'] == 'theanompi_ext/ar-overlap-fp16')
    ddp = next(r for r in rows if r['system'] == 'pytorch/ddp-gloo-0.1mb-fp16')
    ours.update(hidden_fraction=0.80, hidden_fraction_err=0.06)
    ddp.update(hidden_fraction=0.75, hidden_fraction_err=0.08)   # combined error 0.10
    line = compare_verdicts._target(ours, ddp, strict=True)
    assert line.endswith('hidden fraction 0.80 +- 0.06 vs 0.75 +- 0.08: '
                         'NOT met (within noise, +-0.10)'), line
    # the float32 rule (no smaller) calls the same figures met, within noise
    assert compare_verdicts._target(ours, ddp).endswith('met (within noise, +-0.10)')
    ours['hidden_fraction'] = 0.86                               # 0.11 above: met
    assert compare_verdicts._target(ours, ddp, strict=True).endswith('0.75 +- 0.08: met')
    # the exchange ratio's verdict: above 0.55 by less than its error
    ours.update(wire_time_ratio=0.57, wire_time_ratio_err=0.03, wire_dtype='float16')
    assert compare_verdicts._ratio_target(ours).endswith('x0.570 +- 0.030 (x0.55 or less): '
                                                         'NOT met (within noise, +-0.030)')


@pytest.mark.parametrize('bad', ['float8', 'float32,int8', 'float16,float16', ','])
def test_compare_refuses_bad_wire_dtype(bad, capsys):
    from theanompi_ext.cli.commands import build_parser
    args = build_parser().parse_args(['bench', 'compare', '--quick', '--wire-dtype', bad])
    assert args.func(args) == compare.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert 'theanompi-ext bench compare: error: --wire-dtype' in err
    name = {'float8': "'float8'", 'float32,int8': "'int8'"}.get(bad, repr(bad))
    assert name in err and 'float32, float16, bfloat16' in err


@pytest.mark.skipif(not HAVE_TORCH, reason='PyTorch (the [bench] extra) not installed')
def test_fp16_hook_check_fails_without_the_hook():
    """check_fp16_hook on one gloo rank: passes with the hook, refuses float32 gradients."""
    import torch
    import torch.distributed as dist
    from theanompi_ext.bench import ddp_worker
    dist.init_process_group('gloo', rank=0, world_size=1,
                            init_method='tcp://127.0.0.1:%d' % compare.free_port())
    try:
        checks = []
        for hook in ('fp16', 'none'):
            spec = dict(model_spec=compare_systems.MODEL_SPECS['digits_cnn'],
                        ddp_bucket_cap_mb=25, ddp_comm_hook=hook)
            ddp = ddp_worker._ddp(ddp_worker.build_model(spec['model_spec']), spec)
            params = [p for p in ddp.parameters() if p.requires_grad]
            x, y = torch.randn(4, 1, 8, 8), torch.randint(0, 10, (4,))

            def fwd_bwd():
                for p in params:
                    p.grad = None
                torch.nn.functional.cross_entropy(ddp(x), y).backward()
            try:
                checks.append(ddp_worker.check_fp16_hook(fwd_bwd, ddp, params, 1))
            except RuntimeError as exc:
                checks.append(str(exc))
    finally:
        dist.destroy_process_group()
    assert checks[0]['float16_exact'] and checks[0]['changed_by_rounding'] > 0
    assert 'fp16_compress_hook check failed' in checks[1] and "'float16_exact': False" in checks[1]
