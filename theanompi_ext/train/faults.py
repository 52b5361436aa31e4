"""Per-rank fault handling: the notes the launcher reads, the ranks' agreement.

Exit statuses and the error classes: :mod:`theanompi_ext.errors`.

Rank notes (``launch/rank_notes.py``): each rank records ``running``, ``done 0``
or ``failed N`` for the launcher.
"""
import collections
import os
import sys
import threading

from .. import stop_signals
from ..errors import RankMismatchError, raised_on_all_ranks
from ..launch.rank_notes import RANKS_DIR_VAR, write_rank_note, write_rank_why


def stop_with_parent():
    """A rank ends when its parent (hydra's proxy, or the launcher) is gone.

    SIGTERM: the default action ends the rank at once, except inside a file
    write, which finishes first (``files.signals.deferred_signals``).
    """
    import signal
    from ..launch.mpiexec import in_mpi_job, set_parent_death_signal
    if in_mpi_job():       # the parent is hydra's proxy (or another MPI's daemon)
        set_parent_death_signal(signal.SIGTERM)


def note_rank(state, rank=None):
    """Record this rank's state for the launcher (no-op unless it asked for notes).

    From the first note on, an abort of the job by this rank (the watchdog's,
    which is no exception of the training code) also leaves ``failed N``: the
    launcher then names this rank as the one that ended the job.
    """
    folder = os.environ.get(RANKS_DIR_VAR)
    if not folder:
        return
    if rank is None:
        from ..collective.world import world_comm
        rank = world_comm().Get_rank()
    write_rank_note(folder, rank, state)
    from ..collective.abort_alone import before_abort
    before_abort(_AbortNote(folder, rank))


def mark_stop_signal(rank):
    """A SIGTERM, SIGINT or SIGQUIT that reaches this rank leaves a mark for the
    launcher as it comes (:mod:`theanompi_ext.launch.signal_marks`): every rank
    marked is a signal to the job from outside the launcher, not one rank's
    death. No-op unless the launcher asked for notes."""
    folder = os.environ.get(RANKS_DIR_VAR)
    if folder:
        from ..launch.signal_marks import mark_signal
        mark_signal(folder, rank)


def sweep_shared_memory():
    """The first rank of each host removes the shared-memory files that killed
    jobs of this user left there (:mod:`theanompi_ext.launch.mpi_leftovers`:
    the launcher sweeps its own host when its job ends, but cannot reach the
    other hosts). Returns the names removed."""
    from ..collective.world import local_rank
    from ..launch.mpi_leftovers import sweep_at_rank_start
    return sweep_at_rank_start(local_rank())


def keep_rank(comm):
    """On a host other than the launcher's, start this rank's keeper, which notes
    ``died`` if the rank goes without a note of its own and ends its MPI daemon
    if that is left waiting (:mod:`theanompi_ext.launch.rank_keeper`): a death
    that mpiexec, cut off from this host, cannot pass on. No-op without notes,
    for one rank, or on the launcher's host."""
    folder = os.environ.get(RANKS_DIR_VAR)
    if not folder or comm.size == 1:
        return None
    from ..launch.after_ranks import finalize_alone_s
    from ..launch.rank_keeper import far_from_launcher, start_keeper
    if not far_from_launcher():
        return None
    return start_keeper(folder, comm.rank, finalize_alone_s())


class _AbortNote(object):
    """``failed N`` in rank ``rank``'s note when it aborts with N, and beside it the
    rank's own line on why, when it said one (equal per rank and folder, so that
    it is registered once)."""

    def __init__(self, folder, rank):
        self.key = (folder, rank)

    def __eq__(self, other):
        return isinstance(other, _AbortNote) and other.key == self.key

    def __hash__(self):
        return hash(self.key)

    def __call__(self, code):
        from ..collective.abort_alone import reason
        line = reason()
        if line:
            write_rank_why(self.key[0], self.key[1], line)
        write_rank_note(self.key[0], self.key[1], 'failed %d' % code)


# Options a rank may set on its own: they change no collective. ``data`` may be
# a node-local copy and ``extra`` holds loader/model keywords; what matters of
# them (the data sizes, the model) is compared directly.
_PER_RANK_OPTIONS = ('quiet', 'timeline', 'collective_timeout_s', 'stall_warn_s', 'data',
                     'extra', 'write_timeout_s', 'overwrite')


def run_signature(trainer):
    """What every rank must agree on beyond the model: data sizes and the options
    that decide which collectives run when (steps per epoch, checks, checkpoints)."""
    opts = trainer.cfg.to_dict()
    for name in _PER_RANK_OPTIONS:
        opts.pop(name, None)
    opts['out'] = bool(opts.get('out'))     # whether checkpoints are gathered, not where
    data = trainer.data
    return dict(opts, n_train=int(len(data.y_train)), n_val=int(len(data.y_val)),
                n_classes=int(data.n_classes), iters_per_epoch=int(trainer.iters_per_epoch),
                iteration=int(trainer.iteration))


def check_ranks_agree(trainer):
    """Refuse to train unless every rank has the same data sizes and run options.

    Ranks that disagree would run different numbers of steps or different
    collectives and wait for each other forever; instead every rank raises
    the same RankMismatchError (exit status 2) before the first step.
    """
    sigs = trainer.comm.allgather(run_signature(trainer))
    ref = sigs[0]
    diffs = []
    for r, sig in enumerate(sigs[1:], 1):
        for key in sorted(set(ref) | set(sig)):
            if ref.get(key) != sig.get(key):
                diffs.append('rank %d has %s=%r, rank 0 has %r' % (r, key, sig.get(key),
                                                                   ref.get(key)))
    if diffs:
        raise RankMismatchError('ranks disagree on the data or on options that decide which '
                                'collectives run (they would wait for each other forever): '
                                + '; '.join(diffs[:8])
                                + ('; ...' if len(diffs) > 8 else ''))


