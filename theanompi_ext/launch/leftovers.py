"""Nothing of a finished job left running: the launcher's process tree, checked.

hydra's proxies and the ranks run in sessions of their own, so a process
group does not reach them; when mpiexec ends they are re-parented. The
launcher that restarts jobs makes itself a *child subreaper*
(``prctl(PR_SET_CHILD_SUBREAPER)``): whatever its jobs leave behind
(a proxy, a rank on an emulated host, a rank that ignored SIGTERM) is
re-parented to it instead of to init, so :func:`end_leftovers` finds every
one among its descendants, SIGKILLs them and reaps them before the next
attempt starts.
"""
import ctypes
import os
import signal
import time

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper():
    """Make this process the reaper of its orphaned descendants; False where impossible."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _children_map():
    children = {}
    for entry in os.listdir('/proc'):
        if not entry.isdigit():
            continue
        try:
            with open('/proc/%s/stat' % entry) as f:
                fields = f.read().rsplit(')', 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append((int(entry), fields[0]))
    return children


def descendants(pid=None):
    """``[(pid, state)]`` of every process below ``pid`` (this one by default)."""
    children, out = _children_map(), []
    todo = [os.getpid() if pid is None else pid]
    while todo:
        for child, state in children.get(todo.pop(), []):
            out.append((child, state))
            todo.append(child)
    return out


def end_leftovers(timeout_s=10.0, keep=()):
    """SIGKILL and reap every live descendant of this process (but the PIDs in
    ``keep``); returns the PIDs that were found alive. Raises RuntimeError if
    any is still there after ``timeout_s``."""
    found = [p for p, state in descendants() if state not in ('Z', 'X') and p not in keep]
    for pid in found:
        try:
            os.kill(pid, signal.SIGCONT)    # a stopped process still dies of SIGKILL
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + timeout_s
    while True:
        _reap(keep)
        left = [p for p, state in descendants() if state not in ('Z', 'X') and p not in keep]
        if not left:
            _reap(keep)       # the ones that died of the SIGKILL meanwhile
            return found
        if time.monotonic() > deadline:
            raise RuntimeError('processes of the failed job still alive after %.0f s: %s'
                               % (timeout_s, ', '.join(map(str, left))))
        time.sleep(0.05)


def _reap(keep):
    # only the zombies among our direct children: a child another part of this
    # process waits for (in ``keep``) keeps its status for that waiter
    for pid, state in descendants():
        if state == 'Z' and pid not in keep:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
