"""The job's output waits for a slow reader; the job does not.

The launcher copies mpiexec's standard output and error to its own. Its own
may stop being read while the job runs: a terminal behind an ssh connection
that froze (a laptop asleep), Ctrl-S, a pager left open (``| less``), ``|
tee`` into a stalled network filesystem. A copy that wrote each line itself
then blocked, and everything behind it with it: mpiexec blocked on its full
pipe to the launcher, the rank printing progress blocked on its pipe to
mpiexec, and the other ranks waited for that rank in a collective until the
step timeout ended the job. Measured (2 ranks, ``--progress-every 1
--collective-timeout-s 10``, standard output piped into ``sleep``): exit 4
after 30 s, the job's line blaming a lost connection to the host.

:class:`HeldOutput` takes each line at once and writes it from a thread of
its own. Lines wait in memory up to :data:`HOLD_MB` (``$THEANOMPI_EXT_OUTPUT_HOLD_MB``);
past that, newer lines are dropped and counted until half of what waits has
been written, and one line of ours in their place says how many and over how
long. The reports (``launcher_report``, ``exit_noise``) read every line before
it is held, so a dropped line still counts for the launcher's last words.
"""
import collections
import io
import sys
import threading
import time

from .. import output_faults
from .env_seconds import positive_from_env

#: Megabytes of the job's lines that wait for a reader that does not keep up,
#: per stream; overridden by $THEANOMPI_EXT_OUTPUT_HOLD_MB.
HOLD_MB = 16.0
HOLD_VAR = 'THEANOMPI_EXT_OUTPUT_HOLD_MB'

_NAMES = {'<stdout>': 'standard output', '<stderr>': 'standard error'}


def hold_bytes(environ=None):
    """Bytes a stream's lines may take while they wait (:data:`HOLD_VAR`);
    :class:`~theanompi_ext.errors.BadInput` naming the variable when it is not a
    number > 0."""
    return int(positive_from_env(HOLD_VAR, HOLD_MB, 'megabytes', environ) * 1e6)


def stream_name(dest):
    """How the messages name ``dest``: 'standard output', 'standard error' or its file."""
    name = getattr(dest, 'name', None)
    return _NAMES.get(name) or {1: 'standard output', 2: 'standard error'}.get(name) \
        or (name if isinstance(name, str) else 'its file')


class _Gap(object):
    """Lines dropped at one place of the stream: their count, bytes, first time."""

    def __init__(self):
        self.lines = self.bytes = 0
        self.since = time.monotonic()

    def note(self, name, hold):
        return ("theanompi-ext: %d line%s (%s) of the job's %s %s dropped here over %.0f s: "
                "it was not read as fast as the job wrote (%s waited); the job went on\n"
                % (self.lines, '' if self.lines == 1 else 's', _size(self.bytes), name,
                   'was' if self.lines == 1 else 'were', time.monotonic() - self.since,
                   _size(hold)))


def _size(n):
    return '%d bytes' % n if n < 10000 else '%.0f kB' % (n / 1e3) if n < 1e7 else \
        '%.0f MB' % (n / 1e6)


class HeldOutput(object):
    """Write lines (bytes) to ``dest`` from a thread of its own; :meth:`put` never
    waits for ``dest``.

    ``hold``: bytes that may wait (:func:`hold_bytes`); a line is always taken
    when none waits. When ``dest``'s reader has gone (a broken pipe), ``dest``
    becomes /dev/null and ``closed`` (an Event) is set; when ``dest`` cannot be
    written otherwise (a full disk), the rest is dropped after one warning on
    standard error (unless that is ``dest``). Either way every line is still taken.
    """

    def __init__(self, dest, hold, closed=None):
        self.dest, self.hold, self.closed = dest, hold, closed
        self._raw = dest if isinstance(dest, (io.RawIOBase, io.BufferedIOBase)) else \
            getattr(dest, 'buffer', None)
        self._name = stream_name(dest)
        self._waiting = collections.deque()     # lines (bytes) and gaps, in order
        self._bytes = 0
        self._gap = None            # the gap lines are dropped into now, if any
        self._ended = self._failed = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._write_all, daemon=True,
                                        name='held-' + self._name.replace(' ', '-'))
        self._thread.start()

    def put(self, line):
        """Take ``line``: it waits to be written, or is dropped (counted) when
        more than ``hold`` bytes wait."""
        with self._cond:
            if self._gap is not None and self._bytes > self.hold // 2:
                self._gap.lines += 1
                self._gap.bytes += len(line)
                return
            if self._waiting and self._bytes + len(line) > self.hold:
                self._gap = _Gap()
                self._gap.lines, self._gap.bytes = 1, len(line)
                self._waiting.append(self._gap)
                return
            self._gap = None
            self._waiting.append(line)
            self._bytes += len(line)
            self._cond.notify()

    def end(self):
        """No more lines: the thread ends once what waits is written."""
        with self._cond:
            self._ended = True
            self._cond.notify()

    def join(self, timeout=None):
        """Wait up to ``timeout`` s for what waits to be written after :meth:`end`;
        True once it is."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _next(self):
        with self._cond:
            while not self._waiting and not self._ended:
                self._cond.wait()
            if not self._waiting:
                return None
            item = self._waiting.popleft()
            if item is self._gap:
                self._gap = None        # lines after this are new lines
            return item

    def _written(self, item):
        if not isinstance(item, _Gap):
            with self._cond:
                self._bytes -= len(item)

    def _write_all(self):
        while True:
            item = self._next()
            if item is None:
                return
            data = item.note(self._name, self.hold).encode() if isinstance(item, _Gap) else item
            if not self._failed:
                self._write(data)
            self._written(item)

    def _write(self, data):
        try:
            if self._raw is not None:
                self._raw.write(data)
            else:
                self.dest.write(data.decode('utf-8', 'replace'))
            self.dest.flush()
        except Exception as exc:    # noqa: BLE001 (this thread must not die: the job's
            # lines would wait for ever) what dest still buffers, and any later line,
            # goes nowhere without an error
            output_faults.to_devnull(self.dest)
            self._failed = True
            if not isinstance(exc, BrokenPipeError):
                _say_dropped(self.dest, self._name, exc)
            elif self.closed is not None:
                self.closed.set()


def _say_dropped(dest, name, exc):
    """One warning, on standard error unless that is ``dest``: the job's lines to
    ``dest`` are dropped from now on; the job goes on."""
    try:
        if dest.fileno() == sys.stderr.fileno():
            return
        sys.stderr.write(output_faults.dropped_warning(name, exc) + '\n')
        sys.stderr.flush()
    except (OSError, AttributeError, ValueError):
        pass
