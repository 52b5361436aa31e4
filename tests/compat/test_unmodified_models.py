"""Unmodified Theano-MPI models get the overlapped exchange and one step per iteration.

The models of tests/dropin/tmzoo/unmodified.py have neither ``tmx_layers``
nor ``load_train_batch``: native layers as cifar10.py's, a Lasagne VGG
chain and a Lasagne residual network with batch norm (on the Lasagne
stand-in of tests/fake_lasagne). Each trains 1 epoch on 2 real MPI ranks
with ``exch_strategy='ar-overlap'``, and all but the VGG chain also with
``'ar'`` (the VGG chain is a plain chain of layers, as the native layers
are: its serial run would check nothing the others do not), through one of
the three routes (``BSP().init``, the session launcher, the stand-in of
Theano-MPI's worker with ``install_into_theanompi()``; each model and each
route at least once) and must:

* say on its first log line that it overlaps, with the chunks it found;
* end on every rank where the serial run ends (1e-6, where one ran) and where the
  one-process float64 kn-sum reference ends (1e-5 relative,
  :mod:`support.graph_reference`), BN gamma/beta per rank included;
* never call the model's own compiled train functions (they count);
* leave the BN running statistics of every rank where one update per step
  leaves them (the reference's, 1e-5);
* (the residual network's overlapped run) show in its timeline a bucket
  transfer starting before the step's last backward chunk ends.

With dropout (a random stream in the graph) the overlapped run equals the
serial run.
"""
import json
import os
import re
import sys

import numpy as np
import pytest

import theanompi_ext.engine.core  # noqa: F401  (this process imports the models: Theano)
from support.paths import ROOT, TESTS
from support.procs import job, mpiexec

DROPIN = os.path.join(TESTS, 'dropin')
FAKE_LASAGNE = os.path.join(TESTS, 'fake_lasagne')
FAKE_THEANOMPI = os.path.join(TESTS, 'fake_theanompi')
for _path in (DROPIN, FAKE_LASAGNE):
    if _path not in sys.path:
        sys.path.insert(0, _path)
K = 2
TIMEOUT = 480
# Small buckets: several per step, so one can start while backprop still runs.
BUCKET_MB = 0.001
OVERLAP_LINE = re.compile(r'exchange mode ar-overlap:.*chunks found')


def _env(tmp_path, report, *paths, **extra):
    env = {'PYTHONPATH': os.pathsep.join(list(paths) + [DROPIN, FAKE_LASAGNE, ROOT] + [
        p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p]),
        'TMZOO_REPORT': str(report), 'HOME': str(tmp_path)}
    env.update(extra)
    return env


def _bsp(tmp_path, model, strategy, options):
    script = ('import sys\nfrom theanompi_ext import BSP\nrule = BSP()\n'
              'rule.exch_strategy = %r\n'
              'rule.init(["cpu0", "cpu1"], "tmzoo.unmodified", %r, **%r)\n'
              'sys.exit(rule.wait(timeout=%d))\n' % (strategy, model, options, TIMEOUT))
    return [sys.executable, '-c', script], ()


def _launcher(tmp_path, model, strategy, options):
    cfg = tmp_path / ('session-%s.cfg' % strategy)
    keys = ''.join('%s=%s\n' % (k.upper(), v) for k, v in options.items())
    cfg.write_text("RULE=BSP\nBSP_SYNC_TYPE='kn'\nBSP_EXCH_STRATEGY=%s\n"
                   'MODELFILE=tmzoo.unmodified\nMODELCLASS=%s\n'
                   'DEVICES=("localhost:cpu0"\n         "localhost:cpu1")\n%s'
                   % (strategy, model, keys))
    return [sys.executable, '-m', 'theanompi_ext.tmlauncher', '-cfg=%s' % cfg], ()


