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
using the notes each rank leaves (:mod:`theanompi_ext.train.faults`). It
also catches the one silent case measured: a rank that exits with status 0
in the middle of training (``os._exit(0)`` in some library) makes hydra end
the job with status 0 most of the time; a rank whose note still says
``running`` turns that into status 3.
"""
import os
import re
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

from .mpiexec import child_env, stop_group

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
        from ..train.faults import read_rank_notes
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
            return None, 0
        who = ', '.join('rank %d (pid %d on %s)' % (r, notes[r][0], notes[r][1])
                        for r in vanished)
        return ('theanompi-ext: %s%s ended without finishing training although mpiexec '
                'reported success; the run is incomplete (exit status 3)' % (who, of)), 3
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


def run_explained(cmd, env=None, size=None):
    """Run the mpiexec command ``cmd`` like :func:`~.mpiexec.run_mpiexec`, then explain.

    Returns the exit status (see :mod:`theanompi_ext.train.faults`).
    """
    from ..train.faults import RANKS_DIR_VAR, read_rank_notes
    folder = tempfile.mkdtemp(prefix='theanompi-ext-ranks-')
    env = dict(env or child_env())
    env[RANKS_DIR_VAR] = folder
    report = LauncherReport()
    watch = ExitOrder(folder, size or 0)
    out = getattr(sys.stdout, 'buffer', None)
    try:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, start_new_session=True)
        watch.start()
        try:
            for line in iter(proc.stdout.readline, b''):
                if out is not None:
                    out.write(line)
                else:
                    sys.stdout.write(line.decode('utf-8', 'replace'))
                sys.stdout.flush()
                report.feed(line)
            status = proc.wait()
        except KeyboardInterrupt:
            stop_group(proc)
            watch.stop()
            return 130
        watch.stop()
        message, status = explain(status, report, read_rank_notes(folder), size,
                                  first_exit=watch.first())
        if message:
            sys.stderr.write(message + '\n')
            sys.stderr.flush()
        return status
    finally:
        shutil.rmtree(folder, ignore_errors=True)
