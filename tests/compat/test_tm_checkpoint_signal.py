"""A checkpoint asked for by a signal on the Theano-MPI path (``BSP().init(...,
checkpoint_signal='USR1', on_checkpoint_signal='stop')``, a session's
``CHECKPOINT_SIGNAL``; theanompi_compat/worker.py, resume.py, restart_job.py;
docs/faults.md).

The reference for "nothing changed" is the same job never signalled: a job
stopped after the checkpoint (status 75) and resumed (``resume=True``,
``RESUME=1``) must end with its parameters bit for bit and its epoch records,
also when it stopped inside an epoch, half-way through a file batch of
sub-batches that the model's own counters walk (its loading is run again with
the step skipped). The signal comes two ways: to the user's process that
called ``BSP.init`` (or ``tmxlauncher``), which passes it on through the job
process and mpiexec; and to one rank itself (the fault hook ``usr1``, at a
known iteration). Every job runs on 2 real ranks under a hard timeout with
its process tree checked afterwards. The option checks, without MPI: at the
end.
"""
import json
import os
import re
import signal
import sys
import time

import numpy as np
import pytest

from support.hosts import cmdline
from support.jobs import Job, catches, wait_for
from support.paths import ROOT
from theanompi_ext.launch.job_control import process_state
from theanompi_ext.train import attempt

DROPIN = os.path.join(ROOT, 'tests', 'dropin')
RESUMABLE = os.path.join(DROPIN, 'tmzoo', 'resumable.py')
TIMEOUT = 300


def _env(faults=None):
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join([DROPIN, ROOT] + [
        p for p in env.get('PYTHONPATH', '').split(os.pathsep) if p])
    env.pop(attempt.FAULTS_VAR, None)
    if faults:
        env[attempt.FAULTS_VAR] = faults
    return env


def _bsp_job(tmp_path, model, cls, out, options, faults=None):
    """``BSP().init`` + ``wait`` in a script of the user's, as a :class:`Job`."""
    script = ('import sys\nfrom theanompi_ext import BSP\nrule = BSP()\n'
              'rule.init(["cpu0", "cpu1"], %r, %r, out=%r, snapshot_freq=0%s)\n'
              'sys.exit(rule.wait(timeout=%d))\n'
              % (model, cls, str(out), ''.join(', %s=%r' % kv for kv in options.items()),
                 TIMEOUT))
    return Job([sys.executable, '-c', script], tmp_path, _env(faults))


def _session_job(tmp_path, name, extra='', faults=None, flags=()):
    out = tmp_path / name
    cfg = tmp_path / (name + '.cfg')
    cfg.write_text('RULE=BSP\nMODELFILE=%s\nMODELCLASS=ResumableMLP\nDEVICES=(cpu0 cpu1)\n'
                   'OUT=%s\nCOLLECTIVE_TIMEOUT_S=20\nSNAPSHOT_FREQ=0\n%s' % (RESUMABLE, out, extra))
    return Job([sys.executable, '-m', 'theanompi_ext.tmlauncher', '-cfg=%s' % cfg] + list(flags),
               tmp_path, _env(faults)), out


def _ended(job, timeout=TIMEOUT):
    """The job's status, its stdout and stderr, with nothing of it left running."""
    try:
        rc = job.wait(timeout)
    finally:
        job.finish()
    job.out_f.seek(0)
    return rc, job.out_f.read(), job.err()


def _params(out):
    with np.load(str(out / 'params.npz')) as f:
        return {k: f[k] for k in f.files}


def _assert_same_run(ref, out, iterations):
    a, b = _params(ref), _params(out)
    assert sorted(a) == sorted(b)
    for k in a:
        assert np.array_equal(a[k], b[k]), k
    sa, sb = (json.loads((p / 'summary.json').read_text()) for p in (ref, out))
    assert sa['iterations'] == sb['iterations'] == iterations
    for key in ('train_loss', 'train_err', 'val_loss', 'val_err', 'lr', 'iterations'):
        assert [h[key] for h in sa['history']] == [h[key] for h in sb['history']], key
    return sb


