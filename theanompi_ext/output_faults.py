"""Our standard output gone or unwritable: what a command does then.

Two faults, two answers:

* **Closed** (``| head`` ended, a pager quit): other Unix tools end by
  SIGPIPE; Python ignores SIGPIPE, so the write raises ``BrokenPipeError``,
  which unhandled ends in a traceback. Every command of ours ends as SIGPIPE
  would: status 141 (:data:`CLOSED_STATUS`), nothing more written to the
  closed output, and, for a command that does more than print, one line on
  standard error saying why (:func:`end`).
* **Unwritable** (``> log`` on a full disk, an I/O error): for a command
  that trains (its product is on disk, and a run must not be lost to its
  log) the lines are dropped after one warning and the run goes on; any other
  command, whose product is what it prints, ends with status 3 and a clear
  error (:func:`guard_output`, :func:`failed_write`). Standard error that
  cannot be written loses its lines, silently: a warning never ends a command.

A standard stream the command was started without (``>&-``, ``2>&-``, ``<&-``)
gets ``/dev/null`` under its descriptor first (:func:`reopen_missing`), so that
no file the command opens later takes descriptor 1 or 2 (and the ranks' lines
with it); standard output missing so is unwritable ("Bad file descriptor", as
``ls >&-`` says), standard error silent, standard input empty.

:func:`run_command` runs a console command under these rules.

The launcher of several ranks, whose copies of the ranks' output meet these
faults in threads, answers the same way (``launch/postmortem.py``).
"""
import errno
import io
import os
import select
import signal
import sys

from .errors import EXIT_FAILED, EXIT_SIGNAL_BASE

#: The exit status of a command whose output was closed: 128 + SIGPIPE.
CLOSED_STATUS = EXIT_SIGNAL_BASE + signal.SIGPIPE

#: Why, completing "stopped ...".
CLOSED_WHY = ('because its output was closed (a broken pipe: its reader, such as `| head`, '
              'ended)')


#: The standard streams (their ``sys`` names) the command started without.
_missing = set()


def reopen_missing():
    """Open ``/dev/null`` on each of descriptors 0, 1, 2 that is not open, and give
    Python's ``sys`` stream (``None`` then) a file on it; call first thing.

    Without this, the first file the command opens takes the lowest free
    descriptor: a checkpoint opened as descriptor 1 receives the lines printed
    after it, and a child (mpiexec, its ranks) writes its output into it.
    Standard output reopened so refuses every write (:func:`guard_output`);
    standard error and input are simply empty.
    """
    for fd, name, flags in ((0, 'stdin', os.O_RDONLY), (1, 'stdout', os.O_WRONLY),
                            (2, 'stderr', os.O_WRONLY)):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        null = os.open(os.devnull, flags)   # the lowest free descriptor: fd itself
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        os.set_inheritable(fd, True)        # os.open's is not: children (mpiexec) need it
        _missing.add(name)
        if getattr(sys, name) is None:      # Python found it closed at start-up
            setattr(sys, name, open(fd, 'r' if fd == 0 else 'w', closefd=False))


def _missing_error(name):
    return OSError(errno.EBADF, '%s was closed when the command started' % {
        'stdout': 'standard output', 'stderr': 'standard error'}[name])


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


def cannot_take_a_line(fd, wait_s=0.0):
    """True when descriptor ``fd`` cannot take a line within ``wait_s`` seconds: a
    pipe or terminal whose reader stopped reading (Ctrl-S, a pager left open, a
    process held up). A file, however slow its disk, is always writable to
    ``poll``; a closed descriptor, or a pipe whose reader has gone (a write
    fails at once: :func:`is_closed`), is no wait and not counted."""
    poller = select.poll()
    try:
        poller.register(fd, select.POLLOUT)
        events = poller.poll(int(wait_s * 1000))
    except (OSError, ValueError):
        return False
    return not any(ev & (select.POLLOUT | select.POLLERR | select.POLLHUP | select.POLLNVAL)
                   for _, ev in events)


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
    """End a command whose output was closed; returns :data:`CLOSED_STATUS`.

    The closed streams are pointed at ``/dev/null``, so that what Python still
    holds in their buffers is dropped at exit instead of failing again
    ("Exception ignored ... BrokenPipeError", status 120). ``message``, when
    given, goes to standard error if that is still read.
    """
    closed = [s for s in (sys.stdout, sys.stderr) if _stream_closed(s)]
    for stream in closed:
        to_devnull(stream)
    if message and sys.stderr not in closed:
        _say(message)
    return CLOSED_STATUS