def _theanompi(tmp_path, model, strategy, options):
    # Theano-MPI's worker reads the user's .theanorc (it refuses THEANO_FLAGS).
    (tmp_path / '.theanorc').write_text(
        '[global]\nfloatX = float32\nbase_compiledir = %s\n\n[blas]\nldflags =\n'
        % os.environ['THEANOMPI_EXT_CACHE'])
    from theanompi_ext.theanompi_compat.options import option_env_name
    cmd = [mpiexec(), '-n', str(K), sys.executable, '-m', 'theanompi.worker', 'cpu', 'kn',
           strategy, 'tmzoo.unmodified_tm', model]
    return cmd, [(option_env_name(k), str(v)) for k, v in options.items()]


ROUTES = {'bsp': _bsp, 'launcher': _launcher, 'theanompi': _theanompi}


def train(tmp_path, model, route, strategy, **options):
    """Run ``model`` on K ranks; returns (stdout, [rank r's report])."""
    options = dict(bucket_cap_mb=BUCKET_MB, first_bucket_cap_mb=BUCKET_MB, **options)
    report = tmp_path / ('report-' + strategy)
    report.mkdir()
    cmd, env_options = ROUTES[route](tmp_path, model, strategy, options)
    env = _env(tmp_path, report, *([FAKE_THEANOMPI] if route == 'theanompi' else []),
               **dict(env_options))
    rc, out, err, _ = job(cmd, timeout=TIMEOUT, env=env, unset=('THEANO_FLAGS', 'THEANORC'))
    assert rc == 0, '%s %s (%s) failed:\n%s\n%s' % (model, strategy, route, out[-6000:],
                                                    err[-6000:])
    reports = []
    for r in range(K):
        with open(str(report / ('rank%d.json' % r))) as f:
            reports.append(json.load(f))
    return out, reports


def exchange_line(stdout):
    """The first line saying which exchange mode the run took (rank 0's)."""
    lines = [l for l in stdout.splitlines() if 'exchange mode' in l]
    return lines[0] if lines else '(no line with "exchange mode" in the output:\n%s)' % stdout


def rel_diff(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want.reshape(got.shape))) / max(np.max(np.abs(want)),
                                                                     1e-12))


def differences(what, got, want, tol):
    """Messages for the arrays of ``got`` further than ``tol`` (relative) from ``want``."""
    if len(got) != len(want):
        return ['%s: %d arrays, expected %d' % (what, len(got), len(want))]
    return ['%s[%d]: relative difference %.3g > %g' % (what, i, d, tol)
            for i, d in enumerate(rel_diff(g, w) for g, w in zip(got, want)) if d > tol]


_REFS = {}


def reference(model):
    if model not in _REFS:
        from support.graph_reference import reference_run
        from tmzoo import unmodified
        _REFS[model] = reference_run(getattr(unmodified, model), K)[0]
    return _REFS[model]


def started_after_backprop(trace):
    """Steps (rank, step name) in which no bucket's transfer started before
    their last backward chunk ended, and the number of chunks per step.

    The exchanger launches a bucket between chunks, and the communicator
    hands the GIL to its idle thread until the transfer has started
    (collective/mpi.py, ``thread_handoff``): every step's first bucket must
    be moving before backprop ends. Without the hand-off, the thread waited
    for the GIL that a compiled chunk holds, and with this model's 0.1 ms
    chunks the transfer started as backprop ended (measured: launched
    0.07-1 ms early, started after the last chunk in 11 of 12 steps)."""
    from theanompi_ext.exchange import timeline as tl
    tl.check_trace(trace)
    xs = [e for e in trace['traceEvents'] if e.get('ph') == 'X']
    late, chunks = [], set()
    for step in (e for e in xs if e['tid'] == tl.COMPUTE_TID and e['name'].startswith('step ')):
        t0, t1 = step['ts'], step['ts'] + step['dur']

        def inside(e):
            return e['pid'] == step['pid'] and t0 <= e['ts'] <= t1
        backward = [e for e in xs if e['tid'] == tl.COMPUTE_TID and inside(e) and
                    e['name'].startswith('backward:')]
        buckets = [e for e in xs if e['tid'] == tl.COMM_TID and inside(e)]
        chunks.add(len(backward))
        end = max([c['ts'] + c['dur'] for c in backward], default=t0)
        if not buckets or min(b['ts'] for b in buckets) >= end:
            late.append((step['pid'], step['name']))
    return late, chunks


