"""Exit statuses of a training run and the per-rank notes the launcher reads.

Exit status (the same from ``theanompi-ext train`` and from each rank):

== =====================================================================
0  success
2  bad input: options or config file (refused before launch), a data
   file (missing, corrupt, wrong shapes/dtypes/labels), a checkpoint that
   does not fit, ranks given different models
3  training failed: an exception on a rank (the message names it), a
   non-finite loss, replicas that diverged, or a rank that ended without
   finishing while the launcher reported success
4  a wait in a step's collective exceeded ``collective_timeout_s`` (the
   message names the ranks that had not arrived)
N  ``mpiexec``'s own status when a rank was killed by a signal (9 for
   SIGKILL and the OOM killer, 11 for a segfault); the launcher names the
   rank
1xx the launcher was stopped: 130 SIGINT, 143 SIGTERM, 129 SIGHUP (128 +
   the signal's number; every rank has ended, ``launch/postmortem.py``)
== =====================================================================

Also 2: an output folder in use or holding another run, an output path that
cannot be written, a corrupt checkpoint or one resumed with other options;
3: a file that cannot be written (``atomic.WriteError``), a state that is not
finite when it would be saved (``checkpoint.DivergedState``); 4: also a
checkpoint or final-output write longer than ``write_timeout_s``.

Rank notes: when ``THEANOMPI_EXT_RANKS_DIR`` is set (``theanompi-ext train``
sets it when it starts mpiexec), every rank writes ``rank<R>`` there:
``<pid> <host> <state>`` with state ``running``, ``done 0`` or ``failed N``.
The launcher maps the PID that mpiexec reports for a killed process back to
its rank, and notices ranks that vanished without finishing.
"""
import os
import socket

EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_FAILED = 3
EXIT_TIMEOUT = 4            # == collective.watchdog.EXIT_STATUS

RANKS_DIR_VAR = 'THEANOMPI_EXT_RANKS_DIR'


class NonFiniteLoss(FloatingPointError):
    """The summed loss became NaN or infinite; training stopped (on every rank)."""
    all_ranks = True


class RankMismatchError(ValueError):
    """Ranks disagree on the model, the exchange plan or the run options (raised on
    every rank; exit status 2)."""
    all_ranks = True


def bad_input_types():
    """Exception types that mean "bad input" (exit status 2)."""
    from ..data.hdf5 import DataError
    from .checkpoint import CheckpointError
    from .outdir import OutputFolderError
    return (DataError, CheckpointError, RankMismatchError, OutputFolderError)


def exit_status(exc):
    """The exit status for an exception that ended a rank (see the module docstring)."""
    if getattr(exc, 'bad_input', False) or isinstance(exc, bad_input_types()):
        return EXIT_BAD_INPUT
    return EXIT_FAILED


def stop_with_parent():
    """A rank ends when its parent (hydra's proxy, or the launcher) is gone.

    SIGTERM: the default action ends the rank at once, except inside a file
    write, which finishes first (``atomic.deferred_signals``).
    """
    import signal
    from ..launch.mpiexec import in_mpi_job, set_parent_death_signal
    if in_mpi_job():       # the parent is hydra's proxy (or another MPI's daemon)
        set_parent_death_signal(signal.SIGTERM)


def note_rank(state, rank=None):
    """Record this rank's state for the launcher (no-op unless it asked for notes)."""
    folder = os.environ.get(RANKS_DIR_VAR)
    if not folder:
        return
    if rank is None:
        from ..collective.world import world_comm
        rank = world_comm().Get_rank()
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


def prepare_agreement():
    """Set up :func:`stopped_together` (collective: every rank at start-up, in
    ``worker.guarded``); returns the job's communicator (``rank``, ``size``,
    ``abort``)."""
    global _world
    if _world is None:
        from ..collective import create_communicator
        _world = create_communicator('auto')
    return _world


def stopped_together(exc, timeout_s=None):
    """True when every rank stopped with an error marked ``all_ranks`` (so each
    can end normally); False means this rank must abort the job.

    An error is marked ``all_ranks`` when every rank finds it at the same
    point (after a collective: a non-finite loss, diverged replicas, ranks that
    disagree). A checkpoint that only some ranks cannot read is marked so too;
    trusting the mark would leave the other ranks waiting forever, so the ranks
    confirm it with a barrier of their own, bounded by ``timeout_s``.
    """
    if not getattr(exc, 'all_ranks', False):
        return False
    if _world is None or _world.size == 1:
        return True     # one rank, or guarded() was bypassed: trust the mark
    from ..collective import CollectiveTimeout
    try:
        _world.barrier(timeout_s=AGREE_TIMEOUT_S if timeout_s is None else timeout_s,
                       label='agreement that every rank stopped with %s'
                       % type(exc).__name__)
    except CollectiveTimeout:
        return False
    return True
