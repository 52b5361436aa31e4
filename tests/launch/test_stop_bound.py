"""A stop signal bounds the launcher's life (``launch/stop_bound.py``), also when
its own output is not read (docs/faults.md, "Stopping a job").

Each test runs ``postmortem.run_explained`` in a child Python of its own
(the bound ends that process) on a job that is a plain process in mpiexec's
place, and checks that the child ended within the bound, with 128 + the
signal, and that the job went with it.
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from theanompi_ext.launch import stop_bound

from support.pipes import full_pipe


HUNG_STOP = r'''
import os, signal, sys, threading, time
from theanompi_ext.launch import postmortem
# a stop that hangs, whatever holds it up
postmortem.stop_job = lambda *a, **kw: time.sleep(600)
job = [sys.executable, '-c', 'import time; time.sleep(600)  # stop-bound-test']
threading.Timer(1.0, lambda: os.kill(os.getpid(), getattr(signal, sys.argv[1]))).start()
postmortem.run_explained(job, size=1)
print('not reached')
'''


def _left(mark):
    """The processes whose command line holds ``mark`` (a plain word: pgrep's is a
    regular expression)."""
    time.sleep(0.5)
    return subprocess.run(['pgrep', '-f', mark], capture_output=True, text=True).stdout.split()


@pytest.mark.parametrize('sig', ['SIGINT', 'SIGTERM'])
def test_a_hung_stop_is_bounded(sig, tmp_path):
    """Whatever hangs after a stop signal (here the stop itself), the launcher ends
    within THEANOMPI_EXT_STOP_BOUND_S with 128 + the signal, saying so last, and
    the job's process (mpiexec's place) goes with it (its parent death signal)."""
    env = dict(os.environ, THEANOMPI_EXT_STOP_BOUND_S='2')
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, '-c', HUNG_STOP, sig], capture_output=True, text=True,
                       timeout=60, env=env, start_new_session=True)
    took = time.monotonic() - t0
    status = 128 + getattr(signal, sig)
    assert r.returncode == status, r.stdout + r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        "theanompi-ext: stopped by %s, but the launcher's stop did not end within 2 s: it "
        "ends now, and mpiexec and every rank with it (exit status %d)" % (sig, status))
    assert "where the launcher's threads were:" in r.stderr    # a stack of each, for a report
    assert 'not reached' not in r.stdout and 2.5 < took < 20, took
    left = _left('stop-bound-test')
    assert not left, left


def _run_unread(cmd, stderr):
    """Run ``cmd`` (a launcher stopped by its own timer, its bound 2 s) with its
    standard output a full pipe nobody reads (``stderr='same'``: its standard
    error too); its status, or a string when it did not end within 30 s."""
    r, w = full_pipe()
    env = dict(os.environ, THEANOMPI_EXT_STOP_BOUND_S='2')
    try:
        proc = subprocess.Popen(cmd, stdout=w, stderr=w if stderr == 'same' else stderr,
                                env=env, start_new_session=True)
        os.close(w)
        try:
            return proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            return 'still running after 30 s'
    finally:
        os.close(r)


# The launcher as the CLI runs it (its streams guarded), a job that prints.
CHATTY = r'''
import os, signal, sys, threading
from theanompi_ext import output_faults
from theanompi_ext.launch import postmortem
output_faults.guard_output(drop=True)
job = [sys.executable, '-u', '-c', 'import time\nwhile True:\n    print("y" * 200)\n'
       '    time.sleep(0.002)  # stop-bound-test']
threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGTERM)).start()
postmortem.run_explained(job, size=1)
'''


def test_a_stop_whose_output_is_not_read_is_bounded():
    """The launcher's standard output and error one pipe that nobody reads (Ctrl-S,
    a pager left open): SIGTERM stops the job at once, and the launcher, whose
    last line cannot be written, still ends within the bound and the report's
    own :data:`~stop_bound.SAY_S`, with 143. Before, the bound's report blocked
    too, and the launcher stayed for as long as nobody read."""
    t0 = time.monotonic()
    status = _run_unread([sys.executable, '-c', CHATTY], stderr='same')
    took = time.monotonic() - t0
    assert status == 143, status
    assert 3.0 < took < 2 + stop_bound.SAY_S + 6, took
    left = _left('stop-bound-test')
    assert not left, left


BLOCKED_STOP = r'''
import os, signal, sys, threading
from theanompi_ext import output_faults
from theanompi_ext.launch import postmortem
output_faults.guard_output(drop=True)

def stop_then_print(proc, *a, **kw):
    if sys.argv[1] == 'ended':
        proc.kill()
        proc.wait()
    print('z' * 100000, flush=True)      # blocks: standard output is not read
postmortem.stop_job = stop_then_print
job = [sys.executable, '-c', 'import time; time.sleep(600)  # stop-bound-test']
threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGTERM)).start()
postmortem.run_explained(job, size=1)
'''


@pytest.mark.parametrize('ended', ['ended', 'running'])
def test_the_bound_says_the_output_is_not_read(ended):
    """A stop held up by a write to a standard output nobody reads: the bound's
    line (on standard error, which is read) says so, and whether the job had
    ended, instead of a stack of each thread."""
    with tempfile.TemporaryFile() as err:
        status = _run_unread([sys.executable, '-c', BLOCKED_STOP, ended], stderr=err)
        err.seek(0)
        text = err.read().decode()
    assert status == 143, (status, text)
    why = ("the launcher's standard output is not read (a terminal paused by Ctrl-S, a pager "
           "left open, a reader that stopped)")
    if ended == 'ended':
        last = ('theanompi-ext: stopped by SIGTERM: every rank of the job ended, but %s: the '
                'launcher ends now, 2 s after the signal, without the lines still waiting for '
                'its reader (exit status 143)' % why)
    else:
        last = ('theanompi-ext: stopped by SIGTERM, but %s and the stop did not end within 2 s:'
                ' it ends now, and mpiexec and every rank with it (exit status 143)' % why)
    assert text.strip().splitlines()[-1] == last, text
    assert 'threads were' not in text, text
    left = _left('stop-bound-test')
    assert not left, left


def test_unread_streams_are_the_full_pipes(tmp_path):
    """A pipe whose reader stopped is unread; one with room, a file, and a pipe
    whose reader has gone (a write fails at once: not a wait) are not."""
    full_r, full_w = full_pipe()
    room_r, room_w = os.pipe()
    gone_r, gone_w = os.pipe()
    os.close(gone_r)
    with open(str(tmp_path / 'f'), 'wb') as f:
        try:
            got = stop_bound.unread_streams(0.1, ((full_w, 'full'), (room_w, 'room'),
                                                  (f.fileno(), 'file'), (gone_w, 'gone')))
        finally:
            for fd in (full_r, full_w, room_r, room_w, gone_w):
                os.close(fd)
    assert got == ['full']
    # read again, it is no longer unread
    r, w = full_pipe()
    try:
        os.read(r, 8192)
        assert stop_bound.unread_streams(0.1, ((w, 'pipe'),)) == []
    finally:
        os.close(r)
        os.close(w)


@pytest.mark.parametrize('value', ['soon', '-1', '0', 'inf'])
def test_a_bad_bound_is_refused_before_the_launch(value, tmp_path, monkeypatch):
    """THEANOMPI_EXT_STOP_BOUND_S not a number of seconds > 0: bad input (2) naming it,
    said before anything runs; a stop's handler, which must not raise, would take
    the default."""
    import io
    from theanompi_ext.launch import postmortem
    monkeypatch.setenv(stop_bound.STOP_BOUND_VAR, value)
    marker = tmp_path / 'ran'
    err = io.StringIO()
    status = postmortem.run_explained([sys.executable, '-c', 'open(%r, "w")' % str(marker)],
                                      size=1, err=err)
    assert status == 2 and not marker.exists(), err.getvalue()
    assert err.getvalue() == ("theanompi-ext: THEANOMPI_EXT_STOP_BOUND_S=%r: not a number of "
                              "seconds > 0\n" % value)
    monkeypatch.setattr(stop_bound, '_timers', [])
    stop_bound.arm(signal.SIGTERM)
    try:
        assert stop_bound._timers[0].interval == stop_bound.STOP_BOUND_S
    finally:
        stop_bound.disarm()