def check_unmodified(tmp_path, model, route, timeline=False, serial_too=True):
    prefix = str(tmp_path / 'trace')
    over_out, over = train(tmp_path, model, route, 'ar-overlap',
                           **({'timeline': prefix} if timeline else {}))
    runs = [('overlap', over)]
    ref = reference(model)
    problems = []
    line = exchange_line(over_out)
    if not OVERLAP_LINE.search(line):
        problems.append('overlapped run, first exchange line: %s' % line)
    if serial_too:
        serial_out, serial = train(tmp_path, model, route, 'ar')
        runs.append(('serial', serial))
        if 'exchange mode ar:' not in exchange_line(serial_out):
            problems.append('serial run, first exchange line: %s' % exchange_line(serial_out))
    for r in range(K):
        for name, rep in runs:
            if rep[r]['own_train_calls'] != 0:
                problems.append('%s rank %d: the model\'s own train functions ran %d times'
                                % (name, r, rep[r]['own_train_calls']))
            problems += differences('rank %d %s vs reference params' % (r, name),
                                    rep[r]['params'], ref[r]['params'], 1e-5)
            problems += differences('rank %d %s vs reference BN statistics' % (r, name),
                                    rep[r]['bn_stats'], ref[r]['bn_stats'], 1e-5)
        if serial_too:
            problems += differences('rank %d overlap vs serial params' % r, over[r]['params'],
                                    serial[r]['params'], 1e-6)
    if timeline:
        with open(prefix + '.json') as f:
            late, chunks = started_after_backprop(json.load(f))
        if min(chunks) < 2:
            problems.append('timeline: steps with %s backward chunk(s)' % sorted(chunks))
        if late:
            problems.append('timeline: no bucket transfer started before the last backward '
                            'chunk ended in (rank, step) %s' % late)
    assert not problems, '%s via %s:\n%s' % (model, route, '\n'.join(problems))


# Each model once, each route once (CI budget: no serial run for the VGG chain).
@pytest.mark.parametrize('model,route,serial_too', [('NativeLayers', 'theanompi', True),
                                                    ('LasagneVGG', 'launcher', False)])
def test_unmodified_model_overlaps_in_one_step(tmp_path, model, route, serial_too):
    check_unmodified(tmp_path, model, route, serial_too=serial_too)


def test_residual_bn_model_overlaps_in_one_step(tmp_path):
    # The residual network through BSP().init, with its timeline.
    check_unmodified(tmp_path, 'LasagneResNet', 'bsp', timeline=True)


def test_dropout_overlap_equals_serial(tmp_path):
    _, serial = train(tmp_path, 'NativeLayersDropout', 'bsp', 'ar')
    out, over = train(tmp_path, 'NativeLayersDropout', 'bsp', 'ar-overlap')
    problems = [] if OVERLAP_LINE.search(exchange_line(out)) else \
        ['first exchange line: %s' % exchange_line(out)]
    for r in range(K):
        problems += differences('rank %d overlap vs serial params' % r, over[r]['params'],
                                serial[r]['params'], 1e-6)
    assert not problems, '\n'.join(problems)


