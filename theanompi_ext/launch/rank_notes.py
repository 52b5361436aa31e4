"""The notes each rank leaves for the launcher: written by the ranks, read by
``launch/postmortem.py``.

When ``THEANOMPI_EXT_RANKS_DIR`` is set (``theanompi-ext train`` sets it when it
starts mpiexec), every rank writes ``rank<R>`` there: ``<pid> <host> <state>``
with state ``running``, ``done 0`` or ``failed N``. The launcher maps the PID
that mpiexec reports for a killed process back to its rank, and notices ranks
that vanished without finishing.
"""
import os
import socket

RANKS_DIR_VAR = 'THEANOMPI_EXT_RANKS_DIR'


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


def read_rank_notes(folder):
    """``{rank: (pid, host, state)}`` from the notes in ``folder``."""
    notes = {}
    try:
        names = os.listdir(folder)
    except OSError:
        return notes
    for name in names:
        if not (name.startswith('rank') and name[4:].isdigit()):
            continue
        try:
            with open(os.path.join(folder, name)) as f:
                pid, host, state = f.read().strip().split(' ', 2)
            notes[int(name[4:])] = (int(pid), host, state)
        except (OSError, ValueError):
            continue
    return notes
