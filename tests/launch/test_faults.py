"""Faults and bad input: no hang, no lost work, clear errors (docs/faults.md).

Multi-rank cases run real ``mpiexec`` jobs with one fault injected on one
rank (tests/mpi/run_faults.py). Every job runs under a hard timeout that
kills the launcher and all its descendants, so a regression fails instead
of hanging. Measured times are printed (``pytest -s``).
"""
import argparse
import dataclasses
import io
import json
import math
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from theanompi_ext import errors
from theanompi_ext.launch import rank_notes
from theanompi_ext.train import faults, options, replicas
from theanompi_ext.train.config import TrainConfig

from support.configs import write_cfg
from support.paths import MPI_DIR, ROOT
from support.procs import alive as _alive, explained, job, mpi_cmd


# --------------------------------------------------------------------------- helpers

def fault_time(err):
    m = re.search(r'FAULT \S+ rank \d+ pid (\d+) at ([0-9.]+)', err)
    assert m, err[-3000:]
    return int(m.group(1)), float(m.group(2))


def run_fault(tmp_path, fault, rank=1, at=2, arg=0.0, launcher=False, **cfg):
    path = write_cfg(str(tmp_path / 'cfg.json'), **cfg)
    cmd = mpi_cmd(2, 'run_faults.py', path, tmp_path, fault, rank, at, arg)
    return job(explained(cmd, 2) if launcher else cmd)


# --------------------------------------------------------------------------- a rank dies

def test_sigkilled_rank_ends_job_fast_and_is_named(tmp_path):
    """SIGKILL (what the OOM killer sends) mid-training: hydra stops the job; the
    launcher names the rank from hydra's PID."""
    rc, out, err, t_end = run_fault(tmp_path, 'kill', launcher=True)
    pid, t_kill = fault_time(err)
    print('\nSIGKILL of rank 1 -> job exit: %.2f s' % (t_end - t_kill))
    assert rc == 9, (rc, out[-2000:], err[-2000:])
    assert re.search(r'rank 1 of 2 \(pid %d on \S+\) died: Killed \(signal 9\)' % pid, err), err
    assert t_end - t_kill < 15
    assert not _alive(pid)


def test_sigterm_to_one_rank_names_that_rank(tmp_path):
    """SIGTERM to one rank alone (``kill PID``) is that rank's death, named as for
    SIGKILL, status 15: not a stop of the job from outside, which needs every rank
    marked (launch/signal_marks.py). Open MPI's prterun sends the other rank
    SIGTERM itself after reporting the first, so there both ranks are marked: its
    report of rank 1 decides."""
    rc, out, err, t_end = run_fault(tmp_path, 'term', launcher=True)
    pid, t_kill = fault_time(err)
    assert rc == 15, (rc, out[-2000:], err[-2000:])
    assert re.search(r'theanompi-ext: rank 1 of 2 \(pid %d on \S+\) died: Terminated '
                     r'\(signal 15\); mpiexec stopped the other ranks \(exit status 15\)$' % pid,
                     err.replace('\0', '').strip().splitlines()[-1]), err[-3000:]
    assert 'was sent SIGTERM' not in err
    assert t_end - t_kill < 15
    assert not _alive(pid)


def test_sigint_to_one_rank_names_that_rank(tmp_path):
    """SIGINT to one rank alone (``kill -INT PID``): that rank stops as for Ctrl-C
    and ends the job, named, status 130; only it is marked, so this is no stop of
    every rank from outside (launch/signal_marks.py; Open MPI's prterun sends the
    other rank SIGTERM after the abort, a mark of another signal)."""
    rc, out, err, t_end = run_fault(tmp_path, 'int', launcher=True)
    pid, t_int = fault_time(err)
    assert rc == 130, (rc, out[-2000:], err[-2000:])
    assert 'theanompi-ext: rank 1 of 2 stopped by SIGINT (exit status 130)' in err, err[-3000:]
    assert re.match(r'theanompi-ext: rank 1 of 2 \(pid %d on \S+\) ended the job \(exit '
                    r'status 130\); its own line above says why$' % pid,
                    err.replace('\0', '').strip().splitlines()[-1]), err[-3000:]
    assert 'was sent SIGINT' not in err and 'was sent SIGTERM' not in err, err[-3000:]
    assert t_end - t_int < 15
    assert not _alive(pid)


def test_hung_rank_times_out_with_report_naming_it(tmp_path):
    """A stopped rank (alive, no progress): the others warn after stall_warn_s, abort
    after collective_timeout_s with exit status 4, naming the rank."""
    rc, out, err, t_end = run_fault(tmp_path, 'stop', collective_timeout_s=3, stall_warn_s=1)
    pid, t_stop = fault_time(err)
    print('\nSIGSTOP of rank 1 -> job exit: %.2f s (timeout 3 s)' % (t_end - t_stop))
    assert rc == 4, (rc, err[-3000:])
    assert "stall: rank 0 of 2 has waited" in err and "'loss stats' at step 2" in err
    assert re.search(r"rank 0 of 2 \(pid \d+ on \S+\): no progress for [0-9.]+ s in "
                     r"'loss stats' at step 2 \(collective_timeout_s=3\); not arrived: "
                     r"rank 1 \(pid %d on \S+\) no answer" % pid, err), err
    assert 3 <= t_end - t_stop < 3 + 20
    time.sleep(0.5)
    assert not _alive(pid)          # the stopped rank was killed with the job


def test_exception_on_one_rank_aborts_every_rank(tmp_path):
    rc, out, err, _ = run_fault(tmp_path, 'raise', launcher=True)
    assert rc == 3, (rc, err[-3000:])
    assert 'rank 1 of 2 failed: MemoryError: injected' in err
    # the launcher's line last, after MPI's abort report: the rank MPI names, with the
    # pid and host of its note
    assert re.match(r'theanompi-ext: rank 1 of 2 \(pid \d+ on %s\) ended the job \(exit status '
                    r'3\); its own line above says why$' % re.escape(socket.gethostname()),
                    err.replace('\0', '').strip().splitlines()[-1]), err[-3000:]