def _stopped_at(err):
    m = re.search(r'stopped by SIGUSR1 after the checkpoint of iteration (\d+) \((.*?)\): '
                  r'continue with resume=True', err)
    assert m, err[-3000:]
    assert 'all 2 ranks stopped after the checkpoint, as asked' in err, err[-3000:]
    return int(m.group(1))


# ------------------------------------------- within a file batch of sub-batches

def test_a_stop_inside_a_file_batch_resumes_with_the_same_bits(tmp_path):
    """``tmzoo.subbatch.Cifar10Like``: 3 file batches of 2 sub-batches per epoch, its
    position in the model's own counters (``current_t``, ``subb_t``) and its train
    function replaced by ours. Rank 1 signals itself after iteration 9: epoch 2,
    file batch 2's first sub-batch done. Every rank writes that checkpoint and stops
    (75); ``resume=True`` loads file batches 1 and 2 again without a step and ends
    with the parameters and records of the job never signalled."""
    model, cls = 'tmzoo.subbatch', 'Cifar10Like'
    rc, _, err = _ended(_bsp_job(tmp_path, model, cls, tmp_path / 'ref', {}))
    assert rc == 0, err[-3000:]
    opts = dict(checkpoint_signal='USR1', on_checkpoint_signal='stop')
    out = tmp_path / 'run'
    rc, stdout, err = _ended(_bsp_job(tmp_path, model, cls, out, opts, '0:1:9:usr1'))
    assert rc == 75, err[-3000:]
    assert _stopped_at(err) == 9
    assert not (out / 'params.npz').exists()
    from theanompi_ext.theanompi_compat.resume import read_position
    assert tuple(read_position(str(out / 'checkpoint.h5'))) == (1, 3)
    rc, stdout, err = _ended(_bsp_job(tmp_path, model, cls, out, dict(opts, resume=True)))
    assert rc == 0, err[-3000:]
    assert 'resumed from %s at epoch 2, step 3 of 6 (iteration 9)' % (out / 'checkpoint.h5') \
        in stdout, stdout[-3000:]
    _assert_same_run(tmp_path / 'ref', out, 12)


# ------------------------------------------- every kind of per-worker state

@pytest.fixture(scope='module')
def straight(tmp_path_factory):
    """The ResumableMLP session never signalled (150 iterations, 50 per epoch)."""
    tmp = tmp_path_factory.mktemp('straight')
    job, out = _session_job(tmp, 'ref')
    rc, _, err = _ended(job)
    assert rc == 0, err[-3000:]
    assert not (out / 'checkpoint.h5').exists()      # no option asked for one
    return out


def test_a_signal_to_the_launcher_before_the_ranks_start_waits_for_them(tmp_path, straight):
    """SIGUSR1 to ``tmxlauncher`` as soon as it catches it, before any rank could:
    it waits in the job process until every rank has joined, then reaches them
    through mpiexec; every rank stops after the same iteration's checkpoint (75,
    not restarted under ``MAX_RESTARTS``); ``--resume`` ends with the straight
    session's bits and history (a BN-like running mean, a local gamma, an
    epoch-seeded shuffle, augmentation from the model's own generator)."""
    extra = 'CHECKPOINT_SIGNAL=USR1\nON_CHECKPOINT_SIGNAL=stop\nMAX_RESTARTS=1\n'
    job, out = _session_job(tmp_path, 'run', extra)
    try:
        wait_for(lambda: catches(job.proc.pid, signal.SIGUSR1) or job.proc.poll() is not None, 60,
                 'tmxlauncher to catch SIGUSR1')
        os.kill(job.proc.pid, signal.SIGUSR1)
    finally:
        rc, _, err = _ended(job)
    assert rc == 75, err[-3000:]
    at = _stopped_at(err)
    assert 1 <= at < 150
    log = json.loads((out / 'restarts.json').read_text())
    assert log['result']['status'] == 75 and not log['failures'], log
    job, _ = _session_job(tmp_path, 'run', flags=['--resume'])      # the key RESUME=1
    rc, stdout, err = _ended(job)
    assert rc == 0, err[-3000:]
    assert 'resumed from' in stdout and '(iteration %d)' % at in stdout, stdout[-3000:]
    summary = _assert_same_run(straight, out, 150)
    assert summary['resumed_at_epoch'] == at // 50


