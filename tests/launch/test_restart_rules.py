"""Restarts without MPI: what is restarted (train/restarts.classify), the
supervisor's decisions and its log (train/restarts.supervise with attempts
faked in-process), the fallback to the previous checkpoint, the rank-side hooks
(train/attempt.py) and the options (docs/faults.md#restarts)."""
import json
import os
import signal
import sys

import numpy as np
import pytest

from theanompi_ext import stop_signals
from theanompi_ext.errors import CheckpointError
from theanompi_ext.launch import signal_marks
from theanompi_ext.train import attempt, restarts
from theanompi_ext.train.config import TrainConfig

from support.paths import MPI_DIR

KILLED = ('theanompi-ext: rank 1 of 2 (pid 4242 on hostb) died: Killed (signal 9); mpiexec '
          'stopped the other ranks (exit status 9)')
TIMEOUT = ("theanompi-ext: rank 0 of 2 (pid 11 on hosta): no progress for 3.1 s in 'loss "
           "stats' at step 7 (collective_timeout_s=3); not arrived: rank 1 (pid 12 on hostb) "
           "no answer within 1.0 s; aborting the job (exit status 4)")


@pytest.mark.parametrize('status, message, restartable, words', [
    (9, KILLED, True, 'SIGKILL'),
    (11, '', True, 'SIGSEGV'),
    (4, TIMEOUT, True, 'collective timed out'),
    (4, "in 'checkpoint x' at step 3 (write_timeout_s=5)", True, 'write hung'),
    (3, 'theanompi-ext: rank 1 of 2 (pid 3 on h) ended without finishing training', True,
     'vanished'),
    (3, 'theanompi-ext: rank 0 of 2 failed: Exception: Other MPI error, error stack: ...',
     True, 'host or link lost'),
    (255, '', True, 'host or link lost'),
    # hydra's status of a rank killed by SIGQUIT is 3: not an exception on a rank
    (3, 'theanompi-ext: rank 0 of 2 (pid 9 on h) died: Quit (signal 3); mpiexec stopped the '
        'other ranks (exit status 3)', True, 'a rank died (Quit (signal 3))'),
    (4, 'theanompi-ext: rank 0 of 2 (pid 9 on h) died: Illegal instruction (signal 4); '
        'mpiexec stopped the other ranks (exit status 4)', True, 'Illegal instruction'),
    # mpiexec itself killed (why_ended._mpiexec_killed): the OOM killer, most likely
    (3, 'theanompi-ext: mpiexec (pid 77 on h) was killed by SIGKILL (signal 9), not by this '
        'launcher (...); its ranks ended with it (exit status 3)', True,
     'mpiexec was killed by SIGKILL'),
    # every rank sent SIGQUIT from outside (launch/signal_marks.py): a kill, as above
    (3, signal_marks.message(2, signal.SIGQUIT)[0], True, 'every rank was killed by SIGQUIT'),
    (143, signal_marks.message(2)[0], False, 'stopped by SIGTERM'),
    (255, 'theanompi-ext: rank 3 of 4 (pid 7159 on tmxh1) died: exit code 9; mpiexec stopped '
          'the other ranks (exit status 255)', True, 'a rank died (exit code 9)'),
    (2, 'theanompi-ext: rank 0 of 2 failed: DataError: x', False, 'bad input'),
    (3, 'theanompi-ext: rank 0 of 2 failed: NonFiniteLoss: the loss is nan', False, 'diverged'),
    (3, 'theanompi-ext: rank 0 of 2 failed: DivergedState: x', False, 'diverged'),
    # said once for every rank (train/faults.say_failure)
    (3, 'theanompi-ext: all 64 ranks failed: NonFiniteLoss: the loss is nan', False, 'diverged'),
    (3, 'theanompi-ext: ranks 0-31 of 64 failed: ReplicaMismatch: x', False, 'diverged'),
    (3, 'theanompi-ext: rank 1 of 2 failed: RuntimeError: a bug', False, 'exception on a rank'),
    (130, '', False, 'SIGINT'), (143, '', False, 'SIGTERM'), (129, '', False, 'SIGHUP'),
    (141, '', False, 'SIGPIPE'),    # its output's reader gone: a restart would meet it too
    (124, '', False, 'timed out'),
    (4, 'theanompi-ext: the job did not start within 20 s (start_timeout_s): not every rank '
        'joined (...)', True, 'did not start in time'),
])
def test_what_a_restart_can_cure(status, message, restartable, words):
    v = restarts.classify(status, message)
    assert v.restartable is restartable and words in v.cause, v


