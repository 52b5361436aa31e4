"""A SIGTERM that reached a rank: marked by the rank as it dies, read by the launcher.

SIGTERM ends a rank by its default action, at once, without a word: nothing
of Python runs. Sent to mpiexec alone (``kill`` of its PID; a supervisor that
signals only the process it started), hydra passes it on to every rank, and
Open MPI's prterun answers SIGTERM, SIGINT and SIGHUP by sending SIGTERM to
every rank. mpiexec then reports the first rank it saw die as killed by
SIGTERM, just as when that one rank alone was sent it, and the launcher
blamed that rank (exit status 15, a death a restart would cure: measured,
hydra's reports of the two cases are the same, line for line).

So each rank registers :mod:`faulthandler` for SIGTERM, chained: at the
signal, C code (no Python, whatever the rank is doing) writes the rank's
stack into ``rank<R>.sigterm`` beside its note, and the default action then
ends the rank as before (measured: a rank ended within 5 ms of the signal,
sleeping or inside a matrix product). The launcher reads which ranks were
marked (:func:`signalled_ranks`): every rank, where no rank had noted an
error of its own and mpiexec reported no other death, is a stop of the whole
job from outside the launcher (:func:`stopped_from_outside`), status 143
as for a stop of the launcher itself (not restarted). A SIGTERM that a write
holds (``files/signals.py``) is marked when it comes (``stop_signals.after_set``),
and a forked writer's (``files/isolated.py``) own SIGTERM is not the rank's.
"""
import faulthandler
import os
import signal

from .. import stop_signals
from ..errors import EXIT_SIGNAL_BASE
from .rank_notes import rank_files, rank_list

#: The signal marked.
MARKED = signal.SIGTERM
#: The file beside rank R's note that its mark goes to.
MARK_SUFFIX = '.sigterm'

_mark = []      # the open mark file of this rank (faulthandler writes to it)


def mark_signal(folder, rank):
    """From now on a SIGTERM that reaches this rank leaves ``rank<R>.sigterm`` in
    ``folder``, before the handler in place acts on it (the default action: the
    rank ends; a write's: held until the write ends). Nothing when SIGTERM is
    ignored (whoever started us asked for that) or the file cannot be opened
    (marks only improve the launcher's message). Returns True when marked."""
    if _mark or stop_signals.ignored(MARKED):
        return bool(_mark)
    try:
        mark = open(os.path.join(folder, 'rank%d%s' % (rank, MARK_SUFFIX)), 'w')
    except OSError:
        return False
    _mark.append(mark)
    _register()
    # again over each handler set later: a write holds SIGTERM with one of Python's
    # (files/signals.py), and Open MPI's prterun SIGKILLs 0.25 s after its SIGTERM,
    # so the mark is written when the signal comes, not when it is acted on
    stop_signals.after_set(MARKED, _register_again)
    os.register_at_fork(after_in_child=_forget_in_child)
    return True


def _register():
    # chained: the handler in place now runs after the mark (SIG_DFL: the rank ends)
    faulthandler.register(MARKED, file=_mark[0], all_threads=False, chain=True)


def _register_again():
    # faulthandler installs nothing for a signal it still counts as registered, and
    # its unregister puts back the handler it chained to then: so the handler just
    # set goes back before the mark is chained to it
    handler = signal.getsignal(MARKED)
    faulthandler.unregister(MARKED)
    signal.signal(MARKED, signal.SIG_DFL if handler is None else handler)
    _register()


def _forget_in_child():
    if _mark:
        faulthandler.unregister(MARKED)
        stop_signals.after_set(MARKED, None)
        del _mark[:]


def signalled_ranks(folder):
    """The ranks that left a mark in ``folder`` (a non-empty ``rank<R>.sigterm``: an
    empty one was opened at the start and never written)."""
    ranks = set()
    for rank, path in rank_files(folder, MARK_SUFFIX):
        try:
            if os.path.getsize(path):
                ranks.add(rank)
        except OSError:
            continue
    return ranks


def stopped_from_outside(signalled, size, failed, reported, openmpi):
    """True when the job's end was a SIGTERM that reached every rank from outside
    the launcher: all ``size`` ranks ``signalled`` (:func:`signalled_ranks`), none
    that noted an error of its own (``failed``: their ranks), and mpiexec's report
    of a rank's death, if any (``reported``: the signal that killed it, ``None``
    when mpiexec reported no death, 0 for a death by no signal), one by SIGTERM.
    Under Open MPI (``openmpi``) any report is a rank that died first: prterun
    then sends every other rank SIGTERM itself."""
    if openmpi and reported is not None:
        return False
    return bool(size) and signalled >= set(range(size)) and not failed and \
        reported in (None, MARKED)


def message(size):
    """(the launcher's line, exit status) for :func:`stopped_from_outside`: the
    status of a stop by SIGTERM, 143."""
    status = EXIT_SIGNAL_BASE + MARKED
    return ('theanompi-ext: every rank of the job (%s of %d) was sent SIGTERM, and not by '
            'this launcher: mpiexec passes a stop signal it is sent on to every rank (`kill` '
            'of mpiexec), or a batch scheduler or `kill` signalled the ranks; the job was '
            'stopped (exit status %d)' % (rank_list(range(size)), size, status)), status
