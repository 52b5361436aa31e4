"""Restarts of real jobs (``train --max-restarts``, docs/faults.md#restarts).

Each job is killed several times at steps drawn from a seeded generator
(``THEANOMPI_EXT_FAULTS``, train/attempt.py) and must end with parameters
bitwise equal to the same job run without faults. Every job runs under a
hard timeout with its whole process tree watched: after each, nothing it
started may be alive (support/jobs.py). The supervisor's rules and log,
without MPI: test_restart_rules.py.
"""
import json
import os
import random
import re
import signal
import sys
import time

import numpy as np
import pytest

from theanompi_ext.train import attempt, checkpoint, restarts

from support.jobs import Job, wait_for
from support.procs import the_mpiexec

CLI = [sys.executable, '-m', 'theanompi_ext', 'train']
TIMEOUT = 420


def _run(tmp_path, name, argv, faults=None, env=None, timeout=TIMEOUT):
    out = tmp_path / name
    full = dict(env or os.environ)
    full.pop(attempt.FAULTS_VAR, None)
    if faults:
        full[attempt.FAULTS_VAR] = ';'.join('%d:%d:%d:%s' % f for f in faults)
    job = Job(CLI + argv + ['--out', str(out)], tmp_path, full)
    rc = job.wait(timeout)
    job.finish()                     # nothing of any attempt is left running
    job.out_f.seek(0)
    return rc, out, job.out_f.read(), job.err()


def _same_bits(a, b):
    with np.load(str(a / 'params.npz')) as x, np.load(str(b / 'params.npz')) as y:
        assert sorted(x.files) == sorted(y.files)
        for k in x.files:
            assert np.array_equal(x[k], y[k]), k
    sa, sb = (json.loads((p / 'summary.json').read_text()) for p in (a, b))
    assert sa['iterations'] == sb['iterations']
    for key in ('train_loss', 'train_err', 'val_top1', 'lr'):
        assert [h.get(key) for h in sa['history']] == [h.get(key) for h in sb['history']], key
    return sb


def _log(out):
    return json.loads((out / restarts.LOG_NAME).read_text())


# 2 x 8 digits: 89 iterations per epoch, 178 in all; a checkpoint every 20 iterations
# and every 0.5 s (rank 0's clock), the end of epoch 1 mid-way.
RUN_2 = ['--workers', '2', '--model', 'digits_cnn', '--batch-per-worker', '8', '--epochs', '2',
         '--base-lr', '0.05', '--ref-batch', '16', '--warmup-epochs', '1', '--decay-epochs', '1',
         '--exch-strategy', 'ar', '--wire-dtype', 'float32', '--checkpoint-every', '20',
         '--checkpoint-every-s', '0.5', '--collective-timeout-s', '4', '--stall-warn-s', '2',
         '--max-restarts', '3', '--restart-backoff-s', '0']