def test_rank_exiting_0_mid_run_is_not_success(tmp_path):
    """hydra reports success (status 0) most of the time when a rank calls exit(0)
    mid-run, Open MPI status 1 with a text of its own; the launcher sees the rank
    never finished and says so with status 3."""
    rc, out, err, _ = run_fault(tmp_path, 'exit0', launcher=True)
    print('\nexit(0) of rank 1 mid-run -> status %d' % rc)
    assert rc != 0, err[-3000:]
    if rc == 3:
        assert re.search(r'rank 1 \(pid \d+ on \S+\) of 2 ended without finishing training '
                         r'.*; the run is incomplete \(exit status 3\)', err), err
    assert not (tmp_path / 'summary0.json').exists()


# ------------------------------------------------------- uneven data, stalls, replicas

def test_uneven_data_runs_same_steps_everywhere_with_stall_report(tmp_path):
    """N not a multiple of kn (embedded digits, then an HDF5 source; an MLP with BN):
    every rank runs floor(N/kn) steps per epoch. A 2.5 s pause of rank 1 is
    reported (stall_warn_s=1) and the run still finishes. Replica checks every
    step, with the local BN drift measured."""
    from theanompi_ext.data.hdf5 import write_dataset
    rng = np.random.RandomState(0)
    h5 = str(tmp_path / 'small.h5')
    write_dataset(h5, rng.randint(0, 256, (50, 8, 8, 1)).astype(np.uint8),
                  rng.randint(0, 10, 50), rng.randint(0, 256, (10, 8, 8, 1)).astype(np.uint8),
                  rng.randint(0, 10, 10), ['c%d' % i for i in range(10)])
    common = dict(epochs=3, warmup='none', quiet=True, eval_every=100, stall_warn_s=1,
                  collective_timeout_s=60, check_replicas_every=1)
    model_kw = {'hidden': [8], 'bn': True}
    cfgs = [dict(common, model='mlp', batch_per_worker=8, max_steps=8,
                 extra={'train_subset': 100, 'model_kw': model_kw}),
            dict(common, model='mlp', data=h5, batch_per_worker=4, max_steps=7,
                 exchange_bn=True, extra={'model_kw': model_kw})]
    path = tmp_path / 'cfgs.json'
    path.write_text(json.dumps(cfgs))
    rc, out, err, _ = job(mpi_cmd(2, 'run_faults.py', path, tmp_path, 'sleep', 1, 3, 2.5))
    assert rc == 0, err[-3000:]
    # 100 = 6*16 + 4 and 50 = 6*8 + 2: six steps per epoch, the rest skipped
    for i, total in enumerate((8, 7)):
        ranks = [json.loads((tmp_path / ('rank%d_%d.json' % (r, i))).read_text())
                 for r in (0, 1)]
        assert ranks[0] == ranks[1] == {'iteration': total, 'iters_per_epoch': 6}
    s = json.loads((tmp_path / 'summary0.json').read_text())
    rep = s['replicas']
    assert rep['checks'] == 8 and rep['identical'] and rep['bn_drift_param'].endswith(
        ('gamma', 'beta'))
    assert 0 < rep['bn_drift_max'] < 1
    assert s['history'][0]['replica_checks'] == 6 and s['history'][0]['bn_drift'] > 0
    s1 = json.loads((tmp_path / 'summary1.json').read_text())
    # gamma/beta exchanged: nothing local to drift
    assert s1['replicas']['checks'] == 7 and s1['replicas']['bn_drift_max'] is None
    m = re.search(r"stall: rank 0 of 2 has waited [0-9.]+ s in '([^']+)' at step 3 "
                  r"\(stall_warn_s=1\); not arrived: rank 1 \(pid \d+ on \S+\) between steps "
                  r"\(the last begun: step 2\)", err)
    assert m, err[-3000:]
    assert 'no progress' not in err


def test_diverged_replicas_stop_every_rank_naming_them(tmp_path):
    rc, out, err, _ = run_fault(tmp_path, 'corrupt', at=2, arg=1e-3, check_replicas_every=1)
    assert rc == 3, err[-3000:]
    # found by both ranks alike: said once, by rank 0, for both
    assert len(re.findall(r'all 2 ranks failed: ReplicaMismatch: exchanged parameters differ '
                          r'across ranks after iteration 3: rank 0 .* vs rank 1 .*; no '
                          r'majority', err)) == 1, err[-3000:]
    assert 'of 2 failed' not in err, err[-3000:]


def test_nan_in_one_ranks_data_stops_every_rank_at_that_iteration(tmp_path):
    rc, out, err, _ = run_fault(tmp_path, 'nan', at=2)
    assert rc == 3, err[-3000:]
    # the injected fault's frame differs by rank ([at run_faults.py:N]), so rank 0
    # says a line for each rank (tests/launch/test_failure_said_once.py: alike)
    for r in (0, 1):
        assert len(re.findall(r'rank %d of 2 failed: NonFiniteLoss: non-finite loss \(nan\) at '
                              r'iteration 2 ' % r, err)) == 1, err[-3000:]


# --------------------------------------------------------------------------- watchdog unit

class _FakeTwoRanks(object):
    """Rank 0 of a pretend world of 2 with no MPI side channel."""
    name, rank, size = 'fake', 0, 2

    def allgather(self, obj):
        return [obj, (4242, 'elsewhere')]


def _dog(**kw):
    from theanompi_ext.collective.watchdog import Watchdog
    aborted = []
    stream = io.StringIO()
    kw.setdefault('poll_s', 0.02)
    dog = Watchdog(_FakeTwoRanks(), stream=stream, abort=aborted.append, reply_s=0.05, **kw)
    return dog, aborted, stream


def _armed_wait(dog, step, label, until, limit_s=10):
    """Seconds spent in watched wait ``label`` at ``step`` until ``until`` is not
    empty (or ``limit_s``); the watchdog closed after."""
    try:
        dog.arm(step)
        t0 = time.monotonic()
        with dog.waiting(label):
            while not until and time.monotonic() - t0 < limit_s:
                time.sleep(0.01)
        return time.monotonic() - t0
    finally:
        dog.close()


