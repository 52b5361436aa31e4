"""A job suspended and resumed goes on (running_clock.py): every process of it
stopped (SIGSTOP), as a batch scheduler suspends a job (SLURM's ``scontrol
suspend``, LSF's ``bstop``), for longer than the collective timeout, then
continued (SIGCONT). No timeout fires on the resume, and the run ends with
the bits of a run never suspended. Only a process's own stop is left out of
its waits: a rank that waits for a stopped one still times out
(test_faults.py, test_faults_across_hosts.py).
"""
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from support.jobs import Job, wait_for
from support.paths import root_on_path
from support.suspend import (PAUSE, SUSPEND_S, assert_suspend_not_counted, rank_of,
                             suspend_and_resume)
from theanompi_ext.launch.job_control import process_state
from theanompi_ext.running_clock import RunningClock

STOP_S = 2.0


def _child(code, *args):
    return subprocess.Popen([sys.executable, '-c', code] + [str(a) for a in args],
                            stdout=subprocess.PIPE, text=True, env=root_on_path())


def _stopped_for(proc, seconds):
    """SIGSTOP ``proc`` once it printed its first line, SIGCONT ``seconds`` later;
    returns its last line, parsed as JSON."""
    assert proc.stdout.readline().strip() == 'ready'
    time.sleep(0.3)
    os.kill(proc.pid, signal.SIGSTOP)
    time.sleep(seconds)
    os.kill(proc.pid, signal.SIGCONT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    return json.loads(out.strip().splitlines()[-1])


TICKING = r'''
import json, sys, time
from theanompi_ext.running_clock import RunningClock
clock = RunningClock()
t0, r0 = time.monotonic(), clock.now()
print('ready', flush=True)
while time.monotonic() - t0 < float(sys.argv[1]):
    time.sleep(0.05)
    clock.tick(0.05)
print(json.dumps({'elapsed': time.monotonic() - t0, 'running': clock.now() - r0,
                  'stops': [s for s, _ in clock.stops]}))
'''


def test_a_stop_of_the_process_is_left_out():
    res = _stopped_for(_child(TICKING, STOP_S + 2.0), STOP_S)
    print('\nstopped %.2f s: found %s, elapsed %.2f s, running %.2f s'
          % (STOP_S, res['stops'], res['elapsed'], res['running']))
    assert len(res['stops']) == 1, res
    assert STOP_S - 0.2 <= res['stops'][0] <= STOP_S + 0.5, res
    assert abs(res['elapsed'] - res['running'] - res['stops'][0]) < 0.01, res


def test_a_long_gap_that_uses_the_cpu_is_not_a_stop():
    """The main thread holding the GIL (as a Theano function does) keeps the ticking
    thread from running for 1.5 s, but uses a core: nothing is left out."""
    clock, gaps, done = RunningClock(), [], threading.Event()

    def ticking():
        last = time.monotonic()
        while not done.is_set():
            time.sleep(0.02)
            clock.tick(0.02)
            now = time.monotonic()
            gaps.append(now - last)
            last = now
    old = sys.getswitchinterval()
    thread = threading.Thread(target=ticking, daemon=True)
    thread.start()
    time.sleep(0.1)
    sys.setswitchinterval(5.0)          # the main thread keeps the GIL while it computes
    try:
        t0, n = time.monotonic(), 0
        while time.monotonic() - t0 < 1.5:
            n += 1
    finally:
        sys.setswitchinterval(old)
    time.sleep(0.2)
    done.set()
    thread.join(5)
    assert max(gaps) > 1.2, max(gaps)   # the thread was kept out that long
    assert clock.stopped_s == 0.0 and clock.stops == []


def test_a_gap_counts_only_past_the_ticks_own_sleep():
    """A gap shorter than GAP_S past the tick's own sleep is never a stop."""
    clock = RunningClock(gap_s=0.5)
    time.sleep(0.6)
    assert clock.tick(0.3) == 0.0       # 0.3 s lost: under gap_s
    time.sleep(0.7)
    lost = clock.tick(0.0)              # 0.7 s lost, no CPU used: a stop
    assert 0.6 < lost < 1.2 and clock.stopped_s == lost


WATCHED = r'''
import json, sys, time
from theanompi_ext.collective.watchdog import Watchdog

class TwoRanks(object):
    name, rank, size = 'fake', 0, 2
    def allgather(self, obj):
        return [obj, (4242, 'elsewhere')]

aborted = []
dog = Watchdog(TwoRanks(), timeout_s=1.0, stall_warn_s=0, poll_s=0.02, reply_s=0.05,
               abort=aborted.append, stream=sys.stderr)
dog.arm(3)
print('ready', flush=True)
t0 = time.monotonic()
with dog.waiting('bucket0'):            # stopped in here, then 0.5 s more
    while time.monotonic() - t0 < float(sys.argv[1]):
        time.sleep(0.01)
stopped = list(aborted)
with dog.waiting('bucket1'):            # the control: a wait past the timeout, no stop
    t1 = time.monotonic()
    while not aborted and time.monotonic() - t1 < 10:
        time.sleep(0.01)
dog.close()
print(json.dumps({'after_stop': stopped, 'after_wait': aborted,
                  'waited': time.monotonic() - t1, 'stops': dog.clock.stops}))
'''


def test_the_watchdog_does_not_count_its_own_stop():
    """Stopped 2.5 s inside a watched wait (timeout 1 s): no abort at the resume;
    a wait of over 1 s afterwards still aborts (status 4)."""
    res = _stopped_for(_child(WATCHED, 0.3 + 2.5 + 0.5), 2.5)
    print('\n%s' % res)
    assert res['after_stop'] == [], res
    assert res['after_wait'] == [4] and 1.0 <= res['waited'] < 3.0, res
    assert len(res['stops']) == 1 and res['stops'][0][0] > 2.0, res


class _Running(object):
    """Stands for mpiexec: still running."""
    pid = -1

    def poll(self):
        return None


def _note(folder, rank, pid, host):
    (folder / ('rank%d' % rank)).write_text('%d %s training\n' % (pid, host))


def test_job_control_stops_the_ranks_of_this_host_or_says_why_not(tmp_path):
    """MPICH's case (launch/job_control.py), with two sleeping processes for ranks:
    every rank noted on this host is stopped, then continued; a rank on another host,
    or a rank not noted yet: nothing is stopped, and the line says why."""
    from theanompi_ext.launch.job_control import JobControl
    kids = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])
            for _ in range(2)]
    err = io.StringIO()
    try:
        control = JobControl(_Running(), False, str(tmp_path), 2, err)
        _note(tmp_path, 0, kids[0].pid, socket.gethostname())
        assert control.pause() is None            # rank 1 has no note yet
        assert 'not followed: not every rank has started yet; the job goes on' in \
            err.getvalue()
        _note(tmp_path, 1, kids[1].pid, 'node7')
        assert control.pause() is None
        assert 'MPICH cannot pause the ranks on other hosts (rank 1 on node7)' in \
            err.getvalue()
        assert 'T' not in [process_state(k.pid) for k in kids]
        _note(tmp_path, 1, kids[1].pid, socket.gethostname())
        resume = control.pause()
        wait_for(lambda: [process_state(k.pid) for k in kids] == ['T', 'T'], 10, 'both stopped')
        assert 'paused (SIGTSTP): every rank of the job is stopped' in err.getvalue()
        resume()
        wait_for(lambda: 'T' not in [process_state(k.pid) for k in kids], 10, 'both continued')
    finally:
        for k in kids:
            k.kill()
            k.wait()