def test_three_failures_then_the_same_bits_2_ranks_ar_fp32_digits(tmp_path):
    """Rank 1 SIGKILLed, rank 0 killed inside a checkpoint write, rank 1 SIGSTOPped
    (the watchdog ends that attempt, status 4): three restarts, and the final
    parameters, losses and errors are those of the run that never failed."""
    rnd = random.Random(2029)
    a0 = rnd.randint(25, 60)
    a1 = rnd.randint(a0 + 5, 100)
    a2 = rnd.randint(a1 + 25, 170)
    rc, ref, _, err = _run(tmp_path, 'ref', RUN_2)
    assert rc == 0, err[-3000:]
    faults = [(0, 1, a0, 'kill'), (1, 0, a1, 'ckpt'), (2, 1, a2, 'stop')]
    rc, out, stdout, err = _run(tmp_path, 'faults', RUN_2, faults)
    assert rc == 0, err[-4000:]
    print('\nfaults after iterations %d, %d (in the next checkpoint write), %d' % (a0, a1, a2))
    summary = _same_bits(ref, out)
    log = _log(out)
    f = log['failures']
    assert [(x['status'], x['rank'], x['restarted']) for x in f] == [
        (9, 1, True), (9, 0, True), (4, 1, True)], f
    assert 'SIGKILL' in f[0]['cause'] and 'collective timed out' in f[2]['cause']
    assert f[0]['failed_at_iteration'] == a0 and f[2]['failed_at_iteration'] == a2
    assert a1 < f[1]['failed_at_iteration'] <= a1 + 20       # the checkpoint after a1
    for x in f:
        assert x['resumed_from_iteration'] <= x['failed_at_iteration']
        assert x['iterations_lost'] == x['failed_at_iteration'] - x['resumed_from_iteration']
        assert x['host'] and x['seconds_to_restart'] < 5
        print('attempt %d: %s at iteration %d, resumed from %d, %.2f s from the failure '
              'to the next start' % (x['attempt'], x['cause'], x['failed_at_iteration'],
                                     x['resumed_from_iteration'], x['seconds_to_restart']))
    assert "no progress for" in f[2]['message'] and 'not arrived: rank 1' in f[2]['message']
    assert log['result']['status'] == 0
    assert summary['restarts']['count'] == 3 and summary['restarts']['max_restarts'] == 3
    assert summary['checkpoints']['count'] >= 1
    for n in (1, 2, 3):
        assert 'theanompi-ext: restart %d of 3 in 0.0 s' % n in err
        assert 'restart %d of 3: resumed from' % n in stdout
    assert re.search(r'summary: .*; 3 restarts of 3 \(\d+ iterations lost, restarts.json\)',
                     stdout), stdout[-2000:]
    assert not [n for n in os.listdir(out) if '.tmp-' in n]   # the torn write was removed


def _mpiexec_signalled(job, out, sig):
    """Once ``job`` has written its first checkpoints, ``sig`` to its mpiexec alone;
    (the job's exit status, that mpiexec's pid). Nothing of the job is left."""
    try:
        wait_for(lambda: (out / checkpoint.PREV_FILENAME).exists() or
                 job.proc.poll() is not None, 120, 'the first checkpoints')
        (launcher,) = the_mpiexec(job.proc.pid)
        os.kill(launcher, sig)
        return job.wait(TIMEOUT), launcher
    finally:
        job.finish()


def test_mpiexec_killed_is_restarted_to_the_same_bits(tmp_path):
    """mpiexec itself SIGKILLed mid-run (the OOM killer's pick on the launcher's
    host): the attempt ends with status 3 saying so, it is restarted from the
    last checkpoint, and the run ends with the bits of one never killed."""
    argv = ['--workers', '2', '--model', 'mlp', '--batch-per-worker', '8', '--epochs', '8',
            '--warmup', 'none', '--checkpoint-every', '20', '--quiet']
    rc, ref, _, err = _run(tmp_path, 'ref', argv)
    assert rc == 0, err[-3000:]
    out = tmp_path / 'killed'
    job = Job(CLI + argv + ['--max-restarts', '2', '--restart-backoff-s', '0', '--out',
                            str(out)], tmp_path)
    rc, launcher = _mpiexec_signalled(job, out, signal.SIGKILL)
    assert rc == 0, job.err()[-3000:]
    _same_bits(ref, out)
    (f,) = _log(out)['failures']
    assert (f['status'], f['cause'], f['rank'], f['restarted']) == (
        3, 'mpiexec was killed by SIGKILL', None, True), f
    assert f['message'].startswith('theanompi-ext: mpiexec (pid %d on ' % launcher), f


def test_a_stop_sent_to_mpiexec_alone_is_not_restarted(tmp_path):
    """SIGTERM to mpiexec alone reaches every rank (launch/signal_marks.py): a stop of
    the job, 143, which the supervisor does not undo; the log says why. Before, it
    was a rank's death by signal 15, restarted."""
    argv = ['--workers', '2', '--model', 'mlp', '--batch-per-worker', '8', '--epochs', '1000',
            '--warmup', 'none', '--checkpoint-every', '1', '--eval-every', '1000', '--quiet',
            '--max-restarts', '2', '--restart-backoff-s', '0']
    out = tmp_path / 'stopped'
    job = Job(CLI + argv + ['--out', str(out)], tmp_path)
    rc, _ = _mpiexec_signalled(job, out, signal.SIGTERM)
    assert rc == 143, job.err()[-3000:]
    (f,) = _log(out)['failures']
    assert (f['status'], f['cause'], f['restarted']) == (
        143, 'the job was stopped by SIGTERM', False), f
    assert 'was sent SIGTERM, and not by this launcher' in f['message'], f
    assert _log(out)['result']['status'] == 143


