"""Theano-MPI model files run unchanged: sub-batches, inputs transformed in the graph.

The models of tests/dropin/tmzoo/ are laid out as Theano-MPI's cifar10.py
and Lasagne zoo are (file batch = 2 sub-batches, ``subb_ind``,
``shared_x_slice``, c01b data dimshuffled inside the graph, a package that
imports Theano at its top). Each trains 2 epochs on 2 real MPI ranks through
``BSP().init``, the session launcher and the stand-in of Theano-MPI's own
worker (with ``install_into_theanompi()``), serial and overlapped, and must
end where an independent numpy float64 reference of kn-sum SGD over the same
sub-batches ends, to 1e-5 relative.
"""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import theanompi_ext.engine.core  # noqa: F401  (this process imports tmzoo, which imports Theano)
from support.paths import ROOT
from support.procs import mpiexec
from support.sgd_reference import goyal_lr, momentum_step

DROPIN = os.path.join(ROOT, 'tests', 'dropin')
FAKE = os.path.join(ROOT, 'tests', 'fake_theanompi')
sys.path.insert(0, DROPIN)
K = 2
TIMEOUT = 240


def reference(model):
    """numpy float64 kn-sum SGD (eq. 9 momentum, decay on every param, linear scaling
    and a gradual warm-up over the first half of training, by hand)."""
    from tmzoo import subbatch as sb
    cifar = model.startswith('Cifar10Like')
    X, Y = sb.load_digits_c01b()
    X = X.astype(np.float64)
    side = 8 - 2 * sb.CROP if cifar else 8
    params = [p.astype(np.float64) for p in sb.init_params(side)]
    vel = [np.zeros_like(p) for p in params]
    mean = sb.image_mean().astype(np.float64)
    n_subb = sb.file_batch_size // sb.batch_size
    per_epoch = sb.N_BATCH_TRAIN * n_subb
    kn = K * sb.batch_size
    warmup_iters = per_epoch * sb.n_epochs // 2
    it = 0
    for _ in range(sb.n_epochs):
        for i in range(sb.N_BATCH_TRAIN):
            for s in range(n_subb):
                idx = sb.global_subbatch(K, i, s)
                x, y = X[idx], Y[idx]
                if cifar:
                    c = sb.CROP
                    x = (x - mean)[:, :, c:c + side, c:c + side]
                grads = _grads(params, x, y)
                lr = goyal_lr(it, sb.learning_rate, kn, sb.batch_size, warmup_iters)
                momentum_step(params, vel, grads, lr, sb.momentum, sb.weight_decay)
                it += 1
    return params, it


def _grads(params, x, y, loss_only=False):
    """Gradients (or the value) of the mean NLL of conv3x3(valid, correlation)+relu -> softmax."""
    W1, b1, W2, b2 = params
    b, side = x.shape[0], x.shape[2] - 2
    patches = np.stack([np.stack([x[:, :, u:u + side, v:v + side] for v in range(3)], -1)
                        for u in range(3)], -2)               # b c i j u v
    pre = np.einsum('bcijuv,fcuv->bfij', patches, W1) + b1[None, :, None, None]
    h = np.maximum(pre, 0)
    z = h.reshape(b, -1) @ W2 + b2
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    if loss_only:
        return float(-np.mean(np.log(p[np.arange(b), y])))
    dz = p.copy()
    dz[np.arange(b), y] -= 1
    dz /= b
    gW2, gb2 = h.reshape(b, -1).T @ dz, dz.sum(0)
    dpre = (dz @ W2.T).reshape(h.shape) * (pre > 0)
    gW1 = np.einsum('bcijuv,bfij->fcuv', patches, dpre)
    return [gW1, dpre.sum((0, 2, 3)), gW2, gb2]


_REFS = {}


def assert_matches_reference(model, params, rel=1e-5):
    if model not in _REFS:
        _REFS[model] = reference(model)
    ref, _ = _REFS[model]
    for i, (got, want) in enumerate(zip(params, ref)):
        got = np.asarray(got, np.float64).reshape(want.shape)
        diff = np.max(np.abs(got - want)) / np.max(np.abs(want))
        assert diff <= rel, 'param %d: max relative difference %.3g from the reference' % (i, diff)