TRAIN = ['train', '--workers', '2', '--model', 'digits_cnn', '--epochs', '1', '--warmup',
         'none', '--batch-per-worker', '16', '--base-lr', '0.05', '--ref-batch', '32',
         '--collective-timeout-s', '5', '--stall-warn-s', '4', '--write-timeout-s', '5',
         '--checkpoint-every', '4', '--quiet']


def _train(tmp_path, name, suspend=None):
    out = tmp_path / name
    env = root_on_path(MPIR_CVAR_ENABLE_HEAVY_YIELD='1', **(PAUSE if suspend else {}))
    job = Job([sys.executable, '-m', 'theanompi_ext.cli'] + TRAIN + ['--out', str(out)],
              tmp_path, env=env)
    if suspend:
        wait_for(lambda: 'FAULT pause rank 1' in job.err() or job.proc.poll() is not None,
                 240, "rank 1's pause")
        assert job.proc.poll() is None, job.err()[-3000:]
        suspend(job)
        t0 = time.monotonic()
    rc = job.wait(300)
    if suspend:
        print('\n%s -> the job ended %.2f s after the resume, status %d'
              % (suspend.__doc__.split(':')[0].strip(), time.monotonic() - t0, rc))
    job.finish()
    assert rc == 0, job.err()[-4000:]
    return np.load(str(out / 'params.npz')), job.err()


