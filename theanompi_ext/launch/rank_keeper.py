"""A rank's death that mpiexec cannot hear of: noted by a keeper on the rank's host.

mpiexec learns that a rank died from that rank's host (hydra's proxy, Open
MPI's daemon), over its connection to the launcher. When that link is cut
and a rank dies (SIGKILL, the OOM killer, Open MPI's own error handler once
a peer's socket has closed), nobody passes the death on: the rank wrote no
note of its own (``failed N`` is written by the rank, just before an abort
of its own), the launcher's :class:`~.after_ranks.AfterRanks` saw nothing to
act on, and its daemon waited for the launcher for ever (measured, Open MPI
5.0.11 on emulated hosts, the launcher's address taken away, then one rank
SIGKILLed: the other rank was ended by Open MPI's error handler, both notes
still said ``running``, mpiexec and both ``prted`` waited as long as we
watched).

So each rank on a host other than the launcher's starts a keeper: a small
process (``python -S``, a session of its own, no file of ours open) that
waits for the rank's end without polling (``os.pidfd_open``), and then:

* if the rank's note still says ``running``, rewrites it ``died`` (whole,
  by a rename), which the launcher's notes watch acts on
  (``launch/after_ranks.py``);
* and if the rank's MPI daemon is still alive ``alone_s`` seconds later
  (``after_ranks.finalize_alone_s``: the launcher's wait and a margin), it
  SIGKILLs it; where the launcher can reach the host, mpiexec has ended the
  job long before.

A rank that noted its own end (``done``, ``failed``, ``stopped``) is left
as it is, its daemon to ``collective/abort_alone.py``. A rank on the
launcher's host needs no keeper: mpiexec sees its death directly.
"""
import os
import socket
import subprocess
import sys

from ..collective.abort_alone import ALIVE_FN, daemon_parent
from .rank_notes import DIED

#: The launcher's host name, given to the ranks (``launch/postmortem.run_explained``).
LAUNCHER_HOST_VAR = 'THEANOMPI_EXT_LAUNCHER_HOST'

#: The keeper (``python -S -E -c``): argv RANK_PID NOTE DAEMON_PID (0: none) SECONDS
#: STATE (what a rank gone without a note of its own is noted: :data:`DIED`).
_KEEP = r'''
import os, select, signal, sys, time
pid, note, daemon, alone_s = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
''' + ALIVE_FN + r'''
def gone_within(p, seconds):
    try:
        fd = os.pidfd_open(p)
    except ProcessLookupError:
        return True
    except (AttributeError, OSError):
        fd = None
    if fd is not None:
        try:
            return bool(select.select([fd], [], [], seconds)[0])
        finally:
            os.close(fd)
    end = None if seconds is None else time.monotonic() + seconds
    while alive(p):
        if end is not None and time.monotonic() >= end:
            return False
        time.sleep(0.5)
    return True

gone_within(pid, None)
try:
    with open(note) as f:
        fields = f.read().split()
except OSError:
    sys.exit(0)
if fields[:1] != [str(pid)] or fields[2:] != ['running']:
    sys.exit(0)
try:
    with open(note + '.keeper', 'w') as f:
        f.write('%s %s %s\n' % (fields[0], fields[1], sys.argv[5]))
    os.replace(note + '.keeper', note)
except OSError:
    pass
if daemon and not gone_within(daemon, alone_s):
    try:
        os.kill(daemon, signal.SIGKILL)
    except OSError:
        pass
'''


def far_from_launcher(environ=None):
    """True when the launcher named its host (:data:`LAUNCHER_HOST_VAR`) and this
    process runs on another one."""
    environ = os.environ if environ is None else environ
    host = environ.get(LAUNCHER_HOST_VAR)
    return bool(host) and host != socket.gethostname()


def start_keeper(folder, rank, alone_s, pid=None, daemon=None):
    """Start the keeper of rank ``rank`` (process ``pid``, this one by default) whose
    note is in ``folder``; ``daemon``: its MPI daemon's PID (by default this
    process's parent when it is one, else none). Returns the keeper, or None when
    it cannot start (the run goes on: a keeper only improves what a cut link
    leaves)."""
    pid = os.getpid() if pid is None else pid
    if daemon is None:
        daemon = daemon_parent() or 0
    note = os.path.join(folder, 'rank%d' % rank)
    try:
        return subprocess.Popen(
            [sys.executable, '-S', '-E', '-c', _KEEP, str(pid), note, str(daemon),
             repr(float(alone_s)), DIED], stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True,
            start_new_session=True)
    except OSError:
        return None