def to_devnull(stream):
    """Point the file under ``stream`` at /dev/null, so that what is still buffered
    and whatever is written there later goes nowhere, without an error."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(fd, stream.fileno())
        finally:
            os.close(fd)
    except (OSError, AttributeError, ValueError):    # no file under it (a test's buffer)
        pass


def dropped_warning(where, exc):
    """The one warning of lines dropped because ``where`` cannot be written."""
    return ("theanompi-ext: warning: could not write the job's output to %s (%s): its lines "
            "are dropped from here; the job goes on" % (where, exc))


def _say(line):
    try:
        sys.stderr.write(line + '\n')
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


class _GuardedOutput(io.FileIO):
    """A standard stream's descriptor, remembering a write that failed for a reason
    other than a closed pipe (:attr:`failed`); with ``drop``, absorbing it and
    every later write instead (after ``warning(exc)``, when given, is said)."""

    def __init__(self, fd, drop, warning=None, refused=None):
        super().__init__(fd, 'wb', closefd=False)
        self.drop, self.warning, self.failed = drop, warning, None
        self.refused = refused      # every write fails with it (a descriptor missing at start)
        if refused is not None and drop:
            # said now: a job's lines may never pass through here (a child copies them)
            self._fail(refused)

    def _fail(self, exc):
        self.failed = exc
        if self.drop and self.warning:
            _say(self.warning(exc))

    def write(self, data):
        if self.failed is not None and self.drop:
            return len(data)
        try:
            if self.refused is not None:
                raise self.refused
            return super().write(data)
        except BrokenPipeError:
            raise                   # closed: the command ends (141), not dropped
        except OSError as exc:
            self._fail(exc)
            if not self.drop:
                raise
            return len(data)


_guard = {}


def _guarded(old, raw):
    """A text stream like ``old`` (Python's) on ``raw``: unbuffered under -u /
    PYTHONUNBUFFERED, as Python made it; else line-buffered, not block-buffered
    as Python makes a file or a pipe: a run's lines must reach ``> log`` (and
    ``tail -f``) as they are written, not in 8 KB blocks or at its end."""
    unbuffered = isinstance(getattr(old, 'buffer', None), io.RawIOBase)
    layer = raw if unbuffered else io.BufferedWriter(raw)
    return io.TextIOWrapper(layer, encoding=old.encoding, errors=_ANY_CHARACTER,
                            line_buffering=True, write_through=unbuffered or old.write_through)


#: How a character the output's encoding lacks is written (a path's ``ü`` to an
#: ASCII output, a file name's undecodable byte): escaped, as on standard error.
_ANY_CHARACTER = 'backslashreplace'


def any_character():
    """Let standard output and error write any character (escaped where their
    encoding lacks it): a line must not end a run, as ``PYTHONIOENCODING=ascii``
    or a Latin-1 locale and an ``--out`` path with ``ü`` did. For a rank; a
    console command gets it from :func:`guard_output`."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors=_ANY_CHARACTER)
        except (AttributeError, ValueError, OSError):     # not a text file (a test's capture)
            pass


def guard_output(drop):
    """Put standard output and error on guarded, line-buffered descriptors for the
    rest of a command.

    Standard output, ``drop``: a write that fails for a reason other than a
    closed pipe (a full disk) drops it and every later line, after one
    warning, and the command goes on (training); otherwise the error is
    raised, and :func:`failed_write` tells it from other errors. Standard
    error: such a write is always dropped, silently (there is nowhere left to
    say it), so that a warning cannot end a command. A closed pipe raises
    either way (:func:`is_closed`). A stream that is not a file (a test's
    capture) is left as it is. A stream missing at start
    (:func:`reopen_missing`) fails every write with "Bad file descriptor",
    under the same rules. :func:`unguard` puts the originals back.
    """
    for name, stream_drop, warning in (
            ('stdout', drop, lambda exc: dropped_warning('standard output', exc)),
            ('stderr', True, None)):
        old = getattr(sys, name)
        try:
            fd = old.fileno()
            old.flush()
        except (AttributeError, OSError, ValueError):
            continue
        raw = _GuardedOutput(fd, stream_drop, warning,
                             _missing_error(name) if name in _missing else None)
        setattr(sys, name, _guarded(old, raw))
        _guard[name] = (old, raw)


def failed_write(exc):
    """True when ``exc`` is the error of a write to the guarded standard output."""
    return 'stdout' in _guard and exc is _guard['stdout'][1].failed


def unguard():
    """Put back the streams :func:`guard_output` replaced (their lines flushed, or
    dropped when they cannot be written)."""
    for name in ('stdout', 'stderr'):
        if name in _guard:
            flush_or_drop(getattr(sys, name))
            setattr(sys, name, _guard.pop(name)[0])


def flush_or_drop(stream=None):
    """Flush ``stream`` (standard output); what cannot be written (closed, full) is
    dropped."""
    stream = sys.stdout if stream is None else stream
    try:
        stream.flush()
    except OSError:
        to_devnull(stream)
        try:
            stream.flush()
        except OSError:
            pass


def run_command(fn, name, trains, prints_only=False):
    """Run the console command ``fn()`` (returns its status) under the two rules.

    ``name`` begins its messages (``theanompi-ext train``). ``trains``: a line
    that cannot be written is dropped and the command goes on. ``prints_only``:
    a closed output ends it silently, as it ends ``ls | head``. Returns the
    command's status, 141 when its output was closed, 3 when a command that
    does not train could not write its output.
    """
    reopen_missing()
    guard_output(drop=trains)
    try:
        status = fn()
        sys.stdout.flush()     # here, not at exit: buffered lines fail here
        return status
    except BrokenPipeError as exc:
        if not is_closed(exc):
            raise
        return end(None if prints_only else '%s: stopped %s (exit status %d)'
                   % (name, CLOSED_WHY, CLOSED_STATUS))
    except OSError as exc:
        if not failed_write(exc):
            raise
        to_devnull(sys.stdout)
        _say('%s: error: could not write its output to standard output (%s)' % (name, exc))
        return EXIT_FAILED
    finally:
        unguard()
