"""Run mpiexec and, when the job ends badly, say which rank died and how.

MPICH's hydra ends the whole job within ~0.1 s when a rank is killed
(SIGKILL, the OOM killer, a segfault), but its report names only the PID
and host::

    =   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES
    =   PID 17436 RUNNING AT node7
    =   EXIT CODE: 9
    YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Killed (signal 9)

:func:`run_explained` passes the job's standard output through (standard
error is untouched), recognises that report, and maps the PID to a rank
using the notes each rank leaves (:mod:`theanompi_ext.launch.rank_notes`). It
also catches the one silent case measured: a rank that exits with status 0
in the middle of training (``os._exit(0)`` in some library) makes hydra end
the job with status 0 most of the time; a rank whose note still says
``running`` turns that into status 3.
"""
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

from ..errors import EXIT_FAILED, EXIT_OK, EXIT_SIGNAL_BASE
from .mpiexec import child_env, popen_job
from .rank_notes import RANKS_DIR_VAR, make_ranks_folder, read_rank_notes

#: Seconds the ranks get to end after SIGTERM before they are SIGKILLed.
STOP_GRACE_S = 3.0
#: Signals that stop a job; the launcher then exits with 128 + the signal's number.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

_PID = re.compile(rb'=\s+PID (\d+) RUNNING AT (\S+)')
_CODE = re.compile(rb'=\s+EXIT CODE: (\d+)')
_STRING = re.compile(rb'TERMINATED WITH THE EXIT STRING: (.*)')


class LauncherReport(object):
    """What the launcher said about a process that ended badly (hydra's format)."""

    def __init__(self):
        self.pid = self.host = self.code = self.exit_string = None

    def feed(self, line):
        """Look at one line of the job's output."""
        m = _PID.search(line)
        if m and self.pid is None:
            self.pid, self.host = int(m.group(1)), m.group(2).decode('utf-8', 'replace')
        m = _CODE.search(line)
        if m and self.code is None:
            self.code = int(m.group(1))
        m = _STRING.search(line)
        if m and self.exit_string is None:
            self.exit_string = m.group(1).decode('utf-8', 'replace').strip()


class ExitOrder(threading.Thread):
    """Watches this host's ranks and records the order in which they exit.

    Hydra names one PID in its report, but when it has killed the other
    ranks itself it may name one of those (measured: 1 run in 2 named the
    wrong rank). The first rank to exit is the one that died. Each local
    rank's PID comes from its note; ``os.pidfd_open`` + ``poll`` wakes on
    each exit without polling. ``first()`` is the rank that exited
    strictly first, or None (no pidfd support, other hosts, or a tie).
    """

    def __init__(self, folder, size, interval=0.05):
        super(ExitOrder, self).__init__(name='exit-order', daemon=True)
        self.folder, self.size, self.interval = folder, size, interval
        self.exits = []               # [(monotonic time, rank)]
        self._halt = threading.Event()

    def run(self):
        if not hasattr(os, 'pidfd_open') or not self.size:
            return
        host, fds, poller = socket.gethostname(), {}, select.poll()
        try:
            while not self._halt.is_set() and not (len(fds) == self.size
                                                    and len(self.exits) == self.size):
                if len(fds) < self.size:     # ranks write their notes at start-up
                    for rank, (pid, h, _) in read_rank_notes(self.folder).items():
                        if rank not in fds.values() and h == host:
                            try:
                                fd = os.pidfd_open(pid)
                            except OSError:
                                continue
                            fds[fd] = rank
                            poller.register(fd, select.POLLIN)
                for fd, _ in poller.poll(int(self.interval * 1000)):
                    self.exits.append((time.monotonic(), fds[fd]))
                    poller.unregister(fd)
        finally:
            for fd in fds:
                os.close(fd)

    def stop(self):
        """End the watch (the job is over)."""
        self._halt.set()
        if self.is_alive():
            self.join(1.0)

    def first(self):
        """The rank that exited strictly before every other, or None."""
        if not self.exits or (len(self.exits) > 1 and self.exits[1][0] == self.exits[0][0]):
            return None
        return self.exits[0][1]


def explain(status, report, notes, size=None, first_exit=None):
    """(message or None, exit status) for a finished job.

    ``report`` is a :class:`LauncherReport`, ``notes`` the ranks' notes
    (``{rank: (pid, host, state)}``), ``size`` the number of ranks started,
    ``first_exit`` the rank seen to exit first (:class:`ExitOrder`), which
    wins over hydra's PID when it is a rank that was still running.
    """
    of = ' of %d' % size if size else ''
    if status == 0:
        vanished = sorted(r for r, (_, _, state) in notes.items() if state == 'running')
        if not vanished:
            return None, EXIT_OK
        who = ', '.join('rank %d (pid %d on %s)' % (r, notes[r][0], notes[r][1])
                        for r in vanished)
        return ('theanompi-ext: %s%s ended without finishing training although mpiexec '
                'reported success; the run is incomplete (exit status %d)'
                % (who, of, EXIT_FAILED)), EXIT_FAILED
    if report.pid is None:
        return None, status      # a rank's own message (failed / timeout) says it all
    pid, host = report.pid, report.host
    rank = next((r for r, (p, _, _) in notes.items() if p == pid), None)
    if first_exit is not None and first_exit != rank and \
            notes.get(first_exit, (0, '', ''))[2] == 'running':
        rank = first_exit
        pid, host = notes[rank][0], notes[rank][1]
    who = ('rank %d%s (pid %d on %s)' % (rank, of, pid, host) if rank is not None
           else 'a rank (pid %d on %s; its rank is unknown: it died before reporting)'
           % (pid, host))
    how = report.exit_string or ('exit code %s' % report.code)
    return ('theanompi-ext: %s died: %s; mpiexec stopped the other ranks (exit status %d)'
            % (who, how, status)), status


