"""The end of a rank whose ``MPI_Abort`` cannot reach the launcher.

``MPI_Abort`` asks the launcher (through this host's hydra proxy or Open MPI
daemon) to end every rank, and waits for it. When the link to the launcher's
host is cut, that word never arrives: measured on emulated hosts, a rank on
the cut-off host and its proxy then stayed alive until the link came back.
:func:`abort` therefore arms a timer first; if the process is still alive
:data:`ABORT_ALONE_S` seconds later, it ends its MPI daemon parent (the
proxy, which would otherwise wait for the launcher forever) and itself, with
the status it was aborting with.
"""
import os
import signal
import threading

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


def abort(mpi_abort, code, alone_s=ABORT_ALONE_S):
    """``mpi_abort(code)``, and :func:`end_alone` if it has not ended this process
    within ``alone_s`` seconds."""
    timer = threading.Timer(alone_s, end_alone, (code,))
    timer.daemon = True
    timer.start()
    mpi_abort(code)
