"""A job that does not start in time is stopped (the restart supervisor's start check).

Under ``--max-restarts`` a restart may meet a host or link that is still
down: hydra's proxy then waits to connect back to mpiexec (TCP's SYN
retries: about two minutes) or an ssh hangs, and nothing else would end
the attempt. The supervisor knows the job started when rank 0 has created
its progress file (``train/attempt.mark_started``, right after every rank
joined the communicator); :class:`StartWatch` stops the job when that has
not happened within ``timeout_s`` seconds, and the attempt ends as a failure
a restart may cure.
"""
import threading

from ..running_clock import RunningClock

#: What the launcher prints for such an attempt (``train/restarts.classify`` knows it).
NOT_STARTED = 'the job did not start within'


def not_started_message(timeout_s, status):
    """The launcher's line for a job stopped by :class:`StartWatch`."""
    return ('theanompi-ext: %s %g s (start_timeout_s): not every rank joined (a host '
            'unreachable, a link down, ranks of different hosts that cannot reach each '
            'other, or the start-up hung: docs/multinode.md); every rank was stopped '
            '(exit status %d)' % (NOT_STARTED, timeout_s, status))


class StartWatch(object):
    """Calls ``stop()`` once if ``started()`` is still false ``timeout_s`` seconds
    after :meth:`start` while ``proc`` runs; :attr:`fired` says whether it did.
    ``timeout_s`` 0 or ``started`` None: never."""

    POLL_S = 0.2

    def __init__(self, proc, started, timeout_s, stop):
        self.proc, self.started, self.timeout_s, self.stop = proc, started, timeout_s, stop
        self.fired = False
        self._done = threading.Event()
        self._thread = None

    def start(self):
        """Begin watching (a daemon thread); returns self."""
        if self.started is not None and self.timeout_s and self.timeout_s > 0:
            self._thread = threading.Thread(target=self._watch, name='start-watch',
                                            daemon=True)
            self._thread.start()
        return self

    def _watch(self):
        # a suspend of the whole job (the launcher stopped with it) is not start-up time
        clock = RunningClock()
        deadline = clock.now() + self.timeout_s
        while not self._done.is_set() and self.proc.poll() is None:
            if self.started():
                return
            if clock.now() >= deadline:
                self.fired = True
                self.stop()
                return
            self._done.wait(self.POLL_S)
            clock.tick(self.POLL_S)

    def finish(self):
        """Stop watching (the job ended); waits for a stop under way."""
        self._done.set()
        if self._thread is not None:
            self._thread.join()