def test_a_signal_to_one_rank_with_continue_writes_the_checkpoint_and_goes_on(tmp_path,
                                                                              straight):
    """Rank 1 signals itself after iteration 70 (epoch 2): both ranks write that
    iteration's checkpoint, rank 0 says so, the job goes on to the end (0) with
    the straight session's parameters; the checkpoint left is the last epoch's."""
    job, out = _session_job(tmp_path, 'run', 'CHECKPOINT_SIGNAL=usr1\n', '0:1:70:usr1')
    rc, stdout, err = _ended(job)
    assert rc == 0, err[-3000:]
    assert 'checkpoint of iteration 70 written, as SIGUSR1 asked (%s); training goes on' \
        % (out / 'checkpoint.h5') in stdout, stdout[-3000:]
    _assert_same_run(straight, out, 150)
    from theanompi_ext.theanompi_compat.resume import read_position
    assert tuple(read_position(str(out / 'checkpoint.h5'))) == (3, 0)
    assert not [n for n in os.listdir(str(out)) if '.tmp-' in n or n.startswith('.theanompi')]
    # resumed from that checkpoint of the finished run: nothing is left to train, and
    # the outputs written again are the run's
    (out / 'params.npz').unlink()
    job, _ = _session_job(tmp_path, 'run', flags=['--resume'])
    rc, stdout, err = _ended(job)
    assert rc == 0, err[-3000:]
    assert 'resumed from %s after its last epoch, nothing left to train (iteration 150)' \
        % (out / 'checkpoint.h5') in stdout, stdout[-3000:]
    _assert_same_run(straight, out, 150)


def test_a_restart_resumes_from_the_clocks_checkpoint_within_the_epoch(tmp_path, straight):
    """``CHECKPOINT_EVERY_S`` (rank 0's clock, agreed after each step) under
    ``MAX_RESTARTS``: with a clock of 1 ms (about a step and its checkpoint here)
    rank 1 SIGKILLed after iteration 70 (epoch 2) costs a few iterations, not the
    20 since the epoch's end; the restart resumes within epoch 2 and the job ends
    with the straight bits. (Which step rank 0's clock picks last depends on the
    machine's speed: CI's resumed from 68, a quiet run from 69.)"""
    from theanompi_ext.train import restarts
    job, out = _session_job(tmp_path, 'run', 'MAX_RESTARTS=1\nRESTART_BACKOFF_S=0\n'
                            'CHECKPOINT_EVERY_S=0.001\n', '0:1:70:kill')
    rc, stdout, err = _ended(job)
    assert rc == 0, err[-3000:]
    [f] = json.loads((out / restarts.LOG_NAME).read_text())['failures']
    at = f['resumed_from_iteration']
    assert (f['rank'], f['restarted'], f['failed_at_iteration'], f['iterations_lost']) == \
        (1, True, 70, 70 - at) and 50 < at < 70, f
    assert 'restart 1 of 1: resumed from %s at epoch 2, step %d of 50 (iteration %d)' \
        % (out / 'checkpoint.h5', at - 50, at) in stdout, stdout[-3000:]
    _assert_same_run(straight, out, 150)


# ------------------------------------------------------------- the options, without MPI

