"""A stop signal that reached a rank: marked by the rank as it comes, read by the launcher.

SIGTERM ends a rank by its default action, at once, without a word: nothing
of Python runs. Sent to mpiexec alone (``kill`` of its PID; a supervisor that
signals only the process it started), hydra passes it on to every rank, and
Open MPI's prterun answers SIGTERM, SIGINT and SIGHUP by sending SIGTERM to
every rank. mpiexec then reports the first rank it saw die as killed by
SIGTERM, just as when that one rank alone was sent it, and the launcher
blamed that rank (exit status 15, a death a restart would cure: measured,
hydra's reports of the two cases are the same, line for line).

SIGINT sent to hydra alone (``kill -INT``) is passed on to every rank too;
each says ``stopped by SIGINT`` and aborts, and the launcher named the rank
whose abort ended the job. Nor could the ranks' notes tell it from a SIGINT
to one rank: a rank inside a checkpoint write holds the signal, and the
first abort kills it before it notes anything (measured, 1 run in 2). hydra
passes SIGQUIT on as well, and the first rank it killed was named.

So each rank registers :mod:`faulthandler` for the three, chained: at the
signal, C code (no Python, whatever the rank is doing) writes the rank's
stack into ``rank<R>.sigterm`` (``.sigint``, ``.sigquit``) beside its note,
and the handler in place then acts on it as before (SIGTERM's default
action ends the rank: measured within 5 ms of the signal, sleeping or inside
a matrix product; SIGINT raises ``KeyboardInterrupt``; SIGQUIT ends it, with
a core file where ``ulimit -c`` allows). The launcher reads which ranks
were marked (:func:`signalled_ranks`): every rank, where no rank had noted
an error of its own and mpiexec reported no other death, is a signal to the
whole job from outside the launcher (:func:`stopped_from_outside`). For
SIGTERM and SIGINT that is a stop, with the status of a stop of the
launcher itself by that signal (143, 130: not restarted); SIGQUIT, which
the launcher takes as a kill of itself, and prterun dies of, keeps the
status 3 of a kill (restartable), its line naming no rank. A signal that a
write holds (``files/signals.py``) is marked when it comes
(``stop_signals.set_through``), and a forked writer's (``files/isolated.py``)
own signal is not the rank's. hydra's banner of such a stop is held
(:func:`every_rank_marked`, ``launch/exit_noise.py``).
"""
import faulthandler
import os
import signal

from .. import stop_signals
from ..errors import EXIT_FAILED, EXIT_SIGNAL_BASE
from .rank_notes import rank_files, rank_list

#: The signals marked, each with the file beside rank R's note its mark goes to.
MARKS = {signal.SIGTERM: '.sigterm', signal.SIGINT: '.sigint', signal.SIGQUIT: '.sigquit'}
#: The signals of :data:`MARKS` that stop the job (the rest end it as a kill).
STOPS = (signal.SIGTERM, signal.SIGINT)

_marks = {}     # signal -> this rank's open mark file (faulthandler writes to it)


def mark_signal(folder, rank):
    """From now on a SIGTERM, SIGINT or SIGQUIT that reaches this rank leaves
    ``rank<R>.sigterm`` (``.sigint``, ``.sigquit``) in ``folder``, before the
    handler in place acts on it (SIGTERM's and SIGQUIT's default action: the rank
    ends; SIGINT's: it raises ``KeyboardInterrupt``; a write's: held until the
    write ends). A signal that is ignored (whoever started us asked for that),
    or whose file cannot be opened (marks only improve the launcher's message),
    is left unmarked. Returns the signals marked."""
    if _marks:
        return set(_marks)
    with stop_signals.held_back():     # while faulthandler half registers
        for sig, suffix in MARKS.items():
            _mark(sig, os.path.join(folder, 'rank%d%s' % (rank, suffix)))
    if _marks:
        os.register_at_fork(after_in_child=_forget_in_child)
    return set(_marks)


def _mark(sig, path):
    if stop_signals.ignored(sig):
        return
    try:
        _marks[sig] = open(path, 'w')
    except OSError:
        return
    _register(sig)
    # again over each handler set later: a write holds the signal with one of
    # Python's (files/signals.py), and Open MPI's prterun SIGKILLs 0.25 s after its
    # SIGTERM, so the mark is written when the signal comes, not when it is acted on
    stop_signals.set_through(sig, _set_marked)


def _register(sig):
    # chained: the handler in place now runs after the mark (SIG_DFL: the rank ends)
    faulthandler.register(sig, file=_marks[sig], all_threads=False, chain=True)


def _set_marked(sig, handler):
    # The signal waits (blocked in this thread; the rank's other threads leave SIGINT
    # to this one: stop_signals.start_thread) while the mark comes off, the handler
    # is set and the mark is chained to it again, and comes after, marked (a SIGTERM
    # may go to another thread in those microseconds: unmarked, or dropped in the
    # nanoseconds in which faulthandler is half registered).
    # Unblocked, one that came meanwhile met an unmarked handler, or none: faulthandler
    # drops a signal while it is half registered, and putting back the handler it had
    # chained to left the old one's C handler under the new Python one (SIG_DFL:
    # dropped). Measured in a loop of swaps, 20 signals each: SIGTERM 5 unmarked and
    # 3 more dropped, SIGINT 10 and 1 (docs/faults.md); a rank then looked stopped
    # by itself.
    with stop_signals.held_back((sig,)):
        faulthandler.unregister(sig)
        try:
            return signal.signal(sig, handler)
        finally:
            # also where a signal pending before raised in signal.signal (it runs
            # Python's handlers first): the handler in place keeps its mark
            _register(sig)