def test_the_rank_blamed_and_the_line_that_says_why():
    assert restarts.culprit(KILLED) == (1, 'hostb')
    assert restarts.culprit(TIMEOUT) == (1, 'hostb')
    assert restarts.culprit('theanompi-ext: rank 3 of 4 failed: RuntimeError: x') == (3, None)
    # every rank, or several, failed alike: nobody is to blame
    assert restarts.culprit('theanompi-ext: all 4 ranks failed: NonFiniteLoss: x') == (None, None)
    assert restarts.culprit('theanompi-ext: ranks 0-2 of 4 failed: NonFiniteLoss: x') == (
        None, None)
    said = 'theanompi-ext: all 4 ranks failed: NonFiniteLoss: the loss is nan'
    assert restarts.last_message('\n'.join([said, 'theanompi-ext: all 4 ranks (on h) ended the '
                                             "job (exit status 3); rank 0's report above says "
                                             'why'])) == said
    text = '\n'.join(['FAULT kill rank 1', 'theanompi-ext: warning: slow', KILLED,
                      'theanompi-ext: something after'])
    assert restarts.last_message(text) == KILLED


def test_fault_specs_and_progress_mark(tmp_path):
    assert attempt.parse_faults('0:1:5:kill; 2:0:9:ckpt') == [(0, 1, 5, 'kill'),
                                                              (2, 0, 9, 'ckpt')]
    with pytest.raises(ValueError, match='unknown fault'):
        attempt.parse_faults('0:1:5:explode')
    mark = str(tmp_path / 'mark')
    env = {attempt.PROGRESS_VAR: mark, attempt.ATTEMPT_VAR: '2', attempt.MAX_RESTARTS_VAR: '3',
           attempt.FAULTS_VAR: '2:0:4:raise;1:0:3:raise'}
    hooks = attempt.AttemptHooks(0, env)
    assert (hooks.attempt, hooks.max_restarts) == (2, 3)
    for it in (1, 2, 3, 12345):
        hooks.after_step(it)           # the attempt-1 fault at 3 is not this attempt's
    assert attempt.read_progress(mark) == 12345
    hooks.after_step(9)
    assert attempt.read_progress(mark) == 9        # rewritten in place, shorter
    with pytest.raises(RuntimeError, match='injected fault at iteration 4'):
        hooks.after_step(4)
    assert attempt.AttemptHooks(1, env)._fd is None    # only rank 0 marks


def test_progress_line_says_which_restart():
    import io
    from theanompi_ext.train.progress import Progress
    buf = io.StringIO()
    p = Progress(10, 2, 20, 16, every=1, stream=buf, terminal=False, restart=(2, 3))
    p.start_epoch(0, 0)
    p.step(1, 1, 0.5, 0.0, 0.0)
    assert buf.getvalue().startswith('progress: restart 2 of 3  epoch 1/2 it 1/10')
    buf = io.StringIO()
    p = Progress(10, 2, 20, 16, every=1, stream=buf, terminal=False, restart=(0, 3))
    p.start_epoch(0, 0)
    p.step(1, 1, 0.5, 0.0, 0.0)
    assert buf.getvalue().startswith('progress: epoch 1/2')


def test_max_restarts_needs_out_and_checkpoints():
    with pytest.raises(ValueError, match='max_restarts.*needs --out'):
        TrainConfig(max_restarts=2).validate()
    with pytest.raises(ValueError, match='max_restarts.*needs --out'):
        TrainConfig(max_restarts=2, out='x', checkpoint=False).validate()
    with pytest.raises(ValueError, match='max_restarts'):
        TrainConfig(max_restarts=-1, out='x').validate()
    with pytest.raises(ValueError, match='checkpoint_every_s'):
        TrainConfig(checkpoint_every_s=-1.0).validate()
    TrainConfig(max_restarts=2, out='x', checkpoint_every_s=60.0).validate()


def test_cli_refuses_max_restarts_without_out(capsys):
    from theanompi_ext.cli.commands import main
    assert main(['train', '--workers', '2', '--max-restarts', '2']) == 2
    assert '--out' in capsys.readouterr().err


