"""A job suspended and resumed as a batch scheduler does it: every process
stopped (SIGSTOP), then continued, one host's later than the rest
(tests/launch/test_suspend.py, test_faults_across_hosts.py)."""
import os
import re
import signal
import time

from support.hosts import cmdline
from theanompi_ext.train import attempt

SUSPEND_S = 8.0          # longer than the collective timeout of the tests (5 s)
# Rank 1 is continued this much after the rest of the job (a scheduler resumes one
# host after another); longer than the watchdog's inquiry (reply_s, 2 s): before the
# running clock, rank 0 then found 8 s of wait at its resume, asked rank 1, had no
# answer, and aborted. Its wait now: this, under the timeout.
SKEW_S = 2.5
# Rank 1 sleeps attempt.PAUSE_S after iteration 5: rank 0 waits for it in a collective
# when the test stops the job (on rank 1's "FAULT pause" line).
PAUSE = {attempt.FAULTS_VAR: '0:1:5:pause'}
# A rank's command line after the interpreter (launch/worker_job.py)
RANK_ARGS = [b'-u', b'-m', b'theanompi_ext.train.worker']


def rank_of(pid):
    """The MPI rank of process ``pid`` from its environment (MPICH's PMI_RANK, Open
    MPI's OMPI_COMM_WORLD_RANK); None for a process that is not a rank."""
    if cmdline(pid).split(b'\0')[1:4] != RANK_ARGS:
        return None
    try:
        with open('/proc/%d/environ' % pid, 'rb') as f:
            env = dict(v.split(b'=', 1) for v in f.read().split(b'\0') if b'=' in v)
    except OSError:
        return None
    value = env.get(b'PMI_RANK', env.get(b'OMPI_COMM_WORLD_RANK'))
    return None if value is None else int(value)


def suspend_and_resume(pids, late, suspend_s=SUSPEND_S, skew_s=SKEW_S):
    """SIGSTOP every process of ``pids``; ``suspend_s`` later SIGCONT them, those of
    ``late`` ``skew_s`` after the others (in reverse order: the ranks before their
    launchers)."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    time.sleep(suspend_s)
    for pid in reversed(pids):
        if pid not in late:
            os.kill(pid, signal.SIGCONT)
    time.sleep(skew_s)
    for pid in late:
        os.kill(pid, signal.SIGCONT)


def assert_suspend_not_counted(text):
    """Neither a timeout nor a wait that counts the suspend: ``text`` has no
    'no progress' line, and a stall line, if any, reports waits under SUSPEND_S.

    A stall line itself may be right: rank 0's own running time in its wait is
    the time from rank 1's pause to the test's SIGSTOP (its line must come
    through the launcher first: a loaded machine delays it) plus SKEW_S, and
    may pass the tests' stall_warn_s (4 s). Counting the suspend would give at
    least SUSPEND_S (and a timeout)."""
    assert 'no progress' not in text, text[-3000:]
    for line in text.splitlines():
        if 'stall:' in line:
            waits = [float(s) for s in re.findall(r'(?:has waited|for) ([0-9.]+) s', line)]
            assert waits and max(waits) < SUSPEND_S, text[-3000:]
