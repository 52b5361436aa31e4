"""The notes each rank leaves for the launcher: written by the ranks, read by
``launch/postmortem.py``.

When ``THEANOMPI_EXT_RANKS_DIR`` is set (``theanompi-ext train`` sets it when it
starts mpiexec), every rank writes ``rank<R>`` there: ``<pid> <host> <state>``
with state ``running``, ``done 0``, ``failed N`` or ``stopped N``; or ``died``,
written by the rank's keeper (:mod:`.rank_keeper`) when the rank has gone
while its note still said ``running``. A rank that aborts the job also
leaves ``rank<R>.why``, its own line on why (:func:`write_rank_why`). The launcher maps the PID that
mpiexec reports for a killed process back to its rank, and notices ranks
that vanished without finishing.

The folder is ``$TMPDIR/theanompi-ext-ranks-<launcher pid>-<random suffix>``
(:func:`make_ranks_folder`). A launcher removes its own when the job ends;
one that was SIGKILLed cannot, so every launcher first removes those of
launchers that no longer run (:func:`remove_stale_ranks_folders`).
"""
import os
import re
import shutil
import socket
import tempfile

from ..files.stale import entries_of_dead_pids

RANKS_DIR_VAR = 'THEANOMPI_EXT_RANKS_DIR'
#: The state a rank's keeper notes for a rank gone without a note of its own.
DIED = 'died'
RANKS_PREFIX = 'theanompi-ext-ranks-'
_STALE = re.compile('^' + re.escape(RANKS_PREFIX) + r'(\d+)-')


def rank_list(ranks):
    """Ranks as a person reads them: ``[0, 1, 2, 3, 7]`` -> ``'0-3, 7'`` (runs of
    three or more as a span, so that 256 ranks stay one short line)."""
    ranks, spans = sorted(set(ranks)), []
    for r in ranks:
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return ', '.join('%d-%d' % (a, b) if b - a >= 2 else
                     ('%d, %d' % (a, b) if b > a else '%d' % a) for a, b in spans)


def make_ranks_folder(tmpdir=None):
    """A new notes folder named for this launcher, after removing stale ones."""
    remove_stale_ranks_folders(tmpdir)
    return tempfile.mkdtemp(prefix='%s%d-' % (RANKS_PREFIX, os.getpid()), dir=tmpdir)


def remove_stale_ranks_folders(tmpdir=None):
    """Remove this user's notes folders whose launcher PID is gone; return their names.

    Only folders named ``theanompi-ext-ranks-<pid>-...`` (real folders, not
    links) are touched; a folder whose PID now belongs to another process is
    kept (it is small, and a later launcher removes it).
    """
    tmpdir = tmpdir or tempfile.gettempdir()
    removed = []
    for name in entries_of_dead_pids(tmpdir, _STALE):
        path = os.path.join(tmpdir, name)
        try:
            mine = os.lstat(path).st_uid == os.getuid()
        except OSError:
            continue
        if mine and os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(name)
    return removed


def write_rank_note(folder, rank, state):
    """Write rank ``rank``'s note ``state`` into ``folder`` (never fails the run)."""
    path = os.path.join(folder, 'rank%d' % rank)
    try:
        # Written whole then renamed, so the launcher never reads half a note.
        with open(path + '.tmp', 'w') as f:
            f.write('%d %s %s\n' % (os.getpid(), socket.gethostname(), state))
        os.replace(path + '.tmp', path)
    except OSError:
        pass   # notes only improve messages; never fail a run over them


#: The file beside rank R's note that holds its own line on why it aborted the job.
WHY_SUFFIX = '.why'
#: At most this many characters of that line are kept.
WHY_CHARS = 4000


def write_rank_why(folder, rank, line):
    """Keep ``line``, rank ``rank``'s own line on why it aborts the job, beside its
    note (whole, by a rename; never fails the run): the launcher repeats it when
    the line itself did not reach it (``launch/lost_lines.py``)."""
    path = os.path.join(folder, 'rank%d%s' % (rank, WHY_SUFFIX))
    try:
        with open(path + '.tmp', 'w', encoding='utf-8', errors='backslashreplace') as f:
            f.write(line.strip()[:WHY_CHARS] + '\n')
        os.replace(path + '.tmp', path)
    except OSError:
        pass


def read_rank_why(folder, rank):
    """Rank ``rank``'s own line on why it aborted (:func:`write_rank_why`), or None."""
    try:
        with open(os.path.join(folder, 'rank%d%s' % (rank, WHY_SUFFIX)), encoding='utf-8',
                  errors='replace') as f:
            return f.read().strip() or None
    except OSError:
        return None


def rank_files(folder, suffix=''):
    """``(rank, path)`` of each ``rank<R><suffix>`` in ``folder``: the notes, or with
    a suffix the files beside them (none when it cannot be listed)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    found = []
    for name in names:
        number = name[4:len(name) - len(suffix)]
        if name.startswith('rank') and name.endswith(suffix) and number.isdigit():
            found.append((int(number), os.path.join(folder, name)))
    return found


def read_rank_notes(folder):
    """``{rank: (pid, host, state)}`` from the notes in ``folder``."""
    notes = {}
    for rank, path in rank_files(folder):
        try:
            with open(path) as f:
                pid, host, state = f.read().strip().split(' ', 2)
            notes[rank] = (int(pid), host, state)
        except (OSError, ValueError):
            continue
    return notes


def unfinished(state):
    """True for a rank that did not end by itself: still ``running``, or
    ``died`` (gone without a word, as its keeper saw)."""
    return state in ('running', DIED)


def unfinished_ranks(notes):
    """The ranks of ``notes`` (``{rank: (pid, host, state)}``) that had not finished
    training (:func:`unfinished`), in order."""
    return sorted(r for r, (_, _, state) in notes.items() if unfinished(state))


def note_times(folder):
    """``{rank: when its note was last written}`` (ns since the epoch) for the notes
    in ``folder``: the order in which the ranks ended, where each has."""
    times = {}
    for rank, path in rank_files(folder):
        try:
            times[rank] = os.stat(path).st_mtime_ns
        except OSError:
            continue
    return times