def test_the_options_are_checked_before_any_rank_starts(tmp_path):
    from theanompi_ext.theanompi_compat.rule import BSP
    model, cls = os.path.join(DROPIN, 'tmzoo', 'subbatch.py'), 'Cifar10Like'
    cases = [
        (dict(checkpoint_signal='USR1'), 'checkpoint_signal: .*give the option out'),
        (dict(checkpoint_signal='TERM', out='o'), r"checkpoint_signal='TERM'.*choose from USR1"),
        (dict(checkpoint_signal='KILL', out='o'), "checkpoint_signal='KILL'"),
        (dict(on_checkpoint_signal='stop', out='o'), 'of which signal'),
        (dict(checkpoint_signal='USR1', on_checkpoint_signal='later', out='o'),
         "on_checkpoint_signal='later': choose from continue, stop"),
        (dict(resume=True), 'resume: .*give the option out'),
        (dict(checkpoint_every_s=60), 'checkpoint_every_s: .*give the option out'),
        (dict(checkpoint_every_s=-1, out='o'), "checkpoint_every_s=-1: must be >= 0"),
        (dict(checkpoint_every_s='often', out='o'), "checkpoint_every_s='often'"),
        (dict(resume='perhaps', out='o'), "resume='perhaps': expected true or false"),
        (dict(resume=True, out=str(tmp_path)), 'checkpoint.h5: no checkpoint to resume from'),
    ]
    for options, message in cases:
        with pytest.raises(ValueError, match=message):
            BSP().init(['cpu0', 'cpu1'], model, cls, **options)
    # a file that is not a whole checkpoint: refused, and left as it is
    (tmp_path / 'checkpoint.h5').write_bytes(b'not a checkpoint')
    with pytest.raises(ValueError, match='option resume: .*checkpoint.h5'):
        BSP().init(['cpu0', 'cpu1'], model, cls, resume=True, out=str(tmp_path))
    assert (tmp_path / 'checkpoint.h5').read_bytes() == b'not a checkpoint'


def test_a_train_checkpoint_is_not_resumed_as_a_theanompi_run(tmp_path):
    """A whole checkpoint of another kind of run (``train``'s: no epochs_done):
    named, not resumed."""
    from theanompi_ext.files import sealed
    from theanompi_ext.theanompi_compat.resume import read_position
    from theanompi_ext.train.checkpoint import CheckpointError
    import h5py
    import io
    buf = io.BytesIO()
    with h5py.File(buf, 'w', userblock_size=sealed.USERBLOCK) as f:
        f.attrs['partial'] = json.dumps({'epoch': 3})
    path = tmp_path / 'checkpoint.h5'
    path.write_bytes(bytes(sealed.seal(buf.getbuffer())))
    with pytest.raises(CheckpointError, match='not a checkpoint of a Theano-MPI model run'):
        read_position(str(path))


def test_session_keys_are_checked_with_the_file_named(tmp_path):
    from theanompi_ext.theanompi_compat.session import session_from_file
    p = tmp_path / 's.cfg'
    base = 'RULE=BSP\nMODELFILE=%s\nMODELCLASS=ResumableMLP\nDEVICES=cpu0,cpu1\n' % RESUMABLE
    p.write_text(base + 'CHECKPOINT_SIGNAL=USR1\n')
    with pytest.raises(ValueError, match='s.cfg: CHECKPOINT_SIGNAL: .*give the key OUT'):
        session_from_file(str(p))
    p.write_text(base + 'OUT=o\nON_CHECKPOINT_SIGNAL=stop\n')
    with pytest.raises(ValueError, match='s.cfg: ON_CHECKPOINT_SIGNAL: .*Give the key '
                                         'CHECKPOINT_SIGNAL'):
        session_from_file(str(p))
    p.write_text(base + 'OUT=%s\nRESUME=1\n' % tmp_path)
    with pytest.raises(ValueError, match='s.cfg: RESUME: .*no checkpoint to resume from'):
        session_from_file(str(p))
    p.write_text(base + 'OUT=o\nCHECKPOINT_SIGNAL=usr2\nON_CHECKPOINT_SIGNAL=stop\n')
    s = session_from_file(str(p))
    assert (s['options']['checkpoint_signal'], s['options']['on_checkpoint_signal']) == \
        ('usr2', 'stop')


