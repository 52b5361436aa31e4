"""The launcher's life after a stop signal, bounded: :func:`arm`.

A stop signal (Ctrl-C, SIGTERM, SIGHUP) starts the launcher's stop of the
job (``launch/postmortem.run_explained``), which takes a few seconds. Whatever
holds it up past :data:`STOP_BOUND_S` (a stop that hangs, a thread stuck), a
timer ends the process with 128 + the signal's number; mpiexec dies with it
(its parent death signal, ``launch/mpiexec.popen_job``) and hydra or Open MPI
end the ranks, as when the launcher is SIGKILLed.

One thing holds a stop up that the launcher cannot help: its own output
not being read (a terminal paused by Ctrl-S, a pager left open on ``| less``,
``| tee`` onto a stalled network filesystem, an ssh session frozen). The
job's lines wait in memory (``launch/held_output.py``) but the launcher's
last line is written directly, and blocks. The timer's own report blocked the
same way, so the bound was none: measured, the launcher still there 22 s past
a 5 s bound, its ranks gone in under a second, until its reader read again.
Now the report is written from a thread of its own that gets
:data:`SAY_S` seconds, the process ends whether or not it was taken, and
when the launcher's standard output or error cannot take a line the report
says that, not a stack of each thread.
"""
import faulthandler
import os
import signal
import threading

from ..errors import EXIT_SIGNAL_BASE
from ..output_faults import cannot_take_a_line
from .env_seconds import seconds_from_env

#: Seconds from a stop signal to the launcher's end, whatever happens in between:
#: the stop takes STOP_GRACE_S + 1 + STOP_JOIN_S; past this bound the launcher
#: ends itself (:func:`arm`). Overridden by $THEANOMPI_EXT_STOP_BOUND_S.
STOP_BOUND_S = 30.0
STOP_BOUND_VAR = 'THEANOMPI_EXT_STOP_BOUND_S'
#: Seconds the bound's report gets to be written before the process ends.
SAY_S = 2.0
#: Seconds a standard stream gets to take a line before it counts as not read.
UNREAD_S = 0.5

_timers = []         # the armed timer of the stop under way, if any
_jobs = []           # the job (mpiexec's Popen) that the stop under way ends


def unread_streams(wait_s=UNREAD_S, fds=((1, 'standard output'), (2, 'standard error'))):
    """The names of the launcher's standard streams that cannot take a line within
    ``wait_s`` seconds (``output_faults.cannot_take_a_line``)."""
    return [name for fd, name in fds if cannot_take_a_line(fd, wait_s)]


def job_ended():
    """True when the job of the stop under way has ended (or there is none)."""
    return all(job.poll() is not None for job in _jobs)


def bound_s():
    """The bound in seconds (:data:`STOP_BOUND_VAR`, else :data:`STOP_BOUND_S`);
    :class:`~theanompi_ext.errors.BadInput` naming the variable when it is not a
    number > 0 (``launch/postmortem.run_explained`` asks before the launch)."""
    return seconds_from_env(STOP_BOUND_VAR, STOP_BOUND_S)


def unread_message(signum, bound, unread, ended):
    """The last line of a launcher that ends at its bound because ``unread`` (its
    standard streams' names) are not read; ``ended``: the job had ended."""
    name, status = signal.Signals(signum).name, EXIT_SIGNAL_BASE + signum
    why = ('the launcher\'s %s %s not read (a terminal paused by Ctrl-S, a pager left '
           'open, a reader that stopped)' % (' and '.join(unread),
                                            'are' if len(unread) > 1 else 'is'))
    if ended:
        return ('theanompi-ext: stopped by %s: every rank of the job ended, but %s: the '
                'launcher ends now, %g s after the signal, without the lines still waiting '
                'for its reader (exit status %d)' % (name, why, bound, status))
    return ('theanompi-ext: stopped by %s, but %s and the stop did not end within %g s: it '
            'ends now, and mpiexec and every rank with it (exit status %d)'
            % (name, why, bound, status))


def hung_message(signum, bound):
    """The last line of a launcher whose stop did not end within ``bound`` seconds."""
    return ('theanompi-ext: stopped by %s, but the launcher\'s stop did not end within %g s: '
            'it ends now, and mpiexec and every rank with it (exit status %d)'
            % (signal.Signals(signum).name, bound, EXIT_SIGNAL_BASE + signum))


def _within(seconds, report):
    """Run ``report()`` in a thread of its own for at most ``seconds``: a write to
    an output nobody reads blocks for as long as that lasts."""
    thread = threading.Thread(target=report, name='stop-bound-report', daemon=True)
    thread.start()
    thread.join(seconds)


def _write(text):
    data = text.encode('utf-8', 'backslashreplace')
    while data:
        data = data[os.write(2, data):]


def _end(signum, bound):
    unread = unread_streams()

    def report():
        # os.write and faulthandler write to the descriptor: the streams' locks
        # may be what is held
        if unread:
            _write('\n' + unread_message(signum, bound, unread, job_ended()) + '\n')
            return
        _write('\ntheanompi-ext: where the launcher\'s threads were:\n')
        faulthandler.dump_traceback(2, all_threads=True)
        _write(hung_message(signum, bound) + '\n')
    _within(SAY_S, report)
    os._exit(EXIT_SIGNAL_BASE + signum)


def arm(signum):
    """A stop signal arrived: end this process with 128 + ``signum`` if it is still
    here :func:`bound_s` seconds later, whatever holds the stop up once the
    handler ran (that it runs: :mod:`.awake`); its report takes at most
    :data:`SAY_S` more. A second call while armed does nothing."""
    if _timers:
        return
    try:
        bound = bound_s()
    except ValueError:          # refused before the launch; never raised in a handler
        bound = STOP_BOUND_S
    timer = threading.Timer(bound, _end, (signum, bound))
    timer.daemon = True
    timer.start()
    _timers.append(timer)


def disarm():
    """The stop under way has ended: no bound."""
    while _timers:
        _timers.pop().cancel()


def watch_job(job):
    """``job`` (mpiexec's Popen) is the one a stop would end: the bound's report
    says whether it had ended. :func:`forget_job` when it is over."""
    _jobs.append(job)


def forget_job(job):
    """The launcher is done with ``job`` (:func:`watch_job`)."""
    if job in _jobs:
        _jobs.remove(job)