def test_models_are_unmodified():
    # What the tests above rely on: nothing written for theanompi_ext, and a
    # model whose own train function runs counts it.
    from tmzoo import unmodified

    class Rec(object):
        def __getattr__(self, name):
            return lambda *a, **k: None
    m = unmodified.LasagneVGG({'verbose': False, 'rank': 0, 'size': K})
    for cls in (unmodified.NativeLayers, unmodified.LasagneVGG, unmodified.LasagneResNet):
        for attr in ('tmx_layers', 'load_train_batch', 'tmx_options'):
            assert not hasattr(cls, attr)
    assert not hasattr(m, 'tmx_layers') and not hasattr(m, 'load_train_batch')
    m.compile_iter_fns('avg')
    m.train_iter(0, Rec())
    assert int(m.own_calls.get_value()) == 2          # descent_vel + get_vel


def test_residual_blocks_are_cut_at_their_outputs():
    # The chunks found in the residual network's graph: every block (both
    # branches and the sum) inside one chunk, every parameter in exactly one.
    from lasagne.layers import get_all_layers
    from theanompi_ext.theanompi_compat.chunks import find_chunks
    from tmzoo import unmodified
    m = unmodified.LasagneResNet({'verbose': False, 'rank': 0, 'size': K})
    found = find_chunks(m)
    assert found.entries is not None, found.why
    chunk_of = {}
    for i, (_, _, params) in enumerate(found.entries):
        for p in params:
            assert p not in chunk_of, 'a parameter in two chunks'
            chunk_of[p] = i
    assert set(chunk_of) == set(m.params)
    for before, block in (('stem', 'res1'), ('res1', 'res2')):
        inside = [l for l in get_all_layers(m.net[block], treat_as_input=[m.net[before]])
                  if l is not m.net[before]]
        params = [p for l in inside for p in l.get_params(trainable=True)]
        assert len(params) >= 6
        assert len({chunk_of[p] for p in params}) == 1, \
            '%s is cut inside: %s' % (block, found.why)
    assert len(found.entries) >= 4, found.why       # stem | res1 | res2 | head at least


def test_lasagne_stand_in_keeps_lasagnes_conventions():
    # Names, tags and the running statistics the models above rely on.
    import lasagne
    from lasagne.layers import (InputLayer, DenseLayer, BatchNormLayer, get_all_params,
                                get_all_layers, get_output)
    from theanompi_ext.engine.core import theano
    lasagne.random.set_rng(np.random.RandomState(0))
    inp = InputLayer((None, 3))
    named = DenseLayer(inp, 2, name='fc')
    bn = BatchNormLayer(named, alpha=0.5)
    top = DenseLayer(bn, 2, nonlinearity=None)
    assert [p.name for p in named.params] == ['fc.W', 'fc.b']
    assert [p.name for p in top.params] == ['W', 'b']
    assert get_all_layers(top) == [inp, named, bn, top] and top.input_layer is bn
    assert get_all_params(top, trainable=True) == [named.W, named.b, bn.beta, bn.gamma,
                                                   top.W, top.b]
    assert get_all_params(top, batch_norm_stat=True) == [bn.mean, bn.inv_std]
    assert get_all_params(top, regularizable=False) == [named.b, bn.beta, bn.mean,
                                                       bn.inv_std, top.b]
    x = theano.tensor.matrix('x')
    train = theano.function([x], get_output(bn, x))
    test = theano.function([x], get_output(bn, x, deterministic=True))
    batch = np.random.RandomState(1).rand(5, 3).astype(np.float32)
    h = np.maximum(batch @ named.W.get_value() + named.b.get_value(), 0)
    train(batch)                                  # one call, one update with alpha = 0.5
    np.testing.assert_allclose(bn.mean.get_value(), 0.5 * h.mean(0), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(bn.inv_std.get_value(),
                               0.5 + 0.5 / np.sqrt(h.var(0) + 1e-4), rtol=1e-5)
    before = bn.mean.get_value().copy()
    out = test(batch)                             # running statistics used, not updated
    np.testing.assert_array_equal(bn.mean.get_value(), before)
    np.testing.assert_allclose(out, (h - before) * bn.inv_std.get_value(), rtol=1e-5,
                               atol=1e-6)