class Stopped(Exception):
    """The launcher received a signal that stops the job."""

    def __init__(self, signum):
        super(Stopped, self).__init__(signal.Signals(signum).name)
        self.signum = signum


def _stopped(signum, frame):
    raise Stopped(signum)


def _catch_stop_signals():
    """SIGTERM and SIGHUP raise :class:`Stopped` (SIGINT already raises
    KeyboardInterrupt); returns the previous handlers ({} off the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, _stopped) for sig in (signal.SIGTERM, signal.SIGHUP)}


def _parent_of(pid):
    try:
        with open('/proc/%d/stat' % pid) as f:
            return int(f.read().rsplit(')', 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _kill(pid, sig):
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _gone(pid):
    try:
        with open('/proc/%d/stat' % pid) as f:
            return f.read().rsplit(')', 1)[1].split()[0] in ('Z', 'X')
    except OSError:
        return True


def stop_job(proc, notes_folder, grace=STOP_GRACE_S):
    """End the job of mpiexec ``proc`` and every rank of this host, within ``grace`` s + 1.

    SIGTERM to mpiexec's process group (hydra forwards it to every rank) and
    to each local rank directly, with SIGCONT for stopped ones; whatever is
    alive after ``grace`` is SIGKILLed: mpiexec, the ranks, and hydra's
    proxies (each in a session of its own, so no process group reaches them).
    """
    host = socket.gethostname()
    ranks = [pid for pid, h, _ in read_rank_notes(notes_folder).values() if h == host]
    proxies = {p for p in (_parent_of(pid) for pid in ranks) if p and p != proc.pid
               and p != os.getpid() and p != 1}
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in ranks:
        _kill(pid, signal.SIGTERM)
        _kill(pid, signal.SIGCONT)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and not (proc.poll() is not None and
                                               all(_gone(p) for p in ranks)):
        time.sleep(0.02)
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for pid in ranks + sorted(proxies):
        if not _gone(pid):
            _kill(pid, signal.SIGKILL)
    proc.wait()


def _drain(stream):
    # Keep mpiexec from blocking on a full pipe while it stops.
    threading.Thread(target=lambda: [None for _ in iter(lambda: stream.read(65536), b'')],
                     daemon=True).start()


def run_explained(cmd, env=None, size=None):
    """Run the mpiexec command ``cmd`` like :func:`~.mpiexec.run_mpiexec`, then explain.

    SIGINT, SIGTERM and SIGHUP stop every rank (:func:`stop_job`) and return
    128 + the signal's number (130, 143, 129); if this process is SIGKILLed,
    mpiexec gets SIGKILL from the kernel and the ranks follow
    (``launch/mpiexec.popen_job``, ``train/faults.stop_with_parent``).
    Returns the exit status (see :mod:`theanompi_ext.errors`).
    """
    folder = make_ranks_folder()
    env = dict(env or child_env())
    env[RANKS_DIR_VAR] = folder
    report = LauncherReport()
    watch = ExitOrder(folder, size or 0)
    out = getattr(sys.stdout, 'buffer', None)
    old_handlers = _catch_stop_signals()
    proc = None
    try:
        proc = popen_job(cmd, env, stdout=subprocess.PIPE)
        watch.start()
        for line in iter(proc.stdout.readline, b''):
            if out is not None:
                out.write(line)
            else:
                sys.stdout.write(line.decode('utf-8', 'replace'))
            sys.stdout.flush()
            report.feed(line)
        status = proc.wait()
        watch.stop()
        message, status = explain(status, report, read_rank_notes(folder), size,
                                  first_exit=watch.first())
        if message:
            sys.stderr.write(message + '\n')
            sys.stderr.flush()
        return status
    except (KeyboardInterrupt, Stopped) as exc:
        signum = getattr(exc, 'signum', signal.SIGINT)
        # a second signal while stopping must not cut the stop short
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        if proc is not None:
            _drain(proc.stdout)
            stop_job(proc, folder)
        watch.stop()
        sys.stderr.write('theanompi-ext: stopped by %s: every rank of the job ended '
                         '(exit status %d)\n' % (signal.Signals(signum).name,
                                                 EXIT_SIGNAL_BASE + signum))
        sys.stderr.flush()
        return EXIT_SIGNAL_BASE + signum
    finally:
        if old_handlers:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        for sig, handler in old_handlers.items():
            signal.signal(sig, handler)
        shutil.rmtree(folder, ignore_errors=True)
