"""The end of a rank whose ``MPI_Abort`` or ``MPI_Finalize`` cannot reach the launcher.

``MPI_Abort`` asks the launcher (through this host's hydra proxy or Open MPI
daemon) to end every rank, and waits for it. When the link to the launcher's
host is cut, that word never arrives: measured on emulated hosts, a rank on
the cut-off host and its proxy then stayed alive until the link came back.
:func:`abort` therefore arms a timer first; if the process is still alive
:data:`ABORT_ALONE_S` seconds later, it ends its MPI daemon parent (the
proxy, which would otherwise wait for the launcher forever) and itself, with
the status it was aborting with.

Open MPI's ``MPI_Abort`` does not wait: it tells this host's ``prted`` and
ends the rank at once, and that daemon then waits for the launcher forever
(measured, Open MPI 5.0.11 on emulated hosts, the link cut: the far host's
``prted`` stayed until the link came back). So the daemon is also watched
from a process of its own (:func:`watch_daemon`), which outlives the rank.

A rank that has *finished* meets the same cut at its end: Open MPI's
``MPI_Finalize`` waits for the launcher (measured, Open MPI 5.0.11, the
launcher's address taken away after training began: both ranks wrote their
outputs and their notes, then stayed in ``MPI_Finalize`` with their
``prted`` daemons for as long as we watched, holding the launcher's output
pipes; hydra's ranks and proxies ended by themselves).
:func:`watch_finalize`, started once a rank's work is done, ends the rank and
its daemon if they are still alive some seconds later
(``launch/after_ranks.finalize_alone_s``); by then the launcher has stopped
mpiexec (``launch/after_ranks.py``), so nothing is left waiting on either side.
"""
import os
import signal
import subprocess
import sys
import threading

from .. import stop_signals

#: Seconds MPI_Abort gets before the rank ends itself and its daemon.
ABORT_ALONE_S = 5.0
#: The parents that are an MPI launcher's daemon on a rank's host.
MPI_DAEMONS = ('hydra_pmi_proxy', 'prted', 'orted')


def _parent_name(ppid):
    try:
        with open('/proc/%d/comm' % ppid) as f:
            return f.read().strip()
    except OSError:
        return ''


def end_alone(code):
    """End this rank's MPI daemon parent (if that is what the parent is) and this
    process with ``code``, at once."""
    ppid = os.getppid()
    if _parent_name(ppid) in MPI_DAEMONS:
        try:
            os.kill(ppid, signal.SIGKILL)
        except OSError:
            pass
    os._exit(code)


#: ``alive(pid)`` for the small watcher scripts (``python -S -c``, no package
#: import): a zombie or a dead process is not alive. Here and in launch/rank_keeper.py.
ALIVE_FN = r'''
def alive(pid):
    try:
        with open('/proc/%d/stat' % pid) as f:
            return f.read().rsplit(')', 1)[1].split()[0] not in ('Z', 'X')
    except (OSError, IndexError):
        return False
'''

#: The watcher of :func:`watch_daemon` and :func:`watch_finalize` (``python -S -c``):
#: argv SECONDS PID...; SIGKILLs, in order, those still alive after SECONDS.
_WATCH = r'''
import os, signal, sys, time
end, pids = time.monotonic() + float(sys.argv[1]), [int(p) for p in sys.argv[2:]]
''' + ALIVE_FN + r'''
while any(alive(p) for p in pids) and time.monotonic() < end:
    time.sleep(0.1)
for pid in pids:
    if alive(pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
'''


def _watch(alone_s, pids):
    """Start the watcher of ``pids`` (a session of its own, no file of ours open);
    returns it, or None when it cannot start."""
    try:
        with stop_signals.for_children():
            return subprocess.Popen([sys.executable, '-S', '-E', '-c', _WATCH, str(alone_s)] +
                                    [str(p) for p in pids], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                    close_fds=True, start_new_session=True)
    except OSError:
        return None


def daemon_parent():
    """The PID of this rank's parent when it is an MPI launcher's daemon on this
    host (:data:`MPI_DAEMONS`), else None."""
    ppid = os.getppid()
    return ppid if _parent_name(ppid) in MPI_DAEMONS else None


def watch_daemon(alone_s=ABORT_ALONE_S):
    """If this rank's parent is an MPI daemon, start a process (a session of its
    own, no file of ours open) that SIGKILLs it if it is still alive ``alone_s``
    seconds from now and otherwise ends as soon as it has gone; returns that
    process, or None."""
    ppid = daemon_parent()
    if ppid is None:
        return None
    return _watch(alone_s, [ppid])   # None: the timer of abort() still covers a wait


def watch_finalize(alone_s):
    """Once this rank's work is done (its outputs written, its note left): if its
    parent is an MPI daemon, start a process that SIGKILLs this rank and then the
    daemon if either is still alive ``alone_s`` seconds from now, and otherwise
    ends when both have gone; returns that process, or None."""
    ppid = daemon_parent()
    if ppid is None:
        return None
    return _watch(alone_s, [os.getpid(), ppid])


_REASON = []         # this rank's own line on why it aborts, once said


def say_reason(line):
    """Remember ``line``: this rank's own line on why it is about to abort the job (a
    timeout, an error), for the :func:`before_abort` callables (:func:`reason`). The
    line may never reach the launcher (an MPI daemon or the launcher held up, or
    killed by the abort itself); train/faults.py leaves it beside the rank's note."""
    _REASON[:] = [line]


def reason():
    """The line given to :func:`say_reason`, or None."""
    return _REASON[0] if _REASON else None


#: Callables ``fn(code)`` run just before this rank aborts (:func:`before_abort`).
_BEFORE_ABORT = []


def before_abort(fn):
    """Have ``fn(code)`` called in this rank just before it aborts the job, whoever
    aborts it (a rank's error, the watchdog): e.g. the note the launcher reads to
    name the rank (train/faults.py). An exception in ``fn`` never stops the abort."""
    if fn not in _BEFORE_ABORT:
        _BEFORE_ABORT.append(fn)


def run_before_abort(code):
    """Call the :func:`before_abort` callables with ``code`` (their errors ignored)."""
    for fn in list(_BEFORE_ABORT):
        try:
            fn(code)
        except Exception:       # noqa: B902 - the abort must happen
            pass


def abort(mpi_abort, code, alone_s=ABORT_ALONE_S):
    """``mpi_abort(code)``, and :func:`end_alone` if it has not ended this process
    within ``alone_s`` seconds; this rank's MPI daemon ends within ``alone_s``
    seconds in any case (:func:`watch_daemon`). The :func:`before_abort` callables
    run first."""
    run_before_abort(code)
    watch_daemon(alone_s)
    timer = threading.Timer(alone_s, end_alone, (code,))
    timer.daemon = True
    stop_signals.start_thread(timer)
    mpi_abort(code)
