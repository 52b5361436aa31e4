"""Drop-in for Theano-MPI users: BSP rule, session-file launcher, exchanger.

A model written only to Theano-MPI's contract (tests/dropin/digits_contract.py,
plain Theano, no theanompi_ext layers) trains a few steps on 2 real MPI
ranks (the session launcher with overlap also on 3); every route must give
the parameters of a numpy single-process reference of kn-sum SGD on the
same global batches, its learning rate computed by hand (tests/support/sgd_reference.py).
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from support.paths import ROOT
from support.procs import mpiexec
from support.sgd_reference import goyal_lr, momentum_step

DROPIN = os.path.join(ROOT, 'tests', 'dropin')
FAKE = os.path.join(ROOT, 'tests', 'fake_theanompi')
sys.path.insert(0, DROPIN)
K = 2
TIMEOUT = 240


def env_with(*paths):
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join(list(paths) + [ROOT] + [
        p for p in env.get('PYTHONPATH', '').split(os.pathsep) if p])
    return env


def reference(steps, k=K):
    """numpy float64 at k ranks: kn-mean gradient, decay on every param, eq. (9),
    linear scaling from the model's base_lr 0.05 at its batch, gradual warm-up
    over the first epoch."""
    import digits_contract as dc
    X, Y = dc.load_digits_arrays()
    X, Y = X[:dc.N_TRAIN].astype(np.float64), Y[:dc.N_TRAIN]
    W1, b1, W2, b2 = [p.astype(np.float64) for p in dc.init_params()]
    u = [np.zeros_like(p) for p in (W1, b1, W2, b2)]
    kn = k * dc.BATCH
    per_epoch = dc.N_TRAIN // kn
    for it in range(steps):
        b = it % per_epoch                      # epoch 2 starts over
        x, y = X[b * kn:(b + 1) * kn], Y[b * kn:(b + 1) * kn]
        h = np.tanh(x @ W1 + b1)
        z = h @ W2 + b2
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        dz = p.copy()
        dz[np.arange(kn), y] -= 1
        dz /= kn
        gW2, gb2 = h.T @ dz, dz.sum(0)
        dh = (dz @ W2.T) * (1 - h ** 2)
        gW1, gb1 = x.T @ dh, dh.sum(0)
        lr = goyal_lr(it, 0.05, kn, dc.BATCH, warmup_iters=per_epoch)
        momentum_step((W1, b1, W2, b2), u, (gW1, gb1, gW2, gb2), lr, 0.9, 1e-3)
    return [W1, b1, W2, b2]


def assert_matches(params, ref):
    for got, want in zip(params, ref):
        np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=2e-4, atol=2e-5)


def load_npz(out):
    d = np.load(os.path.join(out, 'params.npz'))
    by_index = {int(k.split('_')[0]): d[k] for k in d.files}
    return [by_index[i] for i in range(4)]


@pytest.fixture(scope='module')
def ref6():
    return reference(6)


def test_bsp_rule_matches_reference(tmp_path, ref6, monkeypatch):
    # BSP().init(...) + wait(), the model without the batch-loading hook (fallback path).
    from theanompi_ext import BSP
    monkeypatch.chdir(DROPIN)
    monkeypatch.setenv('PYTHONPATH', env_with(DROPIN)['PYTHONPATH'])
    rule = BSP()
    rule.init(['cpu0', 'cpu1'], 'digits_contract', 'DigitsMLP', max_steps=6, out=str(tmp_path))
    assert rule.wait(timeout=TIMEOUT) == 0
    assert_matches(load_npz(str(tmp_path)), ref6)
    summary = json.load(open(os.path.join(str(tmp_path), 'summary.json')))
    assert summary['iterations'] == 6 and summary['devices'] == ['cpu0', 'cpu1']


def test_bsp_rule_overlap_with_tmx_layers(tmp_path, ref6, monkeypatch, capfd):
    # The model lists its layers: ar-overlap really overlaps, same numbers.
    from theanompi_ext import BSP
    monkeypatch.chdir(DROPIN)
    monkeypatch.setenv('PYTHONPATH', env_with(DROPIN)['PYTHONPATH'])
    rule = BSP()
    rule.exch_strategy = 'ar-overlap'
    rule.init(['cpu0', 'cpu1'], 'digits_contract', 'DigitsMLPLayered', max_steps=6,
              out=str(tmp_path))
    assert rule.wait(timeout=TIMEOUT) == 0
    assert 'exchange mode ar-overlap: per-bucket allreduce during a chunked backward pass' \
        ', 2 chunks declared in model.tmx_layers' in capfd.readouterr().out
    assert_matches(load_npz(str(tmp_path)), ref6)
    summary = json.load(open(os.path.join(str(tmp_path), 'summary.json')))
    assert summary['mode'] == 'ar-overlap' and summary['iterations'] == 6


def test_contract_overlap_equals_serial_in_chunks():
    # One process (local communicator): the chunked backward on the model's own
    # graph gives the serial path's gradients and parameters.
    from theanompi_ext.collective import create_communicator
    from theanompi_ext.theanompi_compat.stepper import ContractStepper
    from theanompi_ext.theanompi_compat.options import resolve_options
    import digits_contract as dc
    runs = {}
    for overlap in (False, True):
        model = dc.DigitsMLPLayered({'verbose': False, 'rank': 0, 'size': 1})
        comm = create_communicator('local')
        opts = resolve_options(model, environ={})
        opts.update(bucket_cap_mb=0.001, first_bucket_cap_mb=0.001)
        st = ContractStepper(model, comm, 'kn', opts, log=lambda *a: None, overlap=overlap)
        if overlap:
            assert st.backward.n_chunks == 2 and len(st.buckets) >= 2
        for i in range(4):
            model.load_train_batch(i)
            st.step()
        runs[overlap] = st.params.values.copy()
    np.testing.assert_allclose(runs[True], runs[False], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize('layers,needle', [
    ([], 'model.tmx_layers is empty'),
    ([object()], 'model.tmx_layers[0]'),
    ('swapped', 'must be in forward order'),
    ('foreign', "not part of model.cost's graph"),
])
def test_bad_tmx_layers_are_refused(layers, needle):
    from theanompi_ext.theanompi_compat.graph import ContractGraph
    import digits_contract as dc
    model = dc.DigitsMLPLayered({'verbose': False, 'rank': 0, 'size': 1})
    W1, b1, W2, b2 = model.params
    if layers == 'swapped':
        layers = [(model.p, [W2, b2]), (model.h, [W1, b1])]
    elif layers == 'foreign':
        import theano.tensor as T
        layers = [(T.tanh(T.dot(model.x, W1)), [W1, b1]), (model.p, [W2, b2])]
    model.tmx_layers = layers
    with pytest.raises(ValueError) as exc:
        ContractGraph(model, 0.5)
    assert needle in str(exc.value)


def run_launcher(args, cwd, timeout=TIMEOUT):
    cmd = [sys.executable, '-m', 'theanompi_ext.tmlauncher'] + args
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                              env=env_with(DROPIN), start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        pytest.fail('tmlauncher hung:\n%s\n%s' % (exc.stdout, exc.stderr))


def test_tmlauncher_matches_reference(tmp_path, ref6):
    # Session file, the model with the load_train_batch hook, a .py path as MODELFILE.
    cfg = tmp_path / 'session.cfg'
    cfg.write_text('# a Theano-MPI session\nRULE=BSP\nMODELFILE=%s\nMODELCLASS=DigitsMLPHooked\n'
                   'DEVICES=cpu0,cpu1\nSYNC_TYPE=kn\nEXCH_STRATEGY=ar-overlap\n'
                   'MAX_STEPS=6\nOUT=%s\n' % (os.path.join(DROPIN, 'digits_contract.py'),
                                             tmp_path / 'out'))
    res = run_launcher(['-cfg=%s' % cfg], cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr
    # rank 0 says which mode it chose and why: the model lists no layers, its
    # graph has the cut between the hidden layer and the classifier
    assert 'exchange mode ar-overlap:' in res.stdout
    assert '2 chunks found in the Theano graph from model.x to model.cost' in res.stdout
    assert_matches(load_npz(str(tmp_path / 'out')), ref6)


def test_tmlauncher_overlap_on_3_ranks_matches_reference(tmp_path):
    # The default exchange (ar-overlap) of the model that lists its layers, on 3 ranks:
    # kn = 48, 33 iterations per epoch, so the 6 steps are all inside the warm-up.
    cfg = tmp_path / 'session.cfg'
    cfg.write_text('RULE=BSP\nMODELFILE=digits_contract\nMODELCLASS=DigitsMLPLayered\n'
                   'DEVICES=cpu0,cpu1,cpu2\nSYNC_TYPE=kn\nEXCH_STRATEGY=ar-overlap\n'
                   'MAX_STEPS=6\nOUT=%s\n' % (tmp_path / 'out'))
    res = run_launcher(['-cfg=%s' % cfg], cwd=DROPIN)
    assert res.returncode == 0, res.stderr
    assert 'exchange mode ar-overlap: per-bucket allreduce during a chunked backward pass' \
        ', 2 chunks declared in model.tmx_layers' in res.stdout
    assert_matches(load_npz(str(tmp_path / 'out')), reference(6, k=3))
    summary = json.load(open(str(tmp_path / 'out' / 'summary.json')))
    assert summary['iterations'] == 6 and summary['mode'] == 'ar-overlap'


def test_reference_learning_rate_by_hand():
    # base 0.05 at batch 16; k = 2: target 0.1 after 50 iterations, k = 3: 0.15 after 33
    assert goyal_lr(0, 0.05, 32, 16, 50) == pytest.approx(0.05)
    assert goyal_lr(25, 0.05, 32, 16, 50) == pytest.approx(0.075)
    assert goyal_lr(50, 0.05, 32, 16, 50) == pytest.approx(0.1)
    assert goyal_lr(11, 0.05, 48, 16, 33) == pytest.approx(0.05 + 0.1 / 3)


@pytest.mark.parametrize('line,needle', [
    ('COLOUR=blue', "line 6: unknown key 'COLOUR'"),
    ('', None),
    # an unquoted value with a space: bash too refuses it; the fix is named
    ('OUT=/tmp/my runs  # x', "line 6: expected KEY=VALUE, got 'OUT=/tmp/my runs  # x'; quote "
     'a value with spaces, as bash needs: OUT="/tmp/my runs"'),
    ('RULE BSP', "line 6: expected KEY=VALUE, got 'RULE BSP'\n")])
def test_tmlauncher_bad_key(tmp_path, line, needle):
    cfg = tmp_path / 's.cfg'
    model = 'digits_contract' if line else 'no_such_models.cifar'
    cfg.write_text('RULE=BSP\nMODELFILE=%s\nMODELCLASS=DigitsMLP\nDEVICES=cpu0,cpu1\n\n%s\n'
                   % (model, line))
    res = run_launcher(['--cfg', str(cfg)], cwd=DROPIN, timeout=60)
    assert res.returncode == 2
    assert (needle or 'model file no_such_models.cifar not found') in res.stderr


def test_tmlauncher_missing_class(tmp_path):
    cfg = tmp_path / 's.cfg'
    cfg.write_text('RULE=BSP\nMODELFILE=digits_contract\nMODELCLASS=Nope\nDEVICES=cpu0\n')
    res = run_launcher(['-cfg=%s' % cfg], cwd=DROPIN, timeout=60)
    assert res.returncode == 2
    assert 'model class Nope not found' in res.stderr


def test_exchanger_in_fake_theanompi_worker(tmp_path):
    # Theano-MPI's own worker loop (stand-in: 2 epochs, lr_warmup, Theano imported by the
    # worker from the user's .theanorc) with install_into_theanompi() in the model file.
    (tmp_path / '.theanorc').write_text('[global]\nfloatX = float32\nbase_compiledir = %s\n'
                                        '[blas]\nldflags =\n' % os.environ['THEANOMPI_EXT_CACHE'])
    env = env_with(FAKE, DROPIN)
    env.pop('THEANO_FLAGS', None)
    env['HOME'] = str(tmp_path)
    cmd = [mpiexec(), '-n', str(K), sys.executable, '-m', 'theanompi.worker', 'cpu',
           'kn', 'ar', 'digits_contract_tm', 'DigitsMLP']
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, cwd=DROPIN,
                             env=env, start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        pytest.fail('fake Theano-MPI worker hung:\n%s\n%s' % (exc.stdout, exc.stderr))
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out['exchanger'] == 'theanompi_ext.theanompi_compat.exchanger'
    steps = 2 * 1600 // (K * 16)                # 2 epochs of the whole training set
    assert out['modes'] == {'calc': steps, 'sync': steps, 'comm': steps}
    ref = reference(steps)
    for rank_params in out['params']:
        assert_matches(rank_params, ref)
