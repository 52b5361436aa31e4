"""A signal the launcher passes on to every rank of its job (``train --checkpoint-signal``).

A batch scheduler's warning reaches the launcher (``theanompi-ext train``),
not the ranks. mpiexec hands SIGUSR1 and SIGUSR2 to every rank on every host
(measured: MPICH 4's hydra and Open MPI 5's mpiexec), so the launcher only
sends it to mpiexec. Not before the job has started, though: a rank that has
not yet caught the signal (``train/checkpoint_request.install``) would die
of it, so a request that comes early, or between two attempts of a job that
restarts, waits until every rank has joined.
"""
import os
import signal
import threading

#: How often a waiting request is looked at, seconds.
POLL_S = 0.1


class ForwardedSignal(object):
    """Catch ``signum`` in the launcher from :meth:`install` to :meth:`restore`;
    while a job is :meth:`attach` ed, pass each one on to its mpiexec."""

    _NOT_INSTALLED = object()

    def __init__(self, signum):
        self.signum = signal.Signals(signum)
        self.pending = False      # received, not yet passed on
        self.forwarded = 0        # how many were passed on
        self._old = self._NOT_INSTALLED
        self._was_blocked = False
        self._thread = None
        self._done = None

    def install(self, held_before=None):
        """Catch the signal from now on (main thread), also where this process held
        it back (``train/checkpoint_request.install``): one held back meanwhile is
        caught now, and mpiexec, started after, must not inherit it blocked.
        ``held_before``: whether :meth:`restore` holds it back again (None: as it
        was held when this was called)."""
        self._old = signal.signal(self.signum, self._caught)
        was = self.signum in signal.pthread_sigmask(signal.SIG_UNBLOCK, {self.signum})
        self._was_blocked = was if held_before is None else held_before
        return self

    def restore(self):
        """Put back the handler :meth:`install` replaced (and the signal held back
        again where it was)."""
        if self._old is not self._NOT_INSTALLED:
            # (None: a handler not set from Python, e.g. by C code: the default)
            if self._was_blocked:
                signal.pthread_sigmask(signal.SIG_BLOCK, {self.signum})
            signal.signal(self.signum, signal.SIG_DFL if self._old is None else self._old)
            self._old = self._NOT_INSTALLED

    def _caught(self, signum, frame):
        # Only noted: the thread passes it on (a handler must not wait for a lock
        # that the code it interrupted may hold).
        self.pending = True

    def attach(self, proc, ready=None):
        """Pass requests on to ``proc`` (an mpiexec) once ``ready()`` (the job
        started; None: at once), until :meth:`detach`."""
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._pass_on, args=(proc, ready, self._done),
                                        name='forward %s' % self.signum.name, daemon=True)
        self._thread.start()

    def detach(self):
        """Stop passing requests on (one still pending waits for the next job)."""
        if self._thread is not None:
            self._done.set()
            self._thread.join()
            self._thread = None

    def _pass_on(self, proc, ready, done):
        while not done.wait(POLL_S):
            if self.pending and proc.poll() is None and (ready is None or ready()):
                self.pending = False
                try:
                    os.kill(proc.pid, self.signum)
                    self.forwarded += 1
                except ProcessLookupError:
                    self.pending = True    # the job ended meanwhile: for the next one


def forward_to_child(signum, start):
    """Start a child that passes ``signum`` on itself (a Theano-MPI session's job
    process: :mod:`theanompi_ext.theanompi_compat.restart_job`) and pass each
    ``signum`` this process gets on to it; returns ``(proc, forward)``, ``start()``'s
    process and the :class:`ForwardedSignal` to :meth:`~ForwardedSignal.detach` and
    :meth:`~ForwardedSignal.restore` once it ended (main thread only).

    The child starts with the signal held back, so one that comes before it
    catches the signal waits in it instead of killing it."""
    signum = signal.Signals(signum)
    was = signum in signal.pthread_sigmask(signal.SIG_BLOCK, {signum})
    try:
        proc = start()
    except BaseException:
        if not was:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
        raise
    forward = ForwardedSignal(signum).install(held_before=was)
    forward.attach(proc)
    return proc, forward
