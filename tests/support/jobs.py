"""A command whose whole process tree is watched while it runs (fault tests:
tests/launch/test_stop_and_disk.py, test_restarts.py)."""
import ctypes
import os
import platform
import signal
import subprocess
import threading
import time

import pytest

from support.procs import descendants as _descendants

JOB_TIMEOUT = 180
# tgkill(2)'s number: Python can signal a thread of its own only
_TGKILL = {'x86_64': 234, 'aarch64': 131}


def signal_a_helper_thread(pid, sig):
    """Send ``sig`` to one thread of process ``pid`` other than its main thread
    (tgkill), as the kernel may deliver a signal sent to the process; the
    thread's id. Fails the test if the process has no other thread."""
    tids = sorted(int(t) for t in os.listdir('/proc/%d/task' % pid) if int(t) != pid)
    assert tids, 'process %d has no thread but its main one' % pid
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(_TGKILL[platform.machine()], pid, tids[0], int(sig)) != 0:
        raise OSError(ctypes.get_errno(), 'tgkill %d %d' % (pid, tids[0]))
    return tids[0]


def catches(pid, sig):
    """Whether process ``pid`` has a handler for ``sig`` (its SigCgt mask)."""
    try:
        with open('/proc/%d/status' % pid) as f:
            mask = next(line for line in f if line.startswith('SigCgt:')).split()[1]
    except (OSError, StopIteration):
        return False
    return bool(int(mask, 16) >> (int(sig) - 1) & 1)


def _stat(pid):
    # the fields of /proc/PID/stat after the command's name: state, parent, ...
    with open('/proc/%d/stat' % pid) as f:
        return f.read().rsplit(')', 1)[1].split()


def start_time(pid):
    try:
        fields = _stat(pid)
    except OSError:
        return None
    return None if fields[0] in ('Z', 'X') else fields[19]


def describe(pid):
    """``pid`` with its state, parent and command line (from /proc), for a failure."""
    try:
        fields = _stat(pid)
        with open('/proc/%d/cmdline' % pid, 'rb') as f:
            cmd = f.read().replace(b'\0', b' ').decode(errors='replace').strip()
    except OSError:
        return '%d (gone)' % pid
    return '%d (state %s, parent %s: %s)' % (pid, fields[0], fields[1], cmd[:200])


class Job(object):
    """A command whose whole process tree is recorded while it runs.

    ``leftovers()`` are the processes it started that are still alive (same
    PID and start time); on a timeout everything seen is SIGKILLed and the
    test fails, so a regression never hangs the suite.
    """

    def __init__(self, cmd, tmp_path, env=None, stdout=None):
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.out_f = open(str(tmp_path / ('job%d.out' % id(self))), 'w+')
        self.err_f = open(str(tmp_path / ('job%d.err' % id(self))), 'w+')
        # stdout: a descriptor of the caller's instead of the file out() reads
        self.proc = subprocess.Popen(cmd, stdout=self.out_f if stdout is None else stdout,
                                     stderr=self.err_f, text=True,
                                     env=full_env, start_new_session=True)
        self.seen = {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self):
        while not self._done.is_set():
            for pid in _descendants(self.proc.pid):
                if pid not in self.seen:
                    st = start_time(pid)
                    if st is not None:
                        self.seen[pid] = st
            self._done.wait(0.02)

    def alive(self):
        """Processes of the job alive now (the launcher included)."""
        return [p for p, st in self.seen.items() if start_time(p) == st] + \
            ([self.proc.pid] if self.proc.poll() is None else [])

    def wait(self, timeout=JOB_TIMEOUT):
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            alive = '; '.join(describe(p) for p in self.alive())
            self.kill_all()
            pytest.fail('job hung for %ss (alive: %s):\n%s' % (timeout, alive,
                                                                self.err()[-3000:]))
        return self.proc.returncode

    def gone_within(self, seconds):
        """Seconds until every process of the job has ended (None: not within ``seconds``)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            if not self.alive():
                return time.monotonic() - t0
            time.sleep(0.02)
        return None

    def finish(self, leftover_s=5.0):
        """Stop watching; assert no process of the job is left (killing any that is)."""
        took = self.gone_within(leftover_s)
        self._done.set()
        self._thread.join(2)
        left = self.alive()
        seen = [describe(p) for p in left]   # before the kill: what each one was doing
        self.kill_all()
        assert not left, 'processes left behind: %s\n%s' % ('; '.join(seen), self.err()[-3000:])
        return took

    def kill_all(self):
        for pid in [p for p, st in self.seen.items() if start_time(p) == st] + [self.proc.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
        self._done.set()

    def out(self):
        """What the command wrote to its standard output so far."""
        self.out_f.flush()
        self.out_f.seek(0)
        return self.out_f.read()

    def err(self):
        self.err_f.flush()
        self.err_f.seek(0)
        return self.err_f.read()


def wait_for(cond, timeout, what):
    """Poll ``cond()`` until it is true; fail naming ``what`` after ``timeout`` s."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError('timed out waiting for ' + what)
        time.sleep(0.02)


def temporaries(folder):
    """The temporary files of unfinished writes in ``folder``."""
    return [n for n in os.listdir(folder) if '.tmp-' in n or n.endswith('.tmp')]


def good_checkpoint(path):
    """The iteration of a checkpoint that verifies and whose values are all finite."""
    import io

    import h5py
    import numpy as np

    from theanompi_ext.files import sealed
    with h5py.File(io.BytesIO(sealed.read_sealed(str(path))), 'r') as f:
        for name in ('shared/values', 'shared/velocity', 'rank0/values_tail', 'rank1/velocity'):
            if name in f:
                assert np.all(np.isfinite(f[name][...])), name
        return int(f.attrs['iteration'])