def test_options_everywhere_a_user_sets_them(tmp_path):
    """The session (config) file's keys and trials' options reach the same fields;
    the Theano-MPI rule needs ``out`` with it (its restarts: tests/compat/test_tm_restarts.py)."""
    from theanompi_ext.train import options
    p = tmp_path / 'session.cfg'
    p.write_text('MAX_RESTARTS = 3\nCHECKPOINT_EVERY_S = 600\nRESTART_BACKOFF_S=0.5\nOUT=x\n')
    args = options.build_parser().parse_args([])
    cfg = options.config_from(args, options.read_kv_file(str(p), options.config_keys()))
    assert (cfg.max_restarts, cfg.checkpoint_every_s, cfg.restart_backoff_s) == (3, 600.0, 0.5)
    from theanompi_ext.cli.commands import build_parser
    ns = build_parser().parse_args(['trials', '--runs', '2', '--out', 'o', '--max-restarts', '2'])
    assert ns.max_restarts == 2
    from theanompi_ext.theanompi_compat.rule import BSP
    with pytest.raises(ValueError, match='max_restarts.*give the option out'):
        BSP().init(['cpu0', 'cpu1'], 'x', 'Y', max_restarts=2)


# ------------------------------------------------------------- checkpoints to restart from

def _writer():
    sys.path.insert(0, MPI_DIR)
    try:
        import ckpt_writer
    finally:
        sys.path.remove(MPI_DIR)
    return ckpt_writer


def test_newest_good_checkpoint_or_its_predecessor(tmp_path):
    from theanompi_ext.train import checkpoint
    w = _writer()
    out = str(tmp_path)
    assert restarts.good_checkpoint(out) is None          # nothing yet: from the start
    tr = w.fake_trainer(out, 64)
    for v in (5, 8):
        w.set_version(tr, v)
        checkpoint.save(tr, os.path.join(out, checkpoint.FILENAME), {})
    assert restarts.good_checkpoint(out) == 8
    path = tmp_path / checkpoint.FILENAME
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    os.unlink(path)          # (a hard link of prev until the next save: write a new file)
    path.write_bytes(bytes(data))
    assert restarts.good_checkpoint(out) == 5          # the previous one takes its place
    assert (tmp_path / restarts.CORRUPT_NAME).exists()
    assert checkpoint.describe(str(path))['iteration'] == 5
    for name in (checkpoint.FILENAME, checkpoint.PREV_FILENAME):
        os.unlink(tmp_path / name)
        (tmp_path / name).write_bytes(b'garbage')
    with pytest.raises(CheckpointError, match='no good checkpoint to restart from'):
        restarts.good_checkpoint(out)


# ------------------------------------------------------------- the supervisor, faked attempts

class FakeJob(object):
    """Attempts that end as scripted: ``(status, message, iterations done, checkpoint)``."""

    def __init__(self, out, script):
        self.out, self.script, self.calls = out, list(script), []
        self.w = _writer()

    def __call__(self, cfg, env):
        from theanompi_ext.train import checkpoint
        self.calls.append((cfg, dict(env)))
        status, message, done, ckpt = self.script.pop(0)
        if done is not None:        # None: the attempt never started
            with open(env[attempt.PROGRESS_VAR], 'w') as f:
                f.write('%d\n' % done)
        if ckpt == 'torn':
            with open(os.path.join(self.out, checkpoint.FILENAME), 'wb') as f:
                f.write(b'torn')
        elif ckpt is not None:
            tr = self.w.fake_trainer(self.out, 16)
            self.w.set_version(tr, ckpt)
            checkpoint.save(tr, os.path.join(self.out, checkpoint.FILENAME), {})
        return status, message + '\n'


def supervise(tmp_path, script, max_restarts=3):
    out = str(tmp_path)
    cfg = TrainConfig(out=out, max_restarts=max_restarts, restart_backoff_s=0.25).validate()
    job, err, sleeps = FakeJob(out, script), _Err(), []
    status = restarts.supervise(cfg, job, err=err, sleep=sleeps.append)
    with open(os.path.join(out, restarts.LOG_NAME)) as f:
        log = json.load(f)
    return status, job, err.text, sleeps, log


class _Err(object):
    text = ''

    def write(self, s):
        self.text += s

    def flush(self):
        pass


