"""Waits that a stop signal interrupts, whichever thread the kernel gave it to.

A signal sent to a process (``kill PID``, Ctrl-C, a batch scheduler's SIGTERM)
goes to any one of its threads that does not block it. CPython runs the
Python handler in the main thread only, when that thread next runs bytecode;
the signal interrupts a blocking system call only in the thread that took
it. So a main thread blocked in ``read()`` or ``waitpid()`` while a helper
thread took the signal never runs the handler: measured, the launcher of a
``--quiet`` run (nothing to read for minutes) with SIGINT given to its
stderr thread (``tgkill``) was still running, its ranks training, 15 s later
and for ever (a CI run met it once with a plain ``kill``).

The launcher's main thread therefore only waits in slices of :data:`WAKE_S`:
between two slices the handler runs, so a stop starts within that time.
"""
import subprocess
import time

#: The longest a launcher's main thread waits before it looks for a signal.
WAKE_S = 0.25


def _slices(timeout):
    """Seconds for each slice of a wait of ``timeout`` s (None: for ever)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        if deadline is None:
            yield WAKE_S
            continue
        left = deadline - time.monotonic()
        if left <= 0:
            return
        yield min(WAKE_S, left)


def wait_awake(proc, timeout=None):
    """``proc.wait(timeout)`` (a :class:`subprocess.Popen`) in slices of
    :data:`WAKE_S`; its exit status, or :class:`subprocess.TimeoutExpired`
    after ``timeout`` s."""
    for part in _slices(timeout):
        try:
            return proc.wait(timeout=part)
        except subprocess.TimeoutExpired:
            pass
    status = proc.poll()
    if status is None:
        raise subprocess.TimeoutExpired(proc.args, timeout)
    return status


def join_awake(thread, timeout=None):
    """``thread.join(timeout)`` in slices of :data:`WAKE_S`; True if it ended."""
    for part in _slices(timeout):
        if not thread.is_alive():
            break
        thread.join(part)
    return not thread.is_alive()