def test_watchdog_times_out_only_armed_waits():
    dog, aborted, stream = _dog(timeout_s=0.3, stall_warn_s=0.1)
    with dog.waiting('compile'):          # disarmed: start-up, evaluation
        time.sleep(0.5)
    assert not aborted and not stream.getvalue()
    waited = _armed_wait(dog, 5, 'bucket1', aborted)
    assert aborted == [4] and 0.3 <= waited < 3
    text = stream.getvalue()
    assert "stall: rank 0 of 2 has waited" in text
    assert "no progress for" in text and "'bucket1' at step 5" in text
    assert 'cannot be asked' in text and 'exit status 4' in text


def test_a_watchdog_held_inside_mpi_is_covered_by_its_sentinel():
    """The watchdog thread's own MPI call never returns (MPICH's lock held by the main
    thread's collective, a peer dead: measured across emulated hosts): the sentinel,
    which calls no MPI, ends the rank without MPI, past the limit + reply_s +
    stuck_s, naming the wait; the watchdog's abort is never reached."""
    from theanompi_ext.collective.watchdog import Watchdog

    class HeldInMPI(Watchdog):
        def _serve(self, answers=None):
            if self.armed:
                time.sleep(60)          # an Iprobe waiting for a lock nobody gives back
    aborted, ended, stream = [], [], io.StringIO()
    dog = HeldInMPI(_FakeTwoRanks(), timeout_s=0.3, stall_warn_s=0, poll_s=0.02,
                    reply_s=0.05, stream=stream, abort=aborted.append, end=ended.append,
                    stuck_s=0.5)
    waited = _armed_wait(dog, 7, 'bucket2', ended, limit_s=20)
    assert ended == [4] and not aborted
    assert 0.85 <= waited < 5, waited
    text = stream.getvalue()
    assert re.match(r"theanompi-ext: rank 0 of 2 \(pid \d+ on \S+\): no progress for [\d.]+ s in "
                    r"'bucket2' at step 7; the MPI library itself is stuck \(the watchdog's own "
                    r"MPI call has not returned for [\d.]+ s: .*\); ending this rank without MPI "
                    r"\(exit status 4\)$", text.strip()), text


def test_the_sentinel_stands_by_while_the_watchdog_runs():
    """A watchdog that goes round its loop: the sentinel never ends the rank, the
    watchdog's own abort does (at its limit)."""
    aborted, ended, stream = [], [], io.StringIO()
    from theanompi_ext.collective.watchdog import Watchdog
    dog = Watchdog(_FakeTwoRanks(), timeout_s=0.3, stall_warn_s=0, poll_s=0.02, reply_s=0.05,
                   stream=stream, abort=aborted.append, end=ended.append, stuck_s=0.2)
    try:
        dog.arm(1)
        with dog.waiting('loss stats'):
            time.sleep(2.0)
    finally:
        dog.close()
    assert aborted == [4] and not ended, stream.getvalue()


def test_watchdog_limit_stretches_with_long_steps():
    dog, aborted, stream = _dog(timeout_s=0.05, stall_warn_s=0)
    try:
        for step in range(3):
            dog.arm(step)
            time.sleep(0.1)
            dog.disarm()
        assert 0.4 <= dog.limit() < 1.0          # 4 x the median step, not 0.05 s
        dog.arm(3)
        with dog.waiting('loss stats'):
            time.sleep(0.2)                       # longer than timeout_s, within the limit
        dog.disarm()
    finally:
        dog.close()
    assert not aborted


def test_watchdog_off_when_timeouts_are_zero():
    dog, aborted, stream = _dog(timeout_s=0, stall_warn_s=0)
    assert not dog.enabled and dog._thread is None
    dog.arm(0)
    with dog.waiting('x'):
        time.sleep(0.05)
    assert not aborted


def test_not_arrived_rule():
    from theanompi_ext.collective.watchdog import PeerState, Watchdog
    a = {1: PeerState(1, 7, 3, 'loss stats', True, 1.0, True),
         2: PeerState(2, 6, 3, '', False, 1.0, True), 3: None,
         4: PeerState(4, 8, 4, 'bucket0', True, 0.1, True)}
    assert Watchdog.not_arrived(7, a) == [2, 3]
    assert 'computing for 1.0 s' in a[2].describe()



def _asking_dog(hosts):
    """A watchdog of rank 0 of len(hosts) ranks, host i = ``hosts[i]``, as if it had a
    side channel (no thread: the report's text is asked for directly)."""
    from theanompi_ext.collective.watchdog import Watchdog
    dog = Watchdog(_FakeTwoRanks(), timeout_s=0, stall_warn_s=0, stream=io.StringIO(),
                   abort=lambda status: None)
    dog.size = len(hosts)
    dog.identities = [(100 + r, h) for r, h in enumerate(hosts)]
    dog._chan = object()
    return dog


def test_a_silent_rank_across_a_slow_link_is_told_by_its_last_answer():
    """A rank on another host that said, at an earlier inquiry of this same wait, that
    it was waiting here, and answers no more (its answer queued behind the data on a
    crawling link, measured on emulated hosts at 64 kbit/s): the report names the
    link, not "dead, stopped, or busy" alone."""
    from theanompi_ext.collective.watchdog import PeerState
    dog = _asking_dog(['h0', 'h1'])
    dog._seen = {1: (PeerState(1, 7, 3, 'bucket1', True, 2.0, True), dog.clock.now() - 2.5)}
    text = dog._missing_text(7, {1: None})
    assert re.match(r"not arrived: rank 1 \(pid 101 on h1\) no answer within 2\.0 s \(it "
                    r"answered 2\.\d s ago, in this wait or past it: the link to h1 is slow, "
                    r"lossy, congested or cut, or it was stopped since\)$", text), text
    # an answer from an earlier wait (seq 6) says nothing of this one
    dog._seen[1] = (PeerState(1, 6, 3, 'loss stats', True, 2.0, True), dog.clock.now())
    text = dog._missing_text(7, {1: None})
    assert text == ('not arrived: rank 1 (pid 101 on h1) no answer within 2.0 s (dead, '
                    'stopped, or busy in compiled code holding the GIL, or the link to h1 '
                    'slow, lossy or cut)'), text


