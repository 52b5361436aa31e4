"""Restarts on the Theano-MPI path (session ``MAX_RESTARTS``, ``BSP(..., max_restarts=N)``;
theanompi_compat/resume.py, restart_job.py, docs/faults.md#restarts).

One scenario on 2 real ranks: a model with every kind of per-worker state
(tests/dropin/tmzoo/resumable.py: a BN-like running mean and local gamma,
an epoch-seeded cumulative shuffle, augmentation from its own generator, a
decay after epoch 2) is run through the session launcher once without
restarts and once with ``MAX_RESTARTS=2`` and rank 1 SIGKILLed in epoch 2:
the restarted job resumes from the end of epoch 1 and ends with the same
parameters, bit for bit, and the same history. Both jobs run under a hard
timeout with their process trees watched (support/jobs.py). The option
checks, without MPI: at the end.
"""
import json
import os
import sys

import numpy as np
import pytest

from support.jobs import Job
from support.paths import ROOT
from theanompi_ext.train import attempt, restarts

MODEL = os.path.join(ROOT, 'tests', 'dropin', 'tmzoo', 'resumable.py')
TIMEOUT = 300


def _session(tmp_path, name, extra=''):
    out = tmp_path / name
    cfg = tmp_path / (name + '.cfg')
    cfg.write_text('RULE=BSP\nMODELFILE=%s\nMODELCLASS=ResumableMLP\nDEVICES=(cpu0 cpu1)\n'
                   'OUT=%s\nCOLLECTIVE_TIMEOUT_S=10\n%s' % (MODEL, out, extra))
    return cfg, out


def _run(tmp_path, name, extra='', faults=None):
    cfg, out = _session(tmp_path, name, extra)
    env = dict(os.environ)
    env.pop(attempt.FAULTS_VAR, None)
    if faults:
        env[attempt.FAULTS_VAR] = faults
    job = Job([sys.executable, '-m', 'theanompi_ext.tmlauncher', '-cfg=%s' % cfg],
              tmp_path, env)
    rc = job.wait(TIMEOUT)
    job.finish()                    # nothing of any attempt is left running
    job.out_f.seek(0)
    return rc, out, job.out_f.read(), job.err()


def test_rank_killed_in_epoch_2_restarts_from_epoch_1_with_the_same_bits(tmp_path):
    rc, ref, _, err = _run(tmp_path, 'ref')
    assert rc == 0, err[-3000:]
    # 50 iterations per epoch: rank 1 dies after iteration 70 (epoch 2)
    rc, out, stdout, err = _run(tmp_path, 'faults', 'MAX_RESTARTS=2\nRESTART_BACKOFF_S=0\n',
                                '0:1:70:kill')
    assert rc == 0, err[-4000:]
    with np.load(str(ref / 'params.npz')) as a, np.load(str(out / 'params.npz')) as b:
        assert sorted(a.files) == sorted(b.files)
        for k in a.files:
            assert np.array_equal(a[k], b[k]), k
    sa, sb = (json.loads((p / 'summary.json').read_text()) for p in (ref, out))
    assert sa['iterations'] == sb['iterations'] == 150
    for key in ('train_loss', 'train_err', 'val_loss', 'val_err', 'lr', 'iterations'):
        # val_loss reads the running mean; lr the replayed decay
        assert [h[key] for h in sa['history']] == [h[key] for h in sb['history']], key
    log = json.loads((out / restarts.LOG_NAME).read_text())
    [f] = log['failures']
    assert (f['status'], f['rank'], f['restarted'], f['failed_at_iteration'],
            f['resumed_from_iteration'], f['iterations_lost']) == (9, 1, True, 70, 50, 20), f
    assert 'SIGKILL' in f['cause'] and log['result']['status'] == 0
    assert sb['restarts']['count'] == 1 and sb['resumed_at_epoch'] == 1
    assert 'restart 1 of 2 in 0.0 s' in err
    assert 'restart 1 of 2: resumed from' in stdout and 'at epoch 2 (iteration 50)' in stdout
    assert '1 restart of 2 (20 iterations lost, restarts.json)' in stdout
    assert not (ref / 'checkpoint.h5').exists()      # no supervisor, no checkpoints
    assert not [n for n in os.listdir(out) if '.tmp-' in n]


# ------------------------------------------------------------- the options, without MPI

def test_max_restarts_needs_out_and_a_good_value(tmp_path):
    from theanompi_ext.theanompi_compat.rule import BSP
    from theanompi_ext.theanompi_compat.session import session_from_file
    with pytest.raises(ValueError, match='max_restarts.*give the option out'):
        BSP().init(['cpu0', 'cpu1'], MODEL, 'ResumableMLP', max_restarts=2)
    with pytest.raises(ValueError, match='max_restarts=-1'):
        BSP().init(['cpu0', 'cpu1'], MODEL, 'ResumableMLP', max_restarts=-1, out='o')
    p = tmp_path / 's.cfg'
    p.write_text('RULE=BSP\nMODELFILE=%s\nMODELCLASS=ResumableMLP\nDEVICES=cpu0,cpu1\n'
                 'MAX_RESTARTS=2\n' % MODEL)
    with pytest.raises(ValueError, match='s.cfg: MAX_RESTARTS: .*give the key OUT'):
        session_from_file(str(p))
    p.write_text(p.read_text() + 'OUT=o\nRESTART_BACKOFF_S=0.5\n')
    s = session_from_file(str(p))
    assert (s['options']['max_restarts'], s['options']['restart_backoff_s']) == ('2', '0.5')


def test_a_model_that_cannot_resume_is_refused():
    from types import SimpleNamespace
    from theanompi_ext.errors import BadInput
    from theanompi_ext.theanompi_compat.resume import check_resumable
    check_resumable(SimpleNamespace(data=SimpleNamespace()))
    with pytest.raises(BadInput, match='para_load'):
        check_resumable(SimpleNamespace(data=SimpleNamespace(para_load=True)))
    with pytest.raises(BadInput, match='tmx_resumable'):
        check_resumable(SimpleNamespace(tmx_resumable=False))


def test_generator_states_round_trip():
    import random
    from theanompi_ext.theanompi_compat import resume
    rs = np.random.RandomState(5)
    rs.normal()          # a cached Gaussian in the state
    gens = [resume._numpy_generator('g', rs), resume._python_generator()]
    random.gauss(0, 1)
    saved = [g.get_value() for g in gens]
    want = (rs.normal(size=3).tolist(), rs.randint(1 << 30), random.gauss(0, 1),
            random.random())
    for g, v in zip(gens, saved):
        g.set_value(v)
    assert (rs.normal(size=3).tolist(), rs.randint(1 << 30), random.gauss(0, 1),
            random.random()) == want