def test_three_failures_then_success_and_the_log(tmp_path):
    status, job, err, sleeps, log = supervise(tmp_path, [
        (9, KILLED, 7, 6), (4, TIMEOUT, 9, 8), (11, KILLED.replace('9', '11'), 12, None),
        (0, '', 20, 20)])
    assert status == 0 and len(job.calls) == 4 and sleeps == [0.25] * 3
    assert [c.resume for c, _ in job.calls] == [False, True, True, True]
    assert [e[attempt.ATTEMPT_VAR] for _, e in job.calls] == ['0', '1', '2', '3']
    assert {e[attempt.MAX_RESTARTS_VAR] for _, e in job.calls} == {'3'}
    f = log['failures']
    assert [(x['status'], x['rank'], x['host'], x['failed_at_iteration'],
             x['resumed_from_iteration'], x['iterations_lost']) for x in f] == [
        (9, 1, 'hostb', 7, 6, 1), (4, 1, 'hostb', 9, 8, 1), (11, 1, 'hostb', 12, 8, 4)]
    assert f[1]['failed_at_step'] == 7 and f[0]['message'] == KILLED
    assert all(x['restarted'] and x['seconds_to_restart'] >= 0 for x in f)
    assert log['result']['status'] == 0 and log['max_restarts'] == 3
    assert 'restart 3 of 3 in 0.2 s: a rank was killed by SIGSEGV (rank 1 on hostb) (exit ' \
           'status 11); resuming from the checkpoint of iteration 8, 4 iterations lost' in err
    s = restarts.summary_for(str(tmp_path))
    assert s == dict(count=3, max_restarts=3, iterations_lost=6, log='restarts.json',
                     causes=[x['cause'] for x in f])
    assert restarts.format_summary(s) == '; 3 restarts of 3 (6 iterations lost, restarts.json)'


def test_budget_exhausted_ends_with_the_last_failure(tmp_path):
    status, job, err, _, log = supervise(tmp_path, [(9, KILLED, 3, 2), (4, TIMEOUT, 5, 4)],
                                         max_restarts=1)
    assert status == 4 and len(job.calls) == 2
    assert 'not restarted: the restart budget is spent (1 of 1); the last failure: a ' \
           'collective timed out' in err and 'exit status 4' in err
    assert log['result']['status'] == 4 and log['failures'][-1]['message'] == TIMEOUT
    assert [x['restarted'] for x in log['failures']] == [True, False]


def test_not_restartable_is_not_retried(tmp_path):
    msg = 'theanompi-ext: rank 0 of 2 failed: NonFiniteLoss: the loss is nan'
    status, job, err, sleeps, log = supervise(tmp_path, [(3, msg, 4, 2)])
    assert status == 3 and len(job.calls) == 1 and not sleeps
    assert 'not restarted: not a failure a restart can cure: the run diverged' in err
    assert log['failures'][0]['restarted'] is False


def test_the_same_failure_twice_stops_naming_the_iteration(tmp_path):
    status, job, err, _, log = supervise(tmp_path, [(9, KILLED, 7, 6), (9, KILLED, 7, None)])
    assert status == 9 and len(job.calls) == 2
    assert 'the same failure twice at iteration 7' in err


def test_no_good_checkpoint_is_not_restarted(tmp_path):
    status, job, err, _, log = supervise(tmp_path, [(9, KILLED, 7, 'torn')])
    assert status == 2 and len(job.calls) == 1
    assert 'no good checkpoint to restart from' in err


def test_failure_before_any_checkpoint_starts_again_from_the_start(tmp_path):
    status, job, err, _, log = supervise(tmp_path, [(9, KILLED, 2, None), (0, '', 9, None)])
    assert status == 0 and [c.resume for c, _ in job.calls] == [False, False]
    assert 'resuming from the start (no checkpoint yet), 2 iterations lost' in err


@pytest.fixture
def stop_state():
    """The stop signals' handlers, and stop_signals' word that a stop has begun, put
    back after a test that stops in this process (a stop is for good there)."""
    before = {s: signal.getsignal(s) for s in stop_signals.STOP_SIGNALS}
    yield
    stop_signals._stop_begun.clear()
    for sig, handler in before.items():
        signal.signal(sig, handler)


def test_a_stop_between_attempts_restarts_nothing(tmp_path, stop_state):
    out = str(tmp_path)
    cfg = TrainConfig(out=out, max_restarts=3).validate()
    job = FakeJob(out, [(9, KILLED, 3, 2)] * 2)

    def backoff(_):
        os.kill(os.getpid(), signal.SIGTERM)
    err = _Err()
    assert restarts.supervise(cfg, job, err=err, sleep=backoff) == 143
    assert len(job.calls) == 1 and 'stopped by SIGTERM between attempts' in err.text
    # the process is ending: a later copy of the signal must not kill it first
    assert all(stop_signals.ignored(s) for s in stop_signals.STOP_SIGNALS)


def test_checkpoint_cost_record():
    from theanompi_ext.train.trainer import checkpoint_cost
    c = checkpoint_cost([0.1, 0.3], 4.0)
    assert c['count'] == 2 and np.isclose(c['mean_s'], 0.2) and np.isclose(c['share'], 0.1)
    assert checkpoint_cost([], 1.0)['mean_s'] is None