def test_the_dry_run_says_when_checkpoints_are_written(tmp_path):
    from theanompi_ext.theanompi_compat.dry_run import plan_lines
    from theanompi_ext.theanompi_compat.session import session_from_file
    p = tmp_path / 's.cfg'
    base = 'RULE=BSP\nMODELFILE=%s\nMODELCLASS=ResumableMLP\nDEVICES=cpu0,cpu1\n' % RESUMABLE
    said = []
    p.write_text(base)
    plan_lines(session_from_file(str(p)), log=said.append)
    p.write_text(base + 'OUT=o\nCHECKPOINT_SIGNAL=usr2\nON_CHECKPOINT_SIGNAL=stop\n'
                 'CHECKPOINT_EVERY_S=600\nMAX_RESTARTS=3\n')
    plan_lines(session_from_file(str(p)), log=said.append)
    assert said[3] == 'checkpoints: none (options max_restarts, checkpoint_every_s, ' \
        'checkpoint_signal)', said
    assert said[-1] == ("checkpoints: o/checkpoint.h5, at the end of every epoch, every 600 s "
                        "(rank 0's clock), on SIGUSR2, then every rank stops (75); restarted "
                        "up to 3 times from it"), said
    # the session's options reach the plan as they reach the ranks (they were ignored)
    p.write_text(base + 'BATCH_PER_WORKER=8\n')
    with pytest.raises(ValueError, match='batch size is 8 .*BATCH_PER_WORKER'):
        plan_lines(session_from_file(str(p)), log=said.append)


def test_a_model_cannot_choose_the_signal_in_tmx_options():
    from types import SimpleNamespace
    from theanompi_ext.theanompi_compat.options import resolve_options
    model = SimpleNamespace(tmx_options={'checkpoint_signal': 'USR1'}, batch_size=8,
                            n_epochs=2, base_lr=0.1)
    with pytest.raises(ValueError, match=r"tmx_options\['checkpoint_signal'\]: chosen before"):
        resolve_options(model, environ={})


def test_the_epoch_so_far_round_trips_through_a_checkpoint_entry():
    from theanompi_ext.theanompi_compat.resume import EpochSoFar
    e = EpochSoFar(6, has_error=True)
    e.losses, e.errors = [0.5, 0.25, 1 / 3.], [0.0, 0.125, 0.5]
    v = e.get_value()
    assert v.shape == (2, 6) and np.all(np.isfinite(v)) and not v[:, 3:].any()
    f = EpochSoFar(6, has_error=True)
    f.set_value(v)
    f.restore(3)
    assert (f.losses, f.errors) == (e.losses, e.errors)       # float64: exact
    g = EpochSoFar(6, has_error=False)          # a model without an error: NaN kept out
    g.losses, g.errors = [0.5], [float('nan')]
    assert np.all(np.isfinite(g.get_value()))
    g.set_value(g.get_value())
    g.restore(1)
    assert g.losses == [0.5] and np.isnan(g.errors[0])


@pytest.mark.parametrize('var,value', [('CHECKPOINT_SIGNAL', 'USR1'),
                                       ('CHECKPOINT_EVERY_S', '60.0')])
def test_inside_theanompis_own_worker_the_options_are_refused(monkeypatch, var, value):
    """Theano-MPI's worker runs its own loop: the options cannot be honoured there,
    so they are refused, not ignored."""
    from types import SimpleNamespace
    from theanompi_ext.theanompi_compat.exchanger import BSP_Exchanger
    monkeypatch.setenv('THEANOMPI_EXT_' + var, value)
    model = SimpleNamespace(params=[], weight_types=[], batch_size=4, n_epochs=2,
                            base_lr=0.1, eta=0.0, mu=0.9)
    with pytest.raises(ValueError, match='%s=%s: .*not Theano-MPI' % (var, value)):
        BSP_Exchanger(None, None, 'ar', 'kn', None, model)


class _Events(object):
    """A stepper, a checkpoint and two models that write down what runs, in order."""

    def __init__(self):
        self.events, self.n_subb, self.iteration = [], 2, 9

    def step(self, subb):
        self.events.append(('step', subb))
        self.iteration += 1
        return 1.0, 0.0, 0.1