def test_silent_ranks_on_this_host_and_every_rank_arrived():
    from theanompi_ext.collective.watchdog import PeerState
    dog = _asking_dog(['h0', 'h0', 'h1'])
    # on this host no link is blamed: a writer stopped inside its write, say
    dog._seen = {1: (PeerState(1, 9, 3, 'checkpoint', True, 1.0, True), dog.clock.now())}
    text = dog._missing_text(9, {1: None, 2: None})
    assert re.match(r'not arrived: rank 1 \(pid 101 on h0\) no answer within 2\.0 s \(it '
                    r'answered 0\.\d s ago, in this wait or past it: stopped since, or busy in '
                    r'compiled code holding the GIL\); rank 2 \(pid 102 on h1\) no answer '
                    r'within 2\.0 s \(dead, stopped, or busy in compiled code holding the GIL, '
                    r'or the link to h1 slow, lossy or cut\)$', text), text
    # every rank answers from inside the wait: stuck, or slow between hosts
    here = {r: PeerState(r, 9, 3, 'bucket0', True, 1, True) for r in (1, 2)}
    assert dog._missing_text(9, here) == ('every rank has arrived (the collective itself '
                                          'is stuck, or too slow across a slow, lossy or '
                                          'congested link between hosts)')
    one_host = _asking_dog(['h0', 'h0'])
    assert one_host._missing_text(9, {1: here[1]}) == ('every rank has arrived (the '
                                                       'collective itself is stuck)')

# --------------------------------------------------------------------------- launcher report

HYDRA = b"""
===================================================================================
=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES
=   PID 17436 RUNNING AT node7
=   EXIT CODE: 9
=   CLEANING UP REMAINING PROCESSES
=   YOU CAN IGNORE THE BELOW CLEANUP MESSAGES
===================================================================================
YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Killed (signal 9)
"""