def _forget_in_child():
    for sig in list(_marks):
        faulthandler.unregister(sig)
        stop_signals.set_through(sig, None)
        del _marks[sig]


def signalled_ranks(folder, sig=signal.SIGTERM):
    """The ranks that left a mark of ``sig`` in ``folder`` (a non-empty
    ``rank<R>.sigterm``, ``.sigint``, ``.sigquit``: an empty one was opened at
    the start and never written)."""
    ranks = set()
    for rank, path in rank_files(folder, MARKS[sig]):
        try:
            if os.path.getsize(path):
                ranks.add(rank)
        except OSError:
            continue
    return ranks


def stopped_from_outside(signalled, size, failed, reported, openmpi, sig=signal.SIGTERM):
    """True when the job's end was signal ``sig`` reaching every rank from outside
    the launcher: all ``size`` ranks ``signalled`` (:func:`signalled_ranks`), none
    that noted an error of its own (``failed``: their ranks; a rank's note of its
    stop by ``sig`` itself is none), and mpiexec's report of a rank's death, if any
    (``reported``: the signal that killed it, ``None`` when mpiexec reported no
    death, 0 for a death by no signal), one by ``sig``. Under Open MPI
    (``openmpi``) a report with SIGTERM marks is a rank that died first: prterun
    then sends every other rank SIGTERM itself (and SIGKILL, never SIGINT or
    SIGQUIT, which marks on every rank thus say came from outside)."""
    if reported is not None and _sent_by_prterun(sig, openmpi):
        return False
    return bool(size) and signalled >= set(range(size)) and not failed and \
        reported in (None, sig)


def every_rank_marked(folder, size, openmpi=False):
    """True when each of ``size`` ranks has marked the same signal of :data:`MARKS`
    in ``folder``: mpiexec's banner then reports the first rank that ended of it
    (hydra's of a death by SIGTERM or SIGQUIT; Open MPI's of that death, or of the
    abort of a rank that took SIGINT), not a death of the rank's own. Under Open
    MPI (``openmpi``) SIGTERM marks do not count: prterun sends every other rank
    SIGTERM itself after a rank's own death, which its banner reports."""
    everyone = set(range(size))
    return bool(size) and any(signalled_ranks(folder, sig) >= everyone for sig in MARKS
                              if not _sent_by_prterun(sig, openmpi))


def _sent_by_prterun(sig, openmpi):
    # Open MPI's prterun sends the other ranks SIGTERM (then SIGKILL) itself once
    # one rank has ended: its marks may be prterun's, not the outside's
    return openmpi and sig == signal.SIGTERM


def stop_from_outside(folder, size, notes, reported, openmpi, sigterm_from_within):
    """The signal (SIGTERM, SIGINT, SIGQUIT) that reached every rank of the job from
    outside the launcher (:func:`stopped_from_outside`), else None. ``notes``:
    the ranks' notes (``{rank: (pid, host, state)}``); ``sigterm_from_within``:
    the launcher sent the ranks SIGTERM itself (its stop after an abort), or an
    MPI proxy ended (its ranks get SIGTERM then: ``PR_SET_PDEATHSIG``), so
    SIGTERM marks say nothing. SIGINT and SIGQUIT only ever come from outside: a
    rank that takes SIGINT aborts the job (``stopped by SIGINT``), which ends the
    others without one."""
    for sig in MARKS:
        if sig == signal.SIGTERM and sigterm_from_within:
            continue
        own_stop = 'failed %d' % (EXIT_SIGNAL_BASE + sig)
        failed = [r for r, (_, _, state) in notes.items()
                  if state.startswith('failed') and state != own_stop]
        if stopped_from_outside(signalled_ranks(folder, sig), size, failed, reported,
                                openmpi, sig):
            return sig
    return None


def message(size, sig=signal.SIGTERM):
    """(the launcher's line, exit status) for :func:`stopped_from_outside`: the
    status of a stop by ``sig`` (143 SIGTERM, 130 SIGINT); for SIGQUIT, a kill's
    (3, as the death of a rank by signal 3, or of prterun, would give)."""
    name = signal.Signals(sig).name
    if sig in STOPS:
        status = EXIT_SIGNAL_BASE + sig
        passed, how = 'a stop signal', 'the job was stopped'
    else:
        status = EXIT_FAILED
        passed, how = 'a %s' % name, 'each ended by it, as killed'
    return ('theanompi-ext: every rank of the job (%s of %d) was sent %s, and not by this '
            'launcher: mpiexec passes %s it is sent on to every rank (`kill` of mpiexec), or '
            'a batch scheduler or `kill` signalled the ranks; %s (exit status %d)'
            % (rank_list(range(size)), size, name, passed, how, status)), status
