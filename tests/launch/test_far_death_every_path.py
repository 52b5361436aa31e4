"""A rank that dies on the far host, on the launch paths other than ``train``
(issue 28, item 3; ``train --hostfile``: test_faults_across_hosts.py):
``check-equivalence --hostfile``, ``trials --hostfile`` and a Theano-MPI session
whose DEVICES name two hosts, each on 2 emulated hosts x 1 rank, rank 1 (on
tmxh1) SIGKILLed after its first iteration (the one-host case:
test_exit_noise_every_path.py). And that session stopped after the checkpoint
its CHECKPOINT_SIGNAL asked for. Each: the status, and the launcher's last line
naming rank 1 of 2 on tmxh1 (launch/postmortem.run_explained) with no hydra
trail after it, and no process left on any host (the hub's mpiexec, each host's
proxy or daemon and ranks) within a bound. One set of emulated hosts for the
three (its start-up is expensive); the seconds of each are printed (``pytest -s``).
Root only (network namespaces).
"""
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from support.every_path import (CHECK_EQUIVALENCE, KILL_RANK_1, last_lines, no_trail,
                                reported, session_argv, trials_argv)
from support.hosts import emulated_hosts, everything_gone
from support.jobs import catches
from support.paths import root_on_path

pytestmark = pytest.mark.root

TIMEOUT = 300
#: seconds after the launcher's exit within which every host must be clear
GONE_S = 5
#: the launcher's line for rank 1 of 2 killed on tmxh1, the way each MPI tells it:
#: hydra's report with the signal, or its far proxy's "exit code 9" (mpiexec status
#: 255); Open MPI's, or first its report of rank 0 on tmxh0 losing its connection
#: (either text, status 3)
FAR_DIED = re.compile(
    r'theanompi-ext: rank 1 of 2 \(pid \d+ on tmxh1\) died: (Killed \(signal 9\)|exit code 9 '
    r'\(or killed by signal 9: hydra\'s report of a rank on another host\)|a rank on tmxh0 '
    r'saw its connection closed \(Open MPI: "(peer process has unexpectedly disconnected|An '
    r'error occurred in Socket closed)"\)); '
    r'mpiexec stopped the other ranks \(exit status (\d+)\)$')
#: Open MPI's report of rank 0's lost connection (launch/launcher_report.py)
LOST = ('peer process has unexpectedly disconnected', 'An error occurred in Socket closed')
#: launch/exit_noise.EndingFilter.summary
HELD = re.compile(r"theanompi-ext: \d+ lines? of mpiexec's own while the job ended not shown ")


@pytest.fixture(scope='module')
def eh():
    yield from emulated_hosts(hosts=2, ranks_per_host=1)


def _run(eh, name, argv, cwd):
    """``python -m argv`` (the path ``name``) in ``cwd`` (which every host sees) on
    the emulated hosts, rank 1 killed; the CompletedProcess, once every host is clear."""
    env = eh.env(root_on_path(**KILL_RANK_1))
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, '-m'] + argv, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=str(cwd), env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail('%s hung for %d s:\n%s\n%s' % (name, TIMEOUT, out, err[-3000:]))
    ended = time.monotonic()
    gone = everything_gone(eh, ended)
    print('\n%s, rank 1 killed on tmxh1: launcher exit %.1f s after its start, every host '
          'clear %.2f s later' % (name, ended - t0, gone))
    assert gone < GONE_S
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _far_died(line, text):
    """The status the launcher's ``line`` (the last of ``text``) gives for rank 1's
    death on tmxh1."""
    m = FAR_DIED.match(line)
    assert m, text[-3000:]
    print(line)
    status = int(m.group(3))
    assert status == (3 if 'connection closed' in line else 9), line
    return status