def test_launcher_report_maps_pid_to_rank():
    from theanompi_ext.launch.launcher_report import LauncherReport
    from theanompi_ext.launch.why_ended import explain
    rep = LauncherReport()
    for line in HYDRA.splitlines(True):
        rep.feed(line)
    notes = {0: (17435, 'node7', 'running'), 1: (17436, 'node7', 'running')}
    msg, status = explain(9, rep, notes, 2)
    assert status == 9 and 'rank 1 of 2 (pid 17436 on node7) died: Killed (signal 9)' in msg
    msg, status = explain(9, rep, {}, 2)
    assert 'its rank is unknown' in msg
    assert explain(0, LauncherReport(), {0: (1, 'h', 'done 0')}) == (None, 0)
    msg, status = explain(0, LauncherReport(), {0: (1, 'h', 'done 0'), 1: (2, 'h', 'running')})
    assert status == 3 and 'rank 1 (pid 2 on h) ended without finishing' in msg
    # the ranks ended the job themselves (their own lines say why): the launcher's
    # line still comes last, naming the rank that failed, or the status alone
    failed0 = {0: (17435, 'node7', 'failed 4'), 1: (17436, 'node8', 'running')}
    assert explain(4, LauncherReport(), failed0, 2) == (
        'theanompi-ext: rank 0 of 2 (pid 17435 on node7) ended the job (exit status 4); its '
        'own line above says why', 4)
    both = {0: (17435, 'node7', 'failed 2'), 1: (17436, 'node8', 'failed 2')}
    assert explain(2, LauncherReport(), both, 2) == (
        'theanompi-ext: all 2 ranks (on node7, node8) ended the job (exit status 2); '
        "rank 0's report above says why", 2)
    # some of them: named as spans, however many
    some = dict((r, (100 + r, 'node%d' % (r // 4), 'failed 3' if r in (0, 1, 2, 5) else
                     'running')) for r in range(8))
    assert explain(3, LauncherReport(), some, 8) == (
        'theanompi-ext: ranks 0-2, 5 of 8 (on node0, node1) ended the job (exit status 3); '
        'their own lines above say why', 3)
    # every rank that left a note failed, but a rank left none: not "all"
    assert explain(2, LauncherReport(), both, 3)[0].startswith(
        'theanompi-ext: ranks 0, 1 of 3 (on node7, node8) ended the job')
    assert explain(4, LauncherReport(), notes) == (
        'theanompi-ext: the job ended with exit status 4; mpiexec gave no report and no rank '
        'noted an error (the lines above may say why): ranks 0, 1 had not finished training', 4)
    assert explain(4, LauncherReport(), {}) == (
        "theanompi-ext: the job ended with exit status 4; the ranks' lines above say why", 4)
    # mpiexec killed from outside (wait's -9): said, status 3, whatever the ranks' notes
    # say of training; a rank's own error noted first is the story instead
    assert explain(-9, LauncherReport(), notes, 2, mpiexec_pid=321) == (
        'theanompi-ext: mpiexec (pid 321 on %s) was killed by SIGKILL (signal 9), not by '
        'this launcher (the OOM killer sends SIGKILL, as kill -9 does); its ranks ended with '
        'it; ranks 0, 1 of 2 had not finished training (exit status 3)'
        % socket.gethostname(), 3)
    done = {0: (1, 'h', 'done 0'), 1: (2, 'h', 'done 0')}
    assert explain(-1, LauncherReport(), done, 2, mpiexec_pid=7) == (
        'theanompi-ext: mpiexec (pid 7 on %s) was killed by SIGHUP (signal 1), not by this '
        'launcher; its ranks ended with it (exit status 3)' % socket.gethostname(), 3)
    failed = {0: (1, 'h', 'failed 4'), 1: (2, 'h', 'running')}
    assert explain(-9, LauncherReport(), failed, 2) == (
        'theanompi-ext: rank 0 of 2 (pid 1 on h) ended the job (exit status 4); its own line '
        'above says why', 4)
    # a rank's death that mpiexec reported before it was killed: that death, status 3
    msg, status = explain(-9, rep, notes, 2)
    assert status == 3 and 'rank 1 of 2 (pid 17436 on node7) died: Killed (signal 9)' in msg
    # Hydra named rank 1, but rank 0 was seen to exit first: rank 0 died.
    msg, status = explain(9, rep, notes, 2, first_exit=0)
    assert 'rank 0 of 2 (pid 17435 on node7) died' in msg
    # ... unless rank 0 had finished normally (its exit was not a death)
    done0 = {0: (17435, 'node7', 'done 0'), 1: (17436, 'node7', 'running')}
    assert 'rank 1 of 2 (pid 17436' in explain(9, rep, done0, 2, first_exit=0)[0]


# Open MPI 5.0.11's prterun (standard error), wrapped where its names put the line end.
OPENMPI_SIGNAL = b"""--------------------------------------------------------------------------
prterun noticed that process rank 1 with PID 12109 on node vm exited on
signal 9 (Killed).
--------------------------------------------------------------------------
"""
OPENMPI_IMPROPER = b"""--------------------------------------------------------------------------
prterun has exited due to process rank 1 with PID 13736 on node a-longer-host-name
exiting improperly. There are three reasons this could occur:

1. this process did not call "init" before exiting, but others in the
"""


OPENMPI_ABORT = b"""--------------------------------------------------------------------------
MPI_ABORT was invoked on rank 0 in communicator MPI_COMM_WORLD
  Proc: [[44865,1],0]
  Errorcode: 4

NOTE: invoking MPI_ABORT causes Open MPI to kill all MPI processes.
--------------------------------------------------------------------------
--------------------------------------------------------------------------
prterun has exited due to process rank 0 with PID 0 on node tmxh0 calling
"abort". This may have caused other processes in the application to be
"""


# MPICH 4 (the rank's own standard error; "node" is its rank in MPI_COMM_WORLD).
MPICH_ABORT = (b"Abort(4) on node 1 (rank 1 in comm 0): application called "
               b"MPI_Abort(MPI_COMM_WORLD, 4) - process 1\n")


def _report(text):
    from theanompi_ext.launch.postmortem import LauncherReport
    rep = LauncherReport()
    for line in text.splitlines(True):
        rep.feed(line)
    return rep


def test_openmpi_report_is_told_like_hydras():
    """Open MPI names the rank and exits 128 + N for a rank killed by signal N: the
    launcher says the same as under hydra, with hydra's status N (129-143 stay the
    launcher's own stop); a rank gone without MPI_Finalize is an unfinished run."""
    from theanompi_ext.launch.why_ended import explain
    rep = _report(OPENMPI_SIGNAL)
    assert (rep.rank, rep.pid, rep.host, rep.signal) == (1, 12109, 'vm', 9)
    notes = {0: (12108, 'vm', 'running'), 1: (12109, 'vm', 'running')}
    msg, status = explain(137, rep, notes, 2)
    assert status == 9
    assert 'rank 1 of 2 (pid 12109 on vm) died: Killed (signal 9); mpiexec stopped' in msg
    # no notes (it died before writing one): Open MPI's rank number still names it
    assert 'rank 1 of 2 (pid 12109 on vm) died' in explain(137, rep, {}, 2)[0]
    rep = _report(OPENMPI_IMPROPER)
    assert rep.unfinished and (rep.rank, rep.pid) == (1, 13736)
    notes = {0: (13735, 'h', 'running'), 1: (13736, 'h', 'running')}
    msg, status = explain(1, rep, notes, 2)
    assert status == 3 and re.search(
        r'rank 1 \(pid 13736 on a-longer-host-name\) of 2 ended without finishing training '
        r'.*; the run is incomplete \(exit status 3\)', msg), msg
    # Open MPI named no rank this process maps to (PID 0, no rank): the status alone
    bare = _report(OPENMPI_IMPROPER)
    bare.rank, bare.pid = None, 0
    assert explain(1, bare, {}, 2) == (
        "theanompi-ext: the job ended with exit status 1; the ranks' lines above say why", 1)
    # a rank that had finished training: told as such, with Open MPI's status
    assert explain(1, rep, {**notes, 1: (13736, 'h', 'done 0')}, 2) == (
        'theanompi-ext: rank 1 of 2 (pid 13736 on a-longer-host-name) exited without '
        'finalizing MPI after it had finished training; mpiexec ended the job (exit status '
        '1)', 1)


def test_openmpi_abort_then_a_mpiexec_that_does_not_end_is_stopped():
    """prterun reports a rank's MPI_Abort, then waits for ever for a host it cannot
    reach: AfterAbort stops it and the status is the rank's, its host named."""
    import time
    from theanompi_ext.launch.postmortem import AfterAbort
    from theanompi_ext.launch.why_ended import explain
    rep = _report(OPENMPI_ABORT)
    assert rep.aborted == (0, 'tmxh0', 4) and rep.pid is None
    assert _report(OPENMPI_SIGNAL).aborted is None
    # the aborting rank is the one named, whatever the other notes say
    msg, status = explain(4, rep, {0: (13105, 'tmxh0', 'running'),
                                   1: (13106, 'tmxh1', 'failed 3')}, 2)
    assert (msg, status) == ('theanompi-ext: rank 0 of 2 (pid 13105 on tmxh0) ended the job '
                             '(exit status 4); its own line above says why', 4)
    # MPICH says it in the rank's own output, without the host: the notes give it
    mpich = _report(MPICH_ABORT)
    assert mpich.aborted == (1, None, 4) and mpich.pid is None
    assert explain(4, mpich, {1: (7, 'tmxh1', 'running')}, 2)[0].startswith(
        'theanompi-ext: rank 1 of 2 (pid 7 on tmxh1) ended the job (exit status 4)')
    assert explain(4, mpich, {}, 2)[0].startswith(
        'theanompi-ext: rank 1 of 2 (on an unknown host) ended the job')
    # the same words inside another line (a rank quoting them): not an abort
    assert _report(b'x Abort(4) on node 1 (rank 0 in comm 0): application called '
                   b'MPI_Abort(MPI_COMM_WORLD, 4) - process 1\n').aborted is None
    proc = subprocess.Popen(['sleep', '30'])
    stopped = []
    watch = AfterAbort(proc, rep, lambda: stopped.append(proc.kill()), wait_s=0.2,
                       interval=0.01)
    t0 = time.monotonic()
    watch.start()
    watch.join(10)
    proc.wait()
    assert watch.fired and stopped and 0.2 <= time.monotonic() - t0 < 5
    msg, status = watch.message(2, {0: (13105, 'tmxh0', 'running')})
    assert status == 4 and msg.startswith('theanompi-ext: rank 0 of 2 (pid 13105 on tmxh0) '
                                          'aborted the job; mpiexec had not ended'), msg
    # a mpiexec that ends by itself is left alone
    quick = subprocess.Popen(['true'])
    watch = AfterAbort(quick, rep, lambda: stopped.append('again'), wait_s=5, interval=0.01)
    watch.start()
    watch.join(10)
    assert not watch.fired and stopped == [None]


def test_exit_order_sees_which_rank_exited_first(tmp_path):
    import socket
    import time
    from theanompi_ext.launch.exit_order import ExitOrder
    procs = [subprocess.Popen(['sleep', '30']) for _ in range(2)]
    try:
        for rank, p in enumerate(procs):
            (tmp_path / ('rank%d' % rank)).write_text('%d %s running\n' % (
                p.pid, socket.gethostname()))
        watch = ExitOrder(str(tmp_path), 2, interval=0.01)
        watch.start()
        time.sleep(0.3)                  # the watch has found both notes
        procs[1].kill()
        time.sleep(0.1)
        procs[0].kill()
        for p in procs:
            p.wait()
        watch.join(5)
        assert [r for _, r in watch.exits] == [1, 0] and watch.first() == 1
        assert watch.wall[1] < watch.wall[0]       # and when, by the wall clock
    finally:
        for p in procs:
            p.kill()


def test_rank_notes_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv(rank_notes.RANKS_DIR_VAR, str(tmp_path))
    faults.note_rank('running', rank=3)
    faults.note_rank('failed 2', rank=3)
    (tmp_path / 'rank9').write_text('garbage')
    assert rank_notes.read_rank_notes(str(tmp_path)) == {3: (os.getpid(), os.uname()[1], 'failed 2')}


def test_stale_ranks_folders_of_dead_launchers_are_removed(tmp_path):
    """A SIGKILLed launcher leaves its notes folder; the next one removes it, and
    nothing else: not a live launcher's, not a link, not another name."""
    dead = subprocess.Popen(['true'])
    dead.wait()
    gone = tmp_path / ('%s%d-abc' % (rank_notes.RANKS_PREFIX, dead.pid))
    live = tmp_path / ('%s%d-def' % (rank_notes.RANKS_PREFIX, os.getpid()))
    other = tmp_path / 'theanompi-ext-ranks-xyz'
    for d in (gone, live, other):
        d.mkdir()
        (d / 'rank0').write_text('1 host running\n')
    target = tmp_path / 'kept'
    target.mkdir()
    link = tmp_path / ('%s%d-lnk' % (rank_notes.RANKS_PREFIX, dead.pid))
    link.symlink_to(target)
    made = rank_notes.make_ranks_folder(str(tmp_path))
    assert os.path.basename(made).startswith('%s%d-' % (rank_notes.RANKS_PREFIX, os.getpid()))
    assert sorted(os.listdir(str(tmp_path))) == sorted(
        [live.name, other.name, target.name, link.name, os.path.basename(made)])
    assert (live / 'rank0').exists() and target.is_dir()


# --------------------------------------------------------------------------- replicas unit

def test_replica_groups_and_message():
    d = [(1, 2.0), (1, 2.0), (5, 2.5), (1, 2.0)]
    groups = replicas.group_ranks(d)
    assert groups == [[0, 1, 3], [2]]
    msg = replicas.describe_mismatch(groups, d, 12, 4)
    assert 'after iteration 12' in msg and 'ranks 0,1,3' in msg
    assert 'rank 2 differs from the majority' in msg
    assert 'no majority' in replicas.describe_mismatch([[0], [1]], d, 3, 2)
    v = np.arange(10, dtype=np.float32)
    assert replicas.digest(v) == replicas.digest(v.copy())
    w = v.copy()
    w[3] = np.nextafter(w[3], np.float32(100))     # one ulp
    assert replicas.digest(w)[0] != replicas.digest(v)[0]


def test_ranks_that_disagree_on_data_are_refused():
    from types import SimpleNamespace
    from theanompi_ext.errors import RankMismatchError
    mine = SimpleNamespace(cfg=TrainConfig(), iters_per_epoch=6, iteration=0,
                           data=SimpleNamespace(y_train=np.zeros(100), y_val=np.zeros(5),
                                                n_classes=10))
    sig = faults.run_signature(mine)

    class Comm(object):
        def allgather(self, obj):
            return [obj, dict(obj, n_train=90, iters_per_epoch=5)]
    mine.comm = Comm()
    with pytest.raises(RankMismatchError, match='rank 1 has iters_per_epoch=5, rank 0 has 6'):
        faults.check_ranks_agree(mine)
    # per-rank options (quiet, timeouts) may differ
    assert 'quiet' not in sig and 'collective_timeout_s' not in sig and 'seed' in sig


# ------------------------------------------------------------ checkpoints under kill -9

def test_kill_9_during_checkpoint_write_leaves_a_whole_checkpoint(tmp_path):
    """A writer saving 16 MB checkpoints in a loop is SIGKILLed 6 times, at random
    moments and while a temporary file is being written; each time the file is
    one complete version and loads."""
    sys.path.insert(0, MPI_DIR)
    try:
        import ckpt_writer
    finally:
        sys.path.remove(MPI_DIR)
    from theanompi_ext.train import checkpoint
    entries = 1 << 21
    path = tmp_path / checkpoint.FILENAME
    rnd = random.Random(7)
    mid_write = 0
    for round_ in range(6):
        first = 1000 * (round_ + 1)
        proc = subprocess.Popen([sys.executable, os.path.join(MPI_DIR, 'ckpt_writer.py'),
                                 str(tmp_path), str(first), str(entries)],
                                stdout=subprocess.PIPE, text=True)
        saved = []
        reader = threading.Thread(target=lambda: saved.extend(proc.stdout))
        reader.start()
        t0 = time.monotonic()
        while not saved and time.monotonic() - t0 < 60:
            time.sleep(0.01)
        assert saved, 'the writer never saved'
        if round_ % 2:
            # aimed: the moment a temporary appears (a write under way), which
            # a random moment can miss on a loaded machine
            t0 = time.monotonic()
            while (not [p for p in os.listdir(tmp_path) if '.tmp-%d' % proc.pid in p]
                   and time.monotonic() - t0 < 20):
                time.sleep(0.001)
        else:
            time.sleep(rnd.uniform(0.0, 0.6))
        proc.kill()
        proc.wait(timeout=30)
        reader.join(timeout=30)
        last = int(saved[-1].split()[1])
        tmp_left = [p for p in os.listdir(tmp_path) if '.tmp-%d' % proc.pid in p]
        mid_write += bool(tmp_left)
        tr = ckpt_writer.fake_trainer(str(tmp_path), entries)
        partial = checkpoint.load(tr, str(path))
        v = tr.iteration
        assert v in (last, last + 1), (v, last)    # the save after the last print may have landed
        assert partial == {'version': v} and tr.history == [{'version': v}]
        assert np.all(tr.params.values == v) and np.all(tr.rule.velocity == v)
        assert tr.rule.lr_prev == v and np.all(tr.net.stats[0].value == v)
        for p in tmp_left:
            os.unlink(os.path.join(tmp_path, p))
    print('\nkill -9 landed during a write in %d of 6 rounds' % mid_write)
    assert mid_write >= 1


# --------------------------------------------------------------------------- bad input, one process

@pytest.fixture(scope='module')
def good_h5(tmp_path_factory):
    from theanompi_ext.data.hdf5 import write_dataset
    rng = np.random.RandomState(1)
    path = str(tmp_path_factory.mktemp('h5') / 'good.h5')
    write_dataset(path, rng.randint(0, 256, (40, 8, 8, 1)).astype(np.uint8),
                  rng.randint(0, 10, 40), rng.randint(0, 256, (8, 8, 8, 1)).astype(np.uint8),
                  rng.randint(0, 10, 8), ['c%d' % i for i in range(10)])
    return path


def _damaged(good, tmp_path, how):
    path = str(tmp_path / ('%s.h5' % how))
    data = open(good, 'rb').read()
    if how == 'truncated':
        open(path, 'wb').write(data[:len(data) // 3])
        return path, 'not a readable HDF5 file|unreadable|cannot be read'
    if how == 'not_hdf5':
        open(path, 'wb').write(b'label,image\n1,2\n')
        return path, 'not a readable HDF5 file'
    if how == 'missing':
        return str(tmp_path / 'nowhere.h5'), 'no such file'
    if how == 'directory':
        return str(tmp_path), 'is a directory'
    open(path, 'wb').write(data)
    with h5py.File(path, 'r+') as f:
        if how == 'labels_out_of_range':
            f['train/labels'][3] = 10
            return path, r"'train/labels' has values outside \[0, 10\)"
        if how == 'float_images':
            del f['train/images']
            f['train/images'] = np.zeros((40, 8, 8, 1), np.float32)
            return path, "'train/images' must be uint8"
        if how == 'wrong_shape':
            del f['val/images']
            f['val/images'] = np.zeros((8, 7, 8, 1), np.uint8)
            return path, "'val/images' has image shape"
        if how == 'missing_labels':
            del f['train/labels']
            return path, "missing dataset 'train/labels'"
        if how == 'nan_std':
            f['std'][0] = np.nan
            return path, "'std' has non-finite values"
    raise AssertionError(how)


BAD_FILES = ['truncated', 'not_hdf5', 'missing', 'directory', 'labels_out_of_range',
             'float_images', 'wrong_shape', 'missing_labels', 'nan_std']


@pytest.mark.parametrize('how', BAD_FILES)
def test_bad_data_file_is_bad_input(good_h5, tmp_path, how):
    from theanompi_ext.data.hdf5 import DataError
    from theanompi_ext.train.worker import run
    path, msg = _damaged(good_h5, tmp_path, how)
    cfg = TrainConfig(model='mlp', data=path, batch_per_worker=4, epochs=1, warmup='none',
                      quiet=True)
    with pytest.raises(DataError, match=msg) as info:
        run(cfg)
    assert str(info.value).startswith(path)
    assert errors.exit_status(info.value) == errors.EXIT_BAD_INPUT


def test_corrupt_data_file_exits_2_from_two_ranks(good_h5, tmp_path):
    path, _ = _damaged(good_h5, tmp_path, 'truncated')
    rc, out, err, _ = job([sys.executable, '-m', 'theanompi_ext', 'train', '--workers', '2',
                           '--data', path, '--model', 'mlp', '--quiet'])
    assert rc == 2, (rc, err[-3000:])
    assert re.search(r'rank [01] of 2 failed: DataError: %s' % re.escape(path), err), err


def _cli(*argv):
    from theanompi_ext.cli.commands import main
    err = io.StringIO()
    old, sys.stderr = sys.stderr, err
    try:
        status = main(['train'] + list(argv))
    finally:
        sys.stderr = old
    return status, err.getvalue()


@pytest.mark.parametrize('text,msg', [
    ('epochs = 3\nbatch_per_worker\n', 'line 2: expected KEY=VALUE'),
    (' = 3\n', 'line 1: empty key'),
    ('epochs = three\n', 'EPOCHS'),
    ('nesterov = maybe\n', 'NESTEROV.*boolean'),
    ('decay_epochs = 1e400\n', 'DECAY_EPOCHS'),
    ('weight_decay = nan\n', 'weight_decay'),
    ('bucket_cap_mb = inf\n', 'bucket_cap_mb'),
    ('collective_timeout_s = -1\n', 'collective_timeout_s'),
    ('check_replicas_every = -2\n', 'check_replicas_every'),
    ('\x00\xff\xfe\n', 'not text|expected KEY=VALUE'),
])
def test_malformed_config_files_exit_2(tmp_path, text, msg):
    p = tmp_path / 'session.cfg'
    p.write_bytes(text.encode('latin-1'))
    status, err = _cli('--config', str(p))
    assert status == 2 and re.search(msg, err), err


@pytest.mark.parametrize('argv,msg', [
    (['--config', '/nonexistent/session.cfg'], 'cannot read config file'),
    (['--stall-warn-s', 'nan'], 'stall_warn_s'),
    (['--collective-timeout-s', '-5'], 'collective_timeout_s'),
    (['--momentum', 'inf'], 'momentum'),
    (['--workers', '0'], 'workers'),
])
def test_malformed_options_exit_2(argv, msg):
    status, err = _cli(*argv)
    assert status == 2 and re.search(msg, err), err


# --------------------------------------------------------------------------- fuzzing

_KEYS = sorted(options.config_keys())
_VALUES = st.sampled_from(['nan', 'inf', '-inf', '-1', '0', '1', '1e400', '1e-400', '3,4',
                           '(1, 2)', '[]', 'true', 'no', '', '  ', '"x"', "'", '=', '#', '0x10',
                           '1_000', '١٢', 'mlp', 'kn', 'ar-overlap', 'gradual']) | st.text(
                               max_size=12)


def _line(key, value):
    return '%s = %s' % (key, value)


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(st.tuples(st.sampled_from(_KEYS + ['bogus', 'EPOCHS', '']), _VALUES)
                      .map(lambda kv: _line(*kv)) | st.text(max_size=40), max_size=6))
def test_fuzz_config_file_only_value_errors(lines):
    """Any key=value file: a validated config with finite numbers, or a ValueError."""
    fd, path = tempfile.mkstemp(suffix='.cfg')
    try:
        with os.fdopen(fd, 'w', encoding='utf-8', errors='surrogatepass') as f:
            f.write('\n'.join(lines))
        args = argparse.Namespace(**{k: None for k in _KEYS})
        try:
            cfg = options.config_from(args, options.read_kv_file(path, options.config_keys()))
        except ValueError:
            return
    finally:
        os.unlink(path)
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if isinstance(v, float):
            assert math.isfinite(v), (f.name, v)
    cfg.validate()


_GOOD_BYTES = {}


def _good_bytes():
    if not _GOOD_BYTES:
        from theanompi_ext.data.hdf5 import write_dataset
        rng = np.random.RandomState(2)
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, 'g.h5')
            write_dataset(p, rng.randint(0, 256, (6, 4, 4, 3)).astype(np.uint8),
                          rng.randint(0, 3, 6), rng.randint(0, 256, (2, 4, 4, 3)).astype(np.uint8),
                          rng.randint(0, 3, 2), ['a', 'b', 'c'])
            _GOOD_BYTES['v'] = open(p, 'rb').read()
    return _GOOD_BYTES['v']


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flips=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)),
                      min_size=1, max_size=8))