def test_an_exception_on_a_rank_is_not_retried(tmp_path):
    """An exception on rank 0 (status 3): not restarted, the job ends with its
    status and message, the log says why. (Restarted failures: above; the
    budget spent and the other rules: test_restart_rules.py.)"""
    argv = ['--workers', '2', '--model', 'mlp', '--batch-per-worker', '8', '--epochs', '1',
            '--max-steps', '12', '--warmup', 'none', '--checkpoint-every', '2', '--quiet',
            '--max-restarts', '2', '--restart-backoff-s', '0']
    rc, out, _, err = _run(tmp_path, 'raise', argv, [(0, 0, 5, 'raise')])
    assert rc == 3, err[-3000:]
    assert 'RuntimeError: injected fault at iteration 5' in err
    assert 'not restarted: not a failure a restart can cure: an exception on a rank' in err
    log = _log(out)
    assert [(x['status'], x['restarted'], x['rank']) for x in log['failures']] == [
        (3, False, 0)]
    assert log['failures'][0]['message'].startswith('theanompi-ext: rank 0 of 2 failed: '
                                                    'RuntimeError')
    assert log['result']['status'] == 3


def test_budget_spent_ends_with_the_last_failure(tmp_path):
    """--max-restarts 1 and two kills: one restart, then the job ends with the
    second failure's status and message (the launcher's line kept as it was)
    and says the budget is spent; nothing of either attempt left running."""
    argv = ['--workers', '2', '--model', 'mlp', '--batch-per-worker', '8', '--epochs', '1',
            '--max-steps', '12', '--warmup', 'none', '--checkpoint-every', '2', '--quiet',
            '--max-restarts', '1', '--restart-backoff-s', '0']
    rc, out, _, err = _run(tmp_path, 'spent', argv, [(0, 1, 3, 'kill'), (1, 0, 7, 'kill')])
    assert rc == 9, err[-3000:]
    assert 'theanompi-ext: rank 0 of 2 (pid' in err and 'died: Killed (signal 9)' in err
    assert 'not restarted: the restart budget is spent (1 of 1); the last failure: a rank ' \
           'was killed by SIGKILL; the job ends with exit status 9' in err, err[-2000:]
    log = _log(out)
    assert [(x['status'], x['rank'], x['restarted'], x['failed_at_iteration'])
            for x in log['failures']] == [(9, 1, True, 3), (9, 0, False, 7)]
    assert log['result']['status'] == 9
    assert not (out / 'summary.json').exists()


def _cut_during_pause(job, eh, host, down_s, timeout):
    """When a rank announces its ``pause`` fault (train/attempt.py), take ``host``'s
    link down for ``down_s`` seconds; returns when it is up again."""
    t0 = time.monotonic()
    while 'FAULT pause' not in job.err():
        if job.proc.poll() is not None or time.monotonic() - t0 > timeout:
            return False
        time.sleep(0.05)
    eh.cut(host)
    try:
        time.sleep(down_s)
    finally:
        eh.restore(host)
    return True


# longer than --collective-timeout-s and --start-timeout-s below (a start on the loaded
# machine that takes longer than 12 s with the link up is one more restart, within 8)
CUT_S = 20