# The job's communicator for the agreement below and for ending the job; its
# bounded barrier runs on a communicator of its own (collective/base.py): the
# other ranks may be inside any collective of the training communicator when
# this rank fails.
_world = None
#: How long a rank that failed with an error all ranks should raise waits for the others.
AGREE_TIMEOUT_S = 10.0
#: How long such a rank waits for that agreement before it says its own line
#: anyway: a rank that failed otherwise aborts the job 0.5 s after its line
#: (``worker.guarded``), and this rank's line must be out before then.
SAY_ALONE_S = 0.25


def prepare_agreement():
    """Set up :func:`failed_together` (collective: every rank at start-up, in
    ``worker.guarded``); returns the job's communicator (``rank``, ``size``,
    ``abort``)."""
    global _world
    if _world is None:
        from ..collective import create_communicator
        _world = create_communicator('auto')
    return _world


def bound_the_end(comm):
    """This rank has ended its part (its note says how): it and its MPI daemon end
    within a bound even when MPI_Finalize cannot reach the launcher
    (:func:`~theanompi_ext.collective.abort_alone.watch_finalize`)."""
    if comm.size == 1:
        return
    from ..collective.abort_alone import watch_finalize
    from ..launch.after_ranks import finalize_alone_s
    watch_finalize(finalize_alone_s())


def check_same_software(comm):
    """Refuse a job whose ranks run different software (collective, the job's first
    exchange: :mod:`theanompi_ext.launch.same_software`)."""
    if comm.size == 1:
        return
    from ..collective.mpi import library_version
    from ..launch.same_software import check_same_software as check
    check(comm, library_version())


def say_failure(comm, exc, where=None):
    """Say on standard error how this rank failed: ``rank R of N failed: Type:
    message [at where]``, or, when every rank failed alike (an error marked
    :class:`~theanompi_ext.errors.AllRanks`, confirmed by
    :func:`failed_together`), rank 0's report for all (:func:`said_once`), so
    that 256 ranks do not print 256 copies of one line.

    Returns True when this rank may end normally (one rank, or all failed
    together), False when it must abort the job. A rank still waiting for the
    agreement after :data:`SAY_ALONE_S` says its own line anyway (another rank
    may be about to abort the job), and once only.
    """
    text = '%s: %s%s' % (type(exc).__name__, exc, ' [at %s]' % where if where else '')
    own = _OwnLine('theanompi-ext: rank %d of %d failed: %s' % (comm.rank, comm.size, text))
    if comm.size == 1 or not raised_on_all_ranks(exc):
        own.say()
        return comm.size == 1
    timer = threading.Timer(SAY_ALONE_S, own.say)
    timer.daemon = True
    stop_signals.start_thread(timer)
    try:
        lines = failed_together(exc, text)
    finally:
        timer.cancel()
    if lines is None:
        own.say()
        return False
    if comm.rank == 0:
        for line in said_once(lines, comm.size):
            _say(line)
    return True


class _OwnLine(object):
    """A rank's own failure line, said at most once (by the timer or the rank)."""

    def __init__(self, line):
        self.line, self._lock, self._said = line, threading.Lock(), False

    def say(self):
        with self._lock:
            if not self._said:
                self._said = True
                from ..collective.abort_alone import say_reason
                say_reason(self.line)
                _say(self.line)


def _say(line):
    sys.stderr.write(line + '\n')
    sys.stderr.flush()


def failed_together(exc, line, timeout_s=None):
    """Every rank's failure ``line`` (in rank order) when every rank stopped with
    an error marked :class:`~theanompi_ext.errors.AllRanks`, so that each can end
    normally and rank 0 can say it once (:func:`said_once`); None means this
    rank must abort the job.

    An error is marked so when every rank finds it at the same point (after a
    collective: a non-finite loss, diverged replicas, ranks that disagree). A
    checkpoint that only some ranks cannot read is marked so too; trusting the
    mark would leave the other ranks waiting forever, so the ranks confirm it by
    gathering their lines, bounded by ``timeout_s``.
    """
    if not raised_on_all_ranks(exc):
        return None
    if _world is None or _world.size == 1:
        return [line]   # one rank, or guarded() was bypassed: trust the mark
    try:
        return _world.allgather_bounded(
            line, AGREE_TIMEOUT_S if timeout_s is None else timeout_s,
            label='agreement that every rank stopped with %s' % type(exc).__name__)
    except Exception:       # noqa: B902 - a timeout, or MPI's error (a peer gone): no
        return None         # agreement, and this rank must still end the job


def said_once(lines, size):
    """What rank 0 says for ranks that failed together with ``lines`` (each rank's
    ``Type: message``, :func:`failed_together`): one line when every rank says
    the same (``all 64 ranks failed: ...``), else one line per different text,
    naming its ranks (``ranks 0-31 of 64 failed: ...``), instead of a line from
    each rank."""
    from ..launch.rank_notes import rank_list
    texts = collections.OrderedDict()
    for rank, text in enumerate(lines):
        texts.setdefault(text, []).append(rank)
    if len(texts) == 1:
        return ['theanompi-ext: all %d ranks failed: %s' % (size, lines[0])]
    return ['theanompi-ext: rank%s %s of %d failed: %s'
            % ('s' if len(ranks) > 1 else '', rank_list(ranks), size, text)
            for text, ranks in texts.items()]