def test_check_equivalence(eh, tmp_path):
    r = _run(eh, 'check-equivalence', CHECK_EQUIVALENCE + ['--hostfile', eh.hostfile],
             tmp_path)
    *before, line = last_lines(r.stderr, 3)
    status = _far_died(line, r.stdout + r.stderr)
    assert r.returncode == status, r.stdout + r.stderr[-3000:]
    # its heading, the line on mpiexec's lines held back (if any), the launcher's
    if HELD.match(before[-1]):
        before.pop()
    assert before[-1] == 'check-equivalence: the 2-rank run failed (exit %d)' % status, \
        r.stderr[-3000:]
    assert 'PASS' not in r.stdout
    reported(r.stdout + r.stderr, *LOST)
    no_trail(r.stdout + r.stderr)


def test_trials(eh, tmp_path):
    out = tmp_path / 'trials'
    r = _run(eh, 'trials', trials_argv(out) + ['--hostfile', eh.hostfile], tmp_path)
    assert r.returncode == 3, r.stdout + r.stderr[-3000:]
    (run,) = json.loads((out / 'trials.json').read_text())['settings'][0]['runs']
    assert run['status'] == 'failed', run
    assert run['exit_status'] == _far_died(run['reason'], r.stdout), run
    # the log: the MPI's report, then the explanation last
    log = (out / 'run0' / 'train.log').read_text()
    assert last_lines(log) == [run['reason']], log[-2000:]
    reported(log, *LOST)
    no_trail(log + r.stdout + r.stderr)


def test_theanompi_session(eh, tmp_path):
    r = _run(eh, 'Theano-MPI session', session_argv(tmp_path, '("tmxh0:cpu0" "tmxh1:cpu0")'),
             tmp_path)
    (line,) = last_lines(r.stderr)
    assert r.returncode == _far_died(line, r.stdout + r.stderr), r.stdout + r.stderr[-3000:]
    reported(r.stdout + r.stderr, *LOST)
    no_trail(r.stdout + r.stderr)


def test_theanompi_session_checkpoint_signal(eh, tmp_path):
    """Not a death: the session's ``CHECKPOINT_SIGNAL=USR1``, ``ON_CHECKPOINT_SIGNAL=stop``
    across the two hosts. SIGUSR1 to tmxlauncher as soon as it catches it: held in the
    job process until both ranks have joined, passed on through mpiexec and the far
    proxy; both ranks write the checkpoint of the same iteration and end with 75,
    nothing left on any host, and the checkpoint is whole."""
    from theanompi_ext.theanompi_compat.resume import read_position
    from theanompi_ext.train import checkpoint
    argv = session_argv(tmp_path, '("tmxh0:cpu0" "tmxh1:cpu0")')
    out = tmp_path / 'out'
    with open(argv[1].split('=', 1)[1], 'a') as fh:
        fh.write('OUT=%s\nCHECKPOINT_SIGNAL=USR1\nON_CHECKPOINT_SIGNAL=stop\n' % out)
    proc = subprocess.Popen([sys.executable, '-m'] + argv, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=str(tmp_path),
                            env=eh.env(root_on_path()), start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not catches(proc.pid, signal.SIGUSR1) and proc.poll() is None:
            assert time.monotonic() < deadline, 'tmxlauncher did not catch SIGUSR1'
            time.sleep(0.02)
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGUSR1)
        out_text, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out_text, err = proc.communicate()
        pytest.fail('the session hung for %d s:\n%s' % (TIMEOUT, err[-3000:]))
    ended = time.monotonic()
    gone = everything_gone(eh, ended)
    print('\nTheano-MPI session, SIGUSR1 to tmxlauncher: exit %.1f s after the signal, '
          'every host clear %.2f s later' % (ended - t0, gone))
    text = out_text + err
    assert proc.returncode == 75, text[-3000:]
    assert last_lines(err) == ['theanompi-ext: all 2 ranks stopped after the checkpoint, as '
                               'asked: the job can be resumed (exit status 75)'], text[-3000:]
    m = re.search(r'stopped by SIGUSR1 after the checkpoint of iteration (\d+)', text)
    assert m, text[-3000:]
    f = checkpoint.read(str(out / checkpoint.FILENAME))      # whole: its checksum matches
    try:
        assert int(f.attrs['iteration']) == int(m.group(1))
    finally:
        f.close()
    assert sum(read_position(str(out / checkpoint.FILENAME))) >= 1
    assert gone < GONE_S