@pytest.mark.parametrize('hooked', [True, False], ids=['load_train_batch', 'train_iter'])
def test_a_resume_within_an_epoch_loads_the_steps_done_and_then_the_state(hooked):
    """3 file batches of 2 sub-batches, resumed after 3 steps (half-way through file
    batch 1): the loading of those 3 runs without a step, the state is loaded just
    before the 4th, and the epoch's losses so far come with it."""
    from types import SimpleNamespace
    from theanompi_ext.theanompi_compat import worker
    from theanompi_ext.theanompi_compat.resume import EpochSoFar, ResumePoint
    from theanompi_ext.theanompi_compat.train_fn import StepFunction
    ev = _Events()
    stepper = ev
    stepper.train_fn = StepFunction(stepper)
    stepper.iters_per_epoch = 6

    class Model(object):
        data = SimpleNamespace(n_batch_train=3)
        subb_t = 0

        def load_train_batch(self, i):
            ev.events.append(('load', i))

        def train_iter(self, i, recorder):
            if self.subb_t == 0:
                ev.events.append(('load', i))
            cost, err = self.train_iter_fn(self.subb_t)
            self.subb_t = (self.subb_t + 1) % 2

    model = Model()
    if not hooked:
        del Model.load_train_batch
        model.train_iter_fn = stepper.train_fn
    so_far = EpochSoFar(6, has_error=True)
    so_far.set_value(np.array([[0.5, 0.25, 0.125, 0, 0, 0], [0, 1, 0, 0, 0, 0]]))

    def restore(point):
        ev.events.append(('restore', point.steps_in_epoch))
        so_far.restore(point.steps_in_epoch)
    ckpt = SimpleNamespace(so_far=so_far, restore=restore, path='OUT/checkpoint.h5')
    hooks = SimpleNamespace(attempt=0, max_restarts=0, after_step=lambda it: None)
    opts = dict(checkpoint_signal='', max_steps=0)
    logged = []
    checkpoints = worker._Checkpoints(ckpt, stepper, opts, hooks, logged.append,
                                      ResumePoint(1, 3))
    losses, errs, lr, done = worker._train_epoch(model, stepper, opts, worker.Recorder(),
                                                 hooks, checkpoints, 1)
    assert ev.events == [('load', 0), ('load', 1), ('restore', 3), ('step', 1), ('load', 2),
                         ('step', 0), ('step', 1)]
    assert losses == [0.5, 0.25, 0.125, 1.0, 1.0, 1.0] and errs[:3] == [0, 1, 0]
    assert not done and stepper.iteration == 12 and stepper.train_fn.skipping is False
    assert logged == ['resumed from OUT/checkpoint.h5 at epoch 2, step 3 of 6 (iteration 9)']


# ------------------------------------------- Ctrl-Z through the session's two launchers

TM_RANK_ARGS = [b'-u', b'-m', b'theanompi_ext.theanompi_compat.worker']


def test_ctrl_z_to_tmxlauncher_pauses_every_rank_and_fg_resumes_them(tmp_path, straight):
    """SIGTSTP to ``tmxlauncher`` (Ctrl-Z) while rank 1 pauses after iteration 70:
    it passes it on to the job's process (a session of its own), which stops both
    ranks and itself; then ``tmxlauncher`` stops (launch/job_control.PassOn). SIGCONT
    to ``tmxlauncher`` (fg) resumes them all: status 0, the straight session's bits."""
    job, out = _session_job(tmp_path, 'run', faults='0:1:70:pause')
    try:
        wait_for(lambda: 'FAULT pause rank 1' in job.err() or job.proc.poll() is not None,
                 TIMEOUT, "rank 1's pause")
        procs = job.alive()
        ranks = [p for p in procs if cmdline(p).split(b'\0')[1:4] == TM_RANK_ARGS]
        launchers = [job.proc.pid] + [p for p in procs if b'launch.postmortem' in cmdline(p)]
        assert len(ranks) == 2 and len(launchers) == 2, procs
        os.kill(job.proc.pid, signal.SIGTSTP)
        wait_for(lambda: all(process_state(p) == 'T' for p in launchers + ranks), 10,
                 'tmxlauncher, the job process and both ranks stopped')
        time.sleep(3)
        assert all(process_state(p) == 'T' for p in launchers + ranks)
        os.kill(job.proc.pid, signal.SIGCONT)
    finally:
        rc, _, err = _ended(job)
    assert rc == 0, err[-3000:]
    assert 'theanompi-ext: paused (SIGTSTP): every rank of the job is stopped' in err, err
    assert 'theanompi-ext: resumed: every rank of the job goes on' in err, err
    _assert_same_run(straight, out, 150)