def test_fuzz_damaged_hdf5_training_reads_only_data_errors(flips):
    """Bytes of a valid file overwritten anywhere: opening it as a training source
    and reading every batch raises DataError or works, nothing else."""
    from theanompi_ext.data.hdf5 import DataError
    from theanompi_ext.data.source import HDF5Source
    data = bytearray(_good_bytes())
    for where, byte in flips:
        data[int(where * len(data))] = byte
    fd, path = tempfile.mkstemp(suffix='.h5')
    try:
        with os.fdopen(fd, 'wb') as f:
            f.write(bytes(data))
        try:
            src = HDF5Source(path, crop=4, scale_min=0.5)
            for i in range(len(src.y_train)):
                x, y = src.train_batch(np.array([i]))
                assert x.shape == (1, 3, 4, 4) and np.all((y >= 0) & (y < 3))
            for i in range(len(src.y_val)):
                src.val_batch(np.array([i]))
            src.ds.close()
        except DataError:
            pass
    finally:
        os.unlink(path)


# --------------------------------------------------------------------------- no pickle

_UNSAFE_LOADERS = [r'\bimport\s+(c?pickle|dill|shelve|marshal|joblib)\b',
                   r'\bfrom\s+(c?pickle|dill|shelve|marshal|joblib)\b',
                   r'allow_pickle\s*=\s*True', r'torch\.load\s*\(', r'pickle\.loads?\s*\(',
                   r'read_pickle\s*\(', r'yaml\.load\s*\(', r'yaml\.unsafe_load',
                   r'np\.load\s*\([^)]*allow_pickle']


def test_nothing_is_loaded_with_pickle():
    """No module of the package unpickles files (checkpoints and data are HDF5;
    np.load keeps numpy's default allow_pickle=False)."""
    pkg = os.path.join(ROOT, 'theanompi_ext')
    hits, scanned = [], 0
    for folder, _, files in os.walk(pkg):
        for name in files:
            if not name.endswith('.py'):
                continue
            scanned += 1
            with open(os.path.join(folder, name), encoding='utf-8') as f:
                for no, line in enumerate(f, 1):
                    code = line.split('#', 1)[0]
                    if any(re.search(p, code) for p in _UNSAFE_LOADERS):
                        hits.append('%s:%d: %s' % (os.path.relpath(f.name, ROOT), no,
                                                   line.strip()))
    assert scanned > 30
    assert not hits, '\n'.join(hits)