def test_another_runs_checkpoint_is_not_restarted_from(tmp_path):
    """--overwrite over an older run: a failure before this job's first checkpoint
    starts again from the start, not from the older run's checkpoint."""
    from theanompi_ext.train import checkpoint
    w = _writer()
    tr = w.fake_trainer(str(tmp_path), 16)
    w.set_version(tr, 50)
    checkpoint.save(tr, str(tmp_path / checkpoint.FILENAME), {})
    old = restarts.file_versions(str(tmp_path))
    assert restarts.good_checkpoint(str(tmp_path), old) is None
    w.set_version(tr, 4)
    checkpoint.save(tr, str(tmp_path / checkpoint.FILENAME), {})
    assert restarts.good_checkpoint(str(tmp_path), old) == 4


UNREACHED = ('theanompi-ext: host tmxh1 could not be reached (`wrapper tmxh1 true` did not '
             'answer within 10 s); no rank was started (exit status 2)')
NOT_STARTED = ('theanompi-ext: the job did not start within 20 s (start_timeout_s): not every '
               'rank joined (a host unreachable, a link down, ranks of different hosts that '
               'cannot reach each other, or the start-up hung: docs/multinode.md); every rank '
               'was stopped (exit status 4)')


def test_a_host_unreachable_is_bad_input_at_the_first_start_only(tmp_path):
    (tmp_path / 'a').mkdir()
    (tmp_path / 'b').mkdir()
    # at the first start: a wrong hostfile, not retried
    status, job, err, _, log = supervise(tmp_path / 'a', [(2, UNREACHED, None, None)])
    assert status == 2 and len(job.calls) == 1 and 'bad input' in err
    # after a start that reached every host: the host or its link is down, restarted;
    # twice in a row is not "the same failure twice" (each costs its wait; the link
    # may come back), the budget bounds it
    status, job, err, _, log = supervise(tmp_path / 'b', [
        (9, KILLED, 7, 6), (2, UNREACHED, None, None), (4, NOT_STARTED, None, None),
        (4, NOT_STARTED, None, None), (0, '', 20, 20)], max_restarts=4)
    assert status == 0 and len(job.calls) == 5, err
    causes = [x['cause'] for x in log['failures']]
    assert causes[1:] == [restarts.UNREACHED_CAUSE, restarts.START_CAUSE, restarts.START_CAUSE]
    # a doubling back-off while the job does not start (restart_backoff_s 0.25 here)
    assert [x['backoff_s'] for x in log['failures']] == [0.25, 2.0, 4.0, 8.0]
    assert restarts.backoff_s(1.0, 0) == 1.0 and restarts.backoff_s(0, 7) == 60.0
    assert restarts.backoff_s(90.0, 2) == 90.0
    assert [c.resume for c, _ in job.calls] == [False] + [True] * 4    # from iteration 6


def test_start_watch_stops_a_job_that_does_not_start(tmp_path):
    import subprocess
    import time
    from theanompi_ext.launch.start_watch import StartWatch
    marker = tmp_path / 'started'
    # never started: stopped after the timeout, once
    proc = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])
    stops = []
    t0 = time.monotonic()
    w = StartWatch(proc, lambda: marker.exists(), 0.5, lambda: (stops.append(1), proc.kill()))
    w.start()
    proc.wait(timeout=10)
    w.finish()
    assert w.fired and stops == [1] and 0.4 < time.monotonic() - t0 < 5
    # started in time: never stopped
    proc = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(1.5)'])
    marker.write_text('')
    w = StartWatch(proc, lambda: marker.exists(), 0.5, lambda: proc.kill()).start()
    assert proc.wait(timeout=10) == 0
    w.finish()
    assert not w.fired
    # no check asked for (outside the supervisor): nothing watched
    w = StartWatch(proc, None, 0.5, lambda: None).start()
    w.finish()
    assert not w.fired


def test_rank_0_marks_the_start_in_the_progress_file(tmp_path):
    path = str(tmp_path / 'progress')
    env = {attempt.PROGRESS_VAR: path}
    attempt.mark_started(1, env)
    assert not attempt.started(path)            # rank 0 only
    attempt.mark_started(0, env)
    assert attempt.started(path) and attempt.read_progress(path) is None   # no iteration yet
    attempt.mark_started(0, {})                 # outside the supervisor: nothing
    assert not attempt.started('')
