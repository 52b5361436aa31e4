"""An mpiexec still running after every rank has ended: stopped, and the job told.

mpiexec learns that a rank has ended from that rank's host (hydra's proxy,
Open MPI's daemon), over the launcher's connection to it. When that
connection is cut silently (the login node's link lost, a firewall
dropping an idle connection) and the ranks go on between themselves,
they finish training, write their outputs and exit, and mpiexec waits
for the word of their hosts for ever (measured on emulated hosts with the
launcher's address taken away: MPICH's mpiexec still waited 120 s after
both ranks had ended, nothing left on either host). A rank's own note
(:mod:`.rank_notes`, on the filesystem the launcher shares with its host)
says it has ended without that connection.

:class:`AfterRanks` watches the notes: once every rank's note says it has
ended (``done``, ``failed``, ``stopped`` or ``died``), or one says ``failed``
(a rank that aborts the job, whose abort mpiexec cannot pass on either: a
rank killed on one host while the launcher was cut off, measured, left the
others to their watchdogs and mpiexec waiting) or ``died`` (its keeper's
word for a rank gone without one of its own, :mod:`.rank_keeper`), and
mpiexec still runs
:func:`after_ranks_s` seconds later, it stops mpiexec. :meth:`AfterRanks.message`
then gives the launcher's last line and the job's status, from the notes:
the ranks' own outcome, not the stop's. It needs the ranks' notes, so it
does nothing where the far hosts cannot write into the launcher's notes
folder (no shared ``$TMPDIR``; docs/multinode.md).
"""
import os
import threading
import time

from ..errors import EXIT_FAILED, EXIT_OK, EXIT_RESUMABLE
from .env_seconds import seconds_from_env
from .lost_lines import told
from .rank_notes import DIED, note_times, read_rank_notes

#: Seconds mpiexec gets to end after every rank's note says it has ended: far
#: more than hydra's or Open MPI's teardown takes (under a second, measured),
#: which includes MPI_Finalize's exchange between the ranks.
AFTER_RANKS_S = 20.0
#: Sets :data:`AFTER_RANKS_S` for a job (seconds > 0).
AFTER_RANKS_VAR = 'THEANOMPI_EXT_AFTER_RANKS_S'
#: Seconds a finished rank's MPI_Finalize gets beyond the launcher's wait before
#: the rank and its MPI daemon end themselves (collective/abort_alone.watch_finalize).
FINALIZE_MARGIN_S = 10.0


def after_ranks_s(environ=None):
    """The wait of :class:`AfterRanks`: ``$THEANOMPI_EXT_AFTER_RANKS_S``, else
    :data:`AFTER_RANKS_S`; BadInput naming the variable for anything but a
    number > 0."""
    return seconds_from_env(AFTER_RANKS_VAR, AFTER_RANKS_S, environ)


def finalize_alone_s(environ=None):
    """How long a rank that has finished may take to end, in the rank: the
    launcher's wait (its ``$THEANOMPI_EXT_AFTER_RANKS_S`` reaches the ranks; the
    default where unset or invalid, which the launcher refuses) plus
    :data:`FINALIZE_MARGIN_S`."""
    try:
        wait = after_ranks_s(environ)
    except ValueError:
        wait = AFTER_RANKS_S
    return wait + FINALIZE_MARGIN_S


def ended(notes, size):
    """True when ``notes`` (``{rank: (pid, host, state)}``) hold all ``size`` ranks and
    none of them is still ``running``."""
    return bool(size) and len(notes) >= size and all(
        state != 'running' for _, _, state in notes.values())


def settled(notes, size):
    """True when every rank has ended (:func:`ended`), or a rank has failed (its
    abort ends the job within a second or two where mpiexec can reach the hosts)
    or died (its keeper's note, :mod:`.rank_keeper`: mpiexec ends the job as
    soon, where it hears of it)."""
    return ended(notes, size) or any(state.startswith('failed') or state == DIED
                                     for _, _, state in notes.values())


def note_status(state):
    """The exit status a rank's note gives: ``done 0`` -> 0, ``failed 3`` -> 3."""
    number = state.partition(' ')[2]
    return int(number) if number.isdigit() else None


