"""A closed output: the reader of our standard output has gone (``| head``).

Other Unix tools end by SIGPIPE when they write to a pipe whose reader has
gone; Python ignores SIGPIPE, so the write raises ``BrokenPipeError`` and an
unhandled one ends in a traceback, or, caught by a catch-all, as a failure.
Every command of ours ends such a write as SIGPIPE would: status 141
(:data:`STATUS`), nothing more written to the closed output, and, for a
command that does more than print, one line on standard error saying why
(:func:`end`). The launcher, whose copies of the ranks' output meet the closed
pipe in threads, stops the job the same way (``launch/postmortem.py``).

An output that cannot be written for another reason (a full disk) is not
closed: its reader has not gone, and such errors are not handled here.
"""
import os
import select
import signal
import sys

from .errors import EXIT_SIGNAL_BASE

#: The exit status of a command whose output was closed: 128 + SIGPIPE.
STATUS = EXIT_SIGNAL_BASE + signal.SIGPIPE

#: Why, completing "stopped ...".
WHY = 'because its output was closed (a broken pipe: its reader, such as `| head`, ended)'


def _stream_closed(stream):
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):   # not a file (captured, closed)
        return False
    poller = select.poll()
    poller.register(fd, 0)    # POLLERR and POLLHUP are reported whatever is asked
    try:
        events = poller.poll(0)
    except OSError:
        return False
    # Linux flags a pipe whose readers have all gone with POLLERR, a socket or
    # a terminal that hung up with POLLHUP; a file (even a full one) with neither
    return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in events)


def is_closed(exc=None):
    """True when standard output or standard error has lost its reader.

    With ``exc``, also that ``exc`` is the ``BrokenPipeError`` of such a write,
    so that the broken pipe of something else (a child's pipe) is not taken
    for a closed output.
    """
    if exc is not None and not isinstance(exc, BrokenPipeError):
        return False
    return _stream_closed(sys.stdout) or _stream_closed(sys.stderr)


def end(message=None):
    """End a command whose output was closed; returns :data:`STATUS`.

    The closed streams are pointed at ``/dev/null``, so that what Python still
    holds in their buffers is dropped at exit instead of failing again
    ("Exception ignored ... BrokenPipeError", status 120). ``message``, when
    given, goes to standard error if that is still read.
    """
    closed = [s for s in (sys.stdout, sys.stderr) if _stream_closed(s)]
    if closed:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            for stream in closed:
                os.dup2(devnull, stream.fileno())
        finally:
            os.close(devnull)
    if message and sys.stderr not in closed:
        try:
            sys.stderr.write(message + '\n')
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
    return STATUS