@pytest.mark.root
def test_far_host_killed_and_link_cut_restart_both_hosts_4_ranks_overlap_fp16_hdf5(tmp_path):
    """2 emulated hosts x 2 ranks, ar-overlap, a float16 wire, an HDF5 set with
    augmentation: a rank on the far host is SIGKILLed, then (in the restarted
    attempt) the far host's link is cut for 20 s, longer than the collective
    timeout and than the start timeout. The job restarts on both hosts each time
    (nothing of a failed attempt left on either; the attempts that meet the link
    still down do not start and are retried with a growing back-off) and ends
    with the bits of the run that never failed."""
    from theanompi_ext.data.hdf5 import write_dataset
    from theanompi_ext.launch.emulated_hosts import EmulatedHosts, hosts_problem
    if hosts_problem():
        pytest.skip(hosts_problem())
    rng = np.random.RandomState(3)
    data = str(tmp_path / 'set.h5')
    write_dataset(data, rng.randint(0, 256, (96, 10, 10, 3)).astype(np.uint8),
                  rng.randint(0, 10, 96), rng.randint(0, 256, (32, 10, 10, 3)).astype(np.uint8),
                  rng.randint(0, 10, 32), ['c%d' % i for i in range(10)])
    # 96 / (4 x 4) = 6 iterations per epoch, 18 in all
    argv = ['--workers', '4', '--model', 'digits_cnn', '--data', data, '--crop', '8',
            '--scale-min', '0.5', '--batch-per-worker', '4', '--epochs', '3',
            '--base-lr', '0.05', '--ref-batch', '16', '--warmup-epochs', '1',
            '--decay-epochs', '2', '--exch-strategy', 'ar-overlap', '--wire-dtype', 'float16',
            '--checkpoint-every', '2', '--max-restarts', '8', '--restart-backoff-s', '0',
            '--collective-timeout-s', '8', '--stall-warn-s', '4', '--start-timeout-s', '12',
            '--write-timeout-s', '12',
            '--quiet']
    rnd = random.Random(4029)
    a0 = rnd.randint(3, 8)
    a1 = rnd.randint(a0 + 3, 16) | 1     # odd: a step follows the pause, not a checkpoint
    faults = [(0, 3, a0, 'kill'), (1, 2, a1, 'pause')]
    with EmulatedHosts(hosts=2, ranks_per_host=2) as eh:
        env = dict(eh.env(), MPIR_CVAR_ENABLE_HEAVY_YIELD='1')
        argv += ['--hostfile', eh.hostfile]
        # 4 ranks on 2 cores shared with other jobs: a launch takes 1-4 min
        rc, ref, _, err = _run(tmp_path, 'ref', argv, env=env, timeout=600)
        assert rc == 0, err[-3000:]
        out = tmp_path / 'faults'
        full = dict(env, **{attempt.FAULTS_VAR: ';'.join('%d:%d:%d:%s' % f for f in faults)})
        job = Job(CLI + argv + ['--out', str(out)], tmp_path, full)
        cut = _cut_during_pause(job, eh, 'tmxh1', CUT_S, timeout=900)
        rc = job.wait(1200)
        job.finish()                     # nothing of any attempt is left running
        err = job.err()
    assert cut, 'the pause never came:\n' + err[-3000:]
    assert rc == 0, err[-4000:]
    print('\nfar-host rank killed after iteration %d, link cut %d s after iteration %d'
          % (a0, CUT_S, a1))
    summary = _same_bits(ref, out)
    f = _log(out)['failures']
    print('\n'.join('attempt %d: %s (status %d), back-off %.1f s, %.2f s to restart'
                    % (x['attempt'], x['cause'], x['status'], x['backoff_s'],
                       x['seconds_to_restart']) for x in f))
    # hydra ends with 255 when a rank dies on another host (its proxy saw exit code 9);
    # the launcher gives that as 9 (launch/postmortem.py), the cause as SIGKILL
    assert (f[0]['rank'], f[0]['host'], f[0]['failed_at_iteration']) == (3, 'tmxh1', a0), f
    assert f[0]['status'] in (9, 255), f
    assert 'SIGKILL' in f[0]['cause'] or 'exit code 9' in f[0]['cause'], f
    # the cut: the watchdog ends the attempt (status 4) where it was (a step's wait,
    # or a checkpoint's: write_timeout_s)
    assert f[1]['status'] == 4, f
    assert 'collective timed out' in f[1]['cause'] or 'write hung' in f[1]['cause'], f
    assert f[1]['failed_at_iteration'] == a1
    # the link may still be down at the next starts: those attempts never start
    assert all(x['cause'] in (restarts.START_CAUSE, restarts.UNREACHED_CAUSE) for x in f[2:]), f
    assert all(x['restarted'] for x in f)
    assert summary['restarts']['count'] == len(f)
