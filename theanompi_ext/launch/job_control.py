"""Ctrl-Z pauses the whole job; ``fg`` or ``bg`` resumes it.

The terminal's Ctrl-Z sends SIGTSTP to its foreground process group: the
launcher, not mpiexec, which runs in a session of its own
(``launch/mpiexec.popen_job``). Left to the default, the launcher alone
stopped and the ranks trained on, a job that looked paused and was not.
mpiexec itself differs (measured): Open MPI 5's mpiexec answers SIGTSTP by
stopping every rank on every host (SIGSTOP) and stays up, and passes a
SIGCONT on to them; MPICH's hydra ignores SIGTSTP.

So on SIGTSTP the launcher pauses the job, then stops itself as the terminal
asked; on SIGCONT (``fg``, ``bg``, a scheduler's resume) it resumes the job:

* Open MPI: SIGTSTP, then SIGCONT, to mpiexec: every host;
* MPICH, every rank on this host (known from the ranks' notes,
  ``launch/rank_notes.py``): SIGSTOP, then SIGCONT, to each rank;
* MPICH with ranks on other hosts, or before every rank has started: hydra
  cannot reach them, and stopping only some ranks would end the job at the
  collective timeout. The launcher says so and does not stop; the job goes on.

A job paused longer than its collective timeout goes on when resumed: each
rank leaves its own stop out of its waits (``running_clock.py``).

A Theano-MPI session's ``BSP.wait`` waits for a launcher of its own (the
job's process, in a session of its own): :class:`PassOn` hands the SIGTSTP
to it, and stops too once it has.
"""
import os
import signal
import socket
import threading
import time

from .rank_notes import read_rank_notes

#: How long :class:`PassOn` waits for its child launcher to stop, seconds.
CHILD_STOP_S = 2.0


class _OnSigtstp(object):
    """Calls the subclass's ``_tstp(signum, frame)`` on SIGTSTP from :meth:`install`
    to :meth:`restore`."""

    _old = None

    def install(self):
        """Catch SIGTSTP, unless it is ignored (a shell without job control) or this
        is not the main thread; returns self."""
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGTSTP) != signal.SIG_IGN:
            self._old = signal.signal(signal.SIGTSTP, self._tstp)
        return self

    def restore(self):
        """Put back the SIGTSTP handler :meth:`install` replaced."""
        if self._old is not None:
            signal.signal(signal.SIGTSTP, self._old)
            self._old = None


def _stop_self_then(resume):
    """Stop this process as Ctrl-Z asked; on SIGCONT call ``resume()``. SIGSTOP, not
    SIGTSTP's default: the kernel drops that in a process group without a shell
    (orphaned: a launcher started by setsid, a batch script's child)."""
    try:
        os.kill(os.getpid(), signal.SIGSTOP)
    finally:
        resume()


class JobControl(_OnSigtstp):
    """Pause and resume the job of mpiexec ``proc`` on the launcher's SIGTSTP and
    SIGCONT, from :meth:`install` to :meth:`restore` (main thread).

    ``notes_folder`` and ``size``: the ranks' notes and how many there are
    (MPICH: the ranks are stopped one by one); ``err``: where the launcher's
    line about a pause goes.
    """

    def __init__(self, proc, openmpi, notes_folder, size, err):
        self.proc, self.openmpi = proc, openmpi
        self.notes_folder, self.size, self.err = notes_folder, size, err

    def _tstp(self, signum, frame):
        resume = self.pause()
        if resume is not None:
            def again():
                resume()
                self._say('theanompi-ext: resumed: every rank of the job goes on')
            _stop_self_then(again)

    def pause(self):
        """Stop every rank of the job; returns a callable that continues them, or
        None when they cannot all be reached (the line that says why is written)."""
        if self.proc.poll() is not None:
            return None
        if self.openmpi:
            targets = [self.proc.pid]
            stop, cont = signal.SIGTSTP, signal.SIGCONT
        else:
            notes = read_rank_notes(self.notes_folder)
            here = socket.gethostname()
            away = sorted(r for r, (_, host, _) in notes.items() if host != here)
            if away or not self.size or len(notes) < self.size:
                self._say('theanompi-ext: Ctrl-Z (SIGTSTP) not followed: %s; the job goes '
                          'on (Ctrl-C stops it)'
                          % ('MPICH cannot pause the ranks on other hosts (rank %d on %s)'
                             % (away[0], notes[away[0]][1]) if away else
                             'not every rank has started yet'))
                return None
            targets = [pid for pid, _, _ in notes.values()]
            stop, cont = signal.SIGSTOP, signal.SIGCONT
        for pid in targets:
            _signal(pid, stop)
        self._say('theanompi-ext: paused (SIGTSTP): every rank of the job is stopped; '
                  '`fg` or `bg` resumes it')

        def resume():
            for pid in targets:
                _signal(pid, cont)
        return resume

    def _say(self, text):
        try:
            self.err.write(text + '\n')
            self.err.flush()
        except (OSError, ValueError):
            pass        # our own output gone: the pause is still made


def _signal(pid, sig):
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


class PassOn(_OnSigtstp):
    """Ctrl-Z for a process that waits for a launcher of its own, ``proc`` (a child in
    a session of its own, which the terminal's SIGTSTP does not reach): the SIGTSTP
    is passed on to it; once it has stopped (its :class:`JobControl` paused the
    ranks), this process stops too, and SIGCONT continues both. A child that has not
    stopped within :data:`CHILD_STOP_S` could not pause the job (its line says why):
    this process goes on as well."""

    def __init__(self, proc):
        self.proc = proc

    def _tstp(self, signum, frame):
        if self.proc.poll() is not None:
            return
        _signal(self.proc.pid, signal.SIGTSTP)
        deadline = time.monotonic() + CHILD_STOP_S
        while process_state(self.proc.pid) != 'T':
            if time.monotonic() > deadline or self.proc.poll() is not None:
                return
            time.sleep(0.01)
        _stop_self_then(lambda: _signal(self.proc.pid, signal.SIGCONT))


def process_state(pid):
    """The state letter of process ``pid`` (/proc: 'T' stopped), '' once gone."""
    try:
        with open('/proc/%d/stat' % pid) as f:
            return f.read().rsplit(')', 1)[1].split()[0]
    except (OSError, IndexError):
        return ''