def env_with(*paths, home=None):
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join(list(paths) + [ROOT] + [
        p for p in env.get('PYTHONPATH', '').split(os.pathsep) if p])
    env.pop('THEANO_FLAGS', None)      # as a user has it: nothing set by hand
    if home is not None:
        env['HOME'] = str(home)
        env.pop('THEANORC', None)
    return env


def load_npz(out):
    d = np.load(os.path.join(str(out), 'params.npz'))
    by_index = {int(k.split('_')[0]): d[k] for k in d.files}
    return [by_index[i] for i in range(4)]


def run(cmd, cwd, env, timeout=TIMEOUT):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                              env=env, start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        pytest.fail('%s hung:\n%s\n%s' % (cmd, exc.stdout, exc.stderr))


# Each route trains both models and uses both strategies (CI budget: 6 runs, not 12).
PAIRS = [('Cifar10Like', 'ar'), ('C01bLasagneLike', 'ar-overlap')]
SWAPPED = [('Cifar10Like', 'ar-overlap'), ('C01bLasagneLike', 'ar')]


def model_class(model, strategy):
    return model + ('Layered' if strategy == 'ar-overlap' else '')


@pytest.mark.parametrize('model,strategy', PAIRS)
def test_bsp_rule(tmp_path, model, strategy):
    # BSP().init from a script, HOME without .theanorc: the package imports Theano at its top.
    script = ('import sys\nfrom theanompi_ext import BSP\nrule = BSP()\n'
              'rule.exch_strategy = %r\n'
              'rule.init(["cpu0", "cpu1"], "tmzoo.subbatch", %r, out=%r, snapshot_freq=1)\n'
              'sys.exit(rule.wait(timeout=%d))\n'
              % (strategy, model_class(model, strategy), str(tmp_path / 'out'), TIMEOUT))
    res = run([sys.executable, '-c', script], DROPIN, env_with(DROPIN, home=tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    assert 'batch 2 x 8 = 16 per iteration (one iteration = one sub-batch; model feed: ' \
        '2 sub-batch(es) of 8 per file batch' in res.stdout
    assert '6 iterations per epoch' in res.stdout
    assert ('exchange mode %s:' % strategy) in res.stdout
    summary = json.load(open(str(tmp_path / 'out' / 'summary.json')))
    assert summary['iterations'] == _iterations(model)
    assert_matches_reference(model, load_npz(tmp_path / 'out'))
    # What a Theano-MPI user looks for: the per-epoch record, its plot, snapshots.
    from theanompi_ext.theanompi_compat.outputs import read_record
    record = read_record(str(tmp_path / 'out'))
    assert [r['epoch'] for r in record] == [1, 2]
    assert [r['iterations'] for r in record] == [6, 12]
    assert all(np.isfinite(r['val_loss']) and r['epoch_s'] > 0 and r['times_s']['calc+comm'] > 0
               for r in record)
    assert (tmp_path / 'out' / 'record.png').stat().st_size > 0
    # Validation ran over every sub-batch of every rank's file batch, at the final parameters.
    assert record[-1]['val_loss'] == pytest.approx(_val_loss(model), rel=1e-4)
    import h5py
    from theanompi_ext.files.sealed import read_sealed
    for epoch in (1, 2):
        snap_path = str(tmp_path / 'out' / 'snapshots' / ('params_epoch%03d.h5' % epoch))
        read_sealed(snap_path)                  # whole: its checksum matches
        with h5py.File(snap_path, 'r') as f:
            assert f.attrs['epoch'] == epoch and f.attrs['iterations'] == 6 * epoch
            snap = [f[k][()] for k in sorted(f.keys())]
    assert_matches_reference(model, snap)


def _val_loss(model):
    """Mean NLL of the reference's final parameters over all validation sub-batches."""
    from tmzoo import subbatch as sb
    if model not in _REFS:
        _REFS[model] = reference(model)
    params = _REFS[model][0]
    X, Y = sb.load_digits_c01b()
    idx = np.concatenate([sb.global_subbatch(K, i, s, 'val') for i in range(sb.N_BATCH_VAL)
                          for s in range(sb.file_batch_size // sb.batch_size)])
    x = X[idx].astype(np.float64)
    if model.startswith('Cifar10Like'):
        c = sb.CROP
        x = (x - sb.image_mean())[:, :, c:8 - c, c:8 - c]
    return _grads(params, x, Y[idx], loss_only=True)


def _iterations(model):
    if model not in _REFS:
        _REFS[model] = reference(model)
    return _REFS[model][1]


@pytest.mark.parametrize('model,strategy', SWAPPED)
def test_session_launcher(tmp_path, model, strategy):
    # Theano-MPI's own session keys and quoting, a two-host DEVICES array on this host.
    cfg = tmp_path / 'session.cfg'
    cfg.write_text('# launch_session.cfg as Theano-MPI writes it\nRULE=BSP\n'
                   "BSP_SYNC_TYPE='kn'\nBSP_EXCH_STRATEGY=%s\n"
                   'MODELFILE=tmzoo.subbatch\nMODELCLASS=%s\n'
                   'DEVICES=("localhost:cpu0"\n         "localhost:cpu1")\nOUT=%s\n'
                   % (strategy, model_class(model, strategy), tmp_path / 'out'))
    res = run([sys.executable, '-m', 'theanompi_ext.tmlauncher', '-cfg=%s' % cfg], DROPIN,
              env_with(DROPIN, home=tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    assert ('exchange mode %s:' % strategy) in res.stdout
    assert_matches_reference(model, load_npz(tmp_path / 'out'))


def write_theanorc(home):
    """A Theano-MPI user's .theanorc (Theano-MPI refuses THEANO_FLAGS)."""
    (home / '.theanorc').write_text(
        '[global]\nfloatX = float32\nbase_compiledir = %s\n\n[blas]\nldflags =\n'
        % os.environ['THEANOMPI_EXT_CACHE'])


@pytest.mark.parametrize('model,strategy', PAIRS)
def test_theanompi_worker_with_install(tmp_path, model, strategy):
    # Theano-MPI's own worker loop (stand-in): sub-batches, lr_warmup, install in the model file.
    write_theanorc(tmp_path)
    cmd = [mpiexec(), '-n', str(K), sys.executable, '-m', 'theanompi.worker', 'cpu',
           'kn', strategy, 'tmzoo.with_tmx', model_class(model, strategy)]
    res = run(cmd, DROPIN, env_with(FAKE, DROPIN, home=tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Theano-MPI's lr_warmup is off" in res.stdout
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out['exchanger'] == 'theanompi_ext.theanompi_compat.exchanger'
    steps = _iterations(model)
    assert out['modes']['comm'] == steps and out['modes']['sync'] == steps
    assert out['shared_lr'] == pytest.approx(0.05)       # not raised by k**(1/5) per epoch
    for rank_params in out['params']:
        assert_matches_reference(model, rank_params)


@pytest.mark.parametrize('cls,needle', [
    ('UnfedInput', 'model.cost depends on symbolic input(s) temperature'),
    ('NoSubbatchIndex', 'model.n_subb = 2 but the model has no model.subb_ind'),
])
def test_unrecognisable_feed_is_refused(cls, needle):
    from theanompi_ext.theanompi_compat.feed import ModelFeed
    from tmzoo import subbatch as sb
    model = getattr(sb, cls)({'verbose': False, 'rank': 0, 'size': 1})
    with pytest.raises(ValueError) as exc:
        ModelFeed(model, None)
    assert needle in str(exc.value)


def test_subbatch_size_must_be_the_batch_size():
    from theanompi_ext.theanompi_compat.feed import ModelFeed
    from tmzoo import subbatch as sb
    model = sb.Cifar10Like({'verbose': False, 'rank': 0, 'size': 1})
    model.batch_size = 16          # claims the file batch is one batch; its slice says 8
    with pytest.raises(ValueError, match='sub-batch holds 8 examples .* batch size is 16'):
        ModelFeed(model, None)


def test_refused_before_the_first_step_on_every_rank(tmp_path):
    # Through BSP().init: the job fails, the message names what was not understood and where.
    script = ('import sys\nfrom theanompi_ext import BSP\nrule = BSP()\n'
              'rule.init(["cpu0", "cpu1"], "tmzoo.subbatch", "NoSubbatchIndex", out=%r)\n'
              'sys.exit(rule.wait(timeout=%d))\n' % (str(tmp_path / 'out'), TIMEOUT))
    res = run([sys.executable, '-c', script], DROPIN, env_with(DROPIN, home=tmp_path))
    assert res.returncode != 0
    assert 'failed: ValueError: model.n_subb = 2 but the model has no model.subb_ind' \
        in res.stderr
    assert 'theanompi_compat/feed.py:' in res.stderr          # file and line, by default
    assert not (tmp_path / 'out' / 'params.npz').exists()


def test_model_error_names_its_file_and_line():
    from theanompi_ext.train.error_location import error_location
    from tmzoo import subbatch as sb
    model = sb.RaisesInTrainIter({'verbose': False, 'rank': 0, 'size': 1})
    try:
        model.train_iter(3, None)
    except KeyError as exc:
        where = error_location(exc)
    line = [i for i, text in enumerate(open(sb.__file__), 1) if 'no such file batch' in text][0]
    assert where == '%s:%d in train_iter' % (sb.__file__, line)


def two_host_session(tmp_path, **hosts_kw):
    """Run a session of :data:`SWAPPED`'s first pair with a two-host ``DEVICES`` on 2
    emulated hosts (``hosts_kw`` for :class:`EmulatedHosts`; root, else a skip)."""
    from theanompi_ext.launch.emulated_hosts import EmulatedHosts, hosts_problem
    why = hosts_problem()
    if why:
        pytest.skip(why)
    model, strategy = SWAPPED[0]
    cfg = tmp_path / 'session.cfg'
    cfg.write_text("RULE=BSP\nBSP_SYNC_TYPE='kn'\nBSP_EXCH_STRATEGY=%s\n"
                   'MODELFILE=tmzoo.subbatch\nMODELCLASS=%s\n'
                   'DEVICES=("tmxh0:cpu0"\n         "tmxh1:cpu0")\nOUT=%s\n'
                   % (strategy, model_class(model, strategy), tmp_path / 'out'))
    with EmulatedHosts(hosts=2, ranks_per_host=1, **hosts_kw) as eh:
        return run([sys.executable, '-m', 'theanompi_ext.tmlauncher', '-cfg=%s' % cfg], DROPIN,
                   eh.env(env_with(DROPIN, home=tmp_path)))


@pytest.mark.root
def test_session_launcher_with_two_host_devices(tmp_path):
    """Theano-MPI's multi-node DEVICES on 2 emulated hosts (issue 28): each rank runs on
    its host (the first lines say so) and training ends at the reference."""
    model = SWAPPED[0][0]
    res = two_host_session(tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert lines[:2] == ['rank 0 of 2: host tmxh0, local rank 0, device cpu0',
                         'rank 1 of 2: host tmxh1, local rank 0, device cpu0'], res.stdout
    assert_matches_reference(model, load_npz(tmp_path / 'out'))


@pytest.mark.root
def test_session_with_another_install_on_the_far_host(tmp_path):
    """The same session, the far host having its own copy of the package one line
    apart: refused before the model loads, status 2, both hosts named
    (launch/same_software.py)."""
    from support.installs import another_install
    pkg, copy = another_install(tmp_path)
    res = two_host_session(tmp_path, unshared={1: {pkg: copy}})
    assert res.returncode == 2, res.stdout + res.stderr
    assert re.search(r'SoftwareMismatch: the ranks do not all run the same software: '
                     r'theanompi_ext \S+, source \w+ \(rank 0 on tmxh0 from %s\) vs \S+, source '
                     r'\w+ \(rank 1 on tmxh1 from ' % re.escape(pkg), res.stderr), res.stderr
    assert not (tmp_path / 'out' / 'params.npz').exists()