def _suspend_all(job):
    """Suspended: every process of the job (the launcher, mpiexec, its proxy, the
    ranks) stopped SUSPEND_S, then continued, the launcher and rank 0 first, the rest
    SKEW_S later (Open MPI's mpiexec passes a SIGCONT on to the ranks: it is continued
    with rank 1)."""
    procs = job.alive()
    ranks = {rank_of(p): p for p in procs if rank_of(p) is not None}
    assert sorted(ranks) == [0, 1], procs
    suspend_and_resume(procs, [p for p in procs if p not in (job.proc.pid, ranks[0])])


@pytest.fixture(scope='module')
def reference(tmp_path_factory):
    """The parameters of the run never stopped."""
    return _train(tmp_path_factory.mktemp('ref'), 'ref')[0]


def _same_bits(got, ref):
    assert sorted(got.files) == sorted(ref.files)
    for name in ref.files:
        assert np.array_equal(got[name], ref[name]), name


def test_a_job_suspended_longer_than_the_timeout_goes_on(tmp_path, reference):
    """Stopped while rank 0 waits in a collective for rank 1 (in its pause), for
    8 s (timeout 5 s), rank 1 continued 2.5 s after rank 0: the job ends with
    status 0, no timeout and no wait that counts the suspend (a stall line of rank 0's
    own wait may come on a loaded machine: support/suspend.py), with the bits of the
    run never stopped."""
    got, err = _train(tmp_path, 'suspended', _suspend_all)
    assert_suspend_not_counted(err)
    _same_bits(got, reference)


def _ctrl_z(job):
    """Ctrl-Z then fg: SIGTSTP to the launcher (the terminal's foreground process
    group); it and every rank stop; SUSPEND_S later, SIGCONT to the launcher alone."""
    ranks = [p for p in job.alive() if rank_of(p) is not None]
    assert len(ranks) == 2, job.alive()
    t0 = time.monotonic()
    os.kill(job.proc.pid, signal.SIGTSTP)
    wait_for(lambda: all(process_state(p) == 'T' for p in [job.proc.pid] + ranks), 10,
             'the launcher and every rank stopped')
    print('\nCtrl-Z: the launcher and both ranks stopped within %.2f s'
          % (time.monotonic() - t0))
    time.sleep(SUSPEND_S)
    assert all(process_state(p) == 'T' for p in [job.proc.pid] + ranks), job.err()[-3000:]
    os.kill(job.proc.pid, signal.SIGCONT)


def test_ctrl_z_pauses_every_rank_and_fg_resumes_them(tmp_path, reference):
    """SIGTSTP to the launcher: it stops every rank (MPICH: each rank of this host;
    Open MPI: through its mpiexec), then itself; SIGCONT to it resumes them all. Paused
    8 s (timeout 5 s) while rank 0 waits for rank 1: status 0, the bits of the run
    never paused (launch/job_control.py)."""
    got, err = _train(tmp_path, 'ctrl-z', _ctrl_z)
    assert 'theanompi-ext: paused (SIGTSTP): every rank of the job is stopped' in err, err
    assert 'theanompi-ext: resumed: every rank of the job goes on' in err, err
    assert 'no progress' not in err and 'stall:' not in err, err[-3000:]
    _same_bits(got, reference)