def _mtime(folder):
    try:
        return os.stat(folder).st_mtime_ns
    except OSError:
        return None


class AfterRanks(threading.Thread):
    """Calls ``stop()`` when mpiexec ``proc`` still runs ``wait_s`` seconds after
    every one of ``size`` ranks noted in ``folder`` that it has ended, or one noted
    that it failed (:func:`settled`). ``fired``: it did.

    The notes are read again when the folder changes (a note is written by a
    rename into it), and every ``reread_s`` whatever its time says (two notes
    within one tick of a coarse clock): not a read of every note each second of a
    run of days, on a shared filesystem."""

    def __init__(self, proc, folder, size, stop, wait_s=AFTER_RANKS_S, interval=1.0,
                 reread_s=10.0):
        super(AfterRanks, self).__init__(name='after-ranks', daemon=True)
        self.proc, self.folder, self.size, self.stop_job = proc, folder, size, stop
        self.wait_s, self.interval, self.reread_s = wait_s, interval, reread_s
        self.fired = False

    def run(self):
        seen = mtime = None
        read_at = time.monotonic()
        while self.proc.poll() is None:
            if seen is None:
                now, changed = time.monotonic(), _mtime(self.folder)
                if changed != mtime or now - read_at >= self.reread_s:
                    mtime, read_at = changed, now
                    if settled(read_rank_notes(self.folder), self.size):
                        seen = now
            if seen is not None and time.monotonic() - seen > self.wait_s:
                self.fired = True
                self.stop_job()
                return
            time.sleep(self.interval)

    def message(self, notes, times=None, lost=None):
        """(the launcher's line, exit status) once it has fired: the ranks' outcome
        as their notes give it, and that mpiexec was stopped. 0 when each finished;
        else the first rank to end badly (``times``: :func:`~.rank_notes.note_times`,
        read from the folder by default; the lowest rank among equals) is named,
        with its own status, or 3 for a rank that died without a word (its
        keeper's note: it was killed, or ended by MPI's error handler). ``lost``:
        ``{rank: its own line}`` of the ranks whose line did not come through
        (``launch/lost_lines.py``), said here instead."""
        times = note_times(self.folder) if times is None else times
        hosts = ', '.join(sorted({host for _, host, _ in notes.values()}))
        failed = sorted((r for r, (_, _, state) in notes.items()
                         if note_status(state) or state == DIED),
                        key=lambda r: (times.get(r, float('inf')), r))
        tail = ('mpiexec had not ended %.0f s after %s (it lost its connection to their '
                'hosts, %s?) and was stopped' % (
                    self.wait_s, 'every rank had' if ended(notes, self.size) else
                    'rank %d %s' % (failed[0], notes[failed[0]][2].partition(' ')[0]),
                    hosts))
        of = ' of %d' % self.size
        if not failed:
            return ('theanompi-ext: every rank finished training; %s (exit status %d)'
                    % (tail, EXIT_OK)), EXIT_OK
        pid, host, state = notes[failed[0]]
        if state == DIED:
            return ('theanompi-ext: rank %d%s (pid %d on %s) died: it ended without finishing '
                    'training and without a word (killed, or ended by MPI\'s own error '
                    'handler; its keeper on %s noted it); %s (exit status %d)'
                    % (failed[0], of, pid, host, host, tail, EXIT_FAILED)), EXIT_FAILED
        states = {notes[r][2].partition(' ')[0] for r in failed}
        status = note_status(state)
        if states == {'stopped'} and status == EXIT_RESUMABLE:
            return ('theanompi-ext: all %d ranks stopped after the checkpoint, as asked: the '
                    'job can be resumed; %s (exit status %d)' % (len(notes), tail, status)), \
                status
        # its own line went the way mpiexec's word did: it may not have arrived
        line = (lost or {}).get(failed[0])
        said = (told([line], 'lost with that connection') if line else
                'its own line, if it is not above, was lost with that connection')
        return ('theanompi-ext: rank %d%s (pid %d on %s) ended the job (exit status %d); %s; %s'
                % (failed[0], of, pid, host, status, tail, said)), status
