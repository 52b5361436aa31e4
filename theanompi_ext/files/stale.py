"""Temporary files left by writers that died, found by the PID in their names.

:func:`~theanompi_ext.files.atomic.write_atomic` writes ``PATH.tmp-<pid>``;
a writer killed mid-way leaves it behind. Such a file is removed once its
process is gone (or, under the folder's lock, whatever its PID). HDF5's own
temporaries (``.NAME.*.tmp``) are found for :mod:`.isolated`.
"""
import os
import re

from .atomic import remove_quietly

_TMP = re.compile(r'\.tmp-(\d+)$')


def pid_alive(pid):
    """Whether a process ``pid`` exists on this host (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def entries_of_dead_pids(folder, pattern, include_live=False):
    """Names in ``folder`` that ``pattern`` finds (its group 1: a PID) whose process
    is gone (every match with ``include_live``); [] if ``folder`` cannot be listed."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    out = []
    for name in names:
        m = pattern.search(name)
        if m and (include_live or not pid_alive(int(m.group(1)))):
            out.append(name)
    return out


def remove_stale_temporaries(folder, all_of_them=False):
    """Delete ``*.tmp-<pid>`` files in ``folder`` left by dead writers; return their names.

    ``all_of_them``: also those whose PID is alive (the caller holds the
    folder's lock, so no writer of this project is at work there).
    """
    removed = entries_of_dead_pids(folder, _TMP, all_of_them)
    for name in removed:
        remove_quietly(os.path.join(folder, name))
    return removed


def own_temporaries(folder, base):
    """Temporaries of ``base`` in ``folder``: HDF5's ``.BASE.*.tmp`` and ours, ``BASE.tmp-*``."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return [n for n in names if (n.startswith('.%s.' % base) and n.endswith('.tmp'))
            or n.startswith('%s.tmp-' % base)]


def remove_new_temporaries(folder, base, before):
    """Remove the temporaries of ``base`` in ``folder`` that are not in ``before``."""
    for name in own_temporaries(folder, base):
        if name not in before:
            remove_quietly(os.path.join(folder, name))
