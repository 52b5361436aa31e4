"""A checkpoint asked for by a signal (``--checkpoint-signal USR1``).

Batch schedulers warn a job before they end it: SLURM's
``#SBATCH --signal=B:USR1@120`` sends SIGUSR1 two minutes before the time
limit, LSF's warning action a signal of the user's choice. A job that then
writes a checkpoint at once loses nothing but those minutes, whatever its
``--checkpoint-every``.

Each rank holds the signal back (:func:`install`) and only notes it; the
trainer's per-step agreement ORs every rank's note (:func:`taken`), so all
ranks write the same iteration's checkpoint whichever of them the signal
reached (the launcher forwards it through mpiexec, which hands it to every
rank; a scheduler may send it to every rank itself).

Held back, not only caught: mpiexec (MPICH's hydra and Open MPI's, both
measured) sends it to each rank's whole process group, and so does a
scheduler that signals every process of a job. A rank's children (Theano's ``g++ -v`` probe at import,
its compiles) do not inherit a Python handler, so a caught signal killed
them: the probe's death left one rank without C implementations (other
numerics, silently; seen as a resumed run that differed in the last bits).
A blocked signal is inherited blocked, so they never see it; the rank reads
it from its pending set at the next step. After the checkpoint
the run goes on, or, with ``--on-checkpoint-signal stop``, every rank ends
with :data:`~theanompi_ext.errors.EXIT_RESUMABLE` (75), so that a batch
script can requeue the job with ``--resume``.
"""
import json
import signal
import time

#: The signals that may ask for a checkpoint. The stop signals (INT, TERM,
#: HUP) already end a run; KILL and STOP cannot be caught; the rest have a
#: meaning of their own (a fault, a terminal, a child) that we must not take.
SIGNALS = ('USR1', 'USR2')

#: What a run does after the checkpoint a signal asked for.
THEN = ('continue', 'stop')

#: Seconds after the checkpoint a signal asked for in which the signal again is
#: the same request: a scheduler may warn the ranks and the launcher at once, and
#: the launcher's copy reaches each rank through mpiexec a little later (ms). One
#: that came while that checkpoint was written is the same request too. Without
#: this, a copy taken one step later wrote a second checkpoint (a write may take
#: minutes, in the minutes a warning leaves).
SAME_REQUEST_S = 2.0


def canonical_name(name):
    """``'USR1'`` for ``usr1``, ``SIGUSR1`` or ``10``; ValueError naming the choices
    for anything else (``''`` stays ``''``: no signal)."""
    text = str(name).strip().upper()
    if text == '':
        return ''
    if text.isdigit():
        try:
            text = signal.Signals(int(text)).name
        except ValueError:
            pass
    if text.startswith('SIG'):
        text = text[3:]
    if text not in SIGNALS:
        raise ValueError('%r cannot ask for a checkpoint: choose from %s (SIGINT, SIGTERM and '
                         'SIGHUP stop a run; SIGKILL and SIGSTOP cannot be caught)'
                         % (name, ', '.join(SIGNALS)))
    return text


def number(name):
    """The signal number of a :func:`canonical_name` (``'USR1'`` -> 10)."""
    return signal.Signals['SIG' + canonical_name(name)]


class _Notes(object):
    """The signals this process received since the last :func:`taken`, and when
    (monotonic) the last checkpoint a signal asked for was written."""
    signum = None
    answered_at = None


_notes = _Notes()
_held = set()      # the signals install() blocks in this process


def _note(signum, frame):
    # A handler only notes: the step in progress may be inside a collective.
    _notes.signum = signum


def install(name):
    """Catch and hold back the signal ``name`` in this process from now on (main
    thread only): it stays pending until :func:`taken` reads it, and the
    processes this one starts inherit it blocked (they must not die of it).
    The handler stays as well, for a thread started before (one that does not
    block it may be the one the signal is delivered to).

    Installed even where the signal was ignored when we started: the option
    asks for it by name. Call it as early as the process can (before it, the
    signal would kill it) and again once MPI has started. MPICH's MPI_Init
    puts a SIGUSR1 handler of its own in front (in libmpi, for hydra's notice
    of a failed process, which our jobs do not use: hydra ends them instead).
    That handler passes the signal on to the one installed before it, so one
    that comes during MPI_Init still reaches us, but where nothing was
    installed before MPI started it keeps the signal to itself. Open MPI 5
    leaves SIGUSR1 alone. Both mpiexecs pass SIGUSR1/2 on to every rank.
    (Blocked, the signal reaches neither handler: it waits to be taken.)
    """
    signum = number(name)
    signal.signal(signum, _note)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signum})
    _held.add(signum)


def install_for_json(text):
    """:func:`install` the ``checkpoint_signal`` of a config given as JSON text
    (a rank's environment, before the config module and numpy are imported);
    anything missing or not valid is left to the config's validation."""
    try:
        name = json.loads(text or '{}').get('checkpoint_signal') or ''
        if canonical_name(name):
            install(name)
    except (ValueError, AttributeError, TypeError):
        pass


def install_for(cfg):
    """:func:`install` ``cfg.checkpoint_signal`` where one is named (a name that is
    not valid is left to ``cfg.validate()`` to report)."""
    install_for_name(cfg.checkpoint_signal)


def install_for_name(name):
    """:func:`install` the signal ``name`` where one is named (``''``/None: none;
    a name that is not valid is left to the option's own check to report)."""
    try:
        if canonical_name(name or ''):
            install(name)
    except ValueError:
        pass


def taken():
    """The number of the signal received since the last call (None: none), cleared."""
    signum, _notes.signum = _notes.signum, None
    # pending means blocked (the launcher's ForwardedSignal unblocks it to pass it on)
    for held in sorted(_held & signal.sigpending()) if _held else ():
        _clear_pending(held)
        signum = signum or signal.Signals(held)
    return signum


def vote(comm, iteration, timeout_s, clock_due=False):
    """Every rank: ``(a signal asked, the clock ran out)``, the same on every rank.

    Each rank's :func:`taken` note (none within :data:`SAME_REQUEST_S` of the
    last checkpoint a signal asked for: the same request) and ``clock_due``
    (rank 0's checkpoint clock, or False) are summed in one two-float
    allreduce, so the signal reaching one rank is enough. The wait is bounded as a step's is
    (``timeout_s``): a rank stopped here must not hang the others."""
    import numpy as np
    votes = np.zeros(2, np.float32)
    votes[0] = 1 if taken() and not _just_answered() else 0
    votes[1] = 1 if clock_due else 0
    with comm.bounded(iteration, 'checkpoint clock and signal', timeout_s,
                      'collective_timeout_s'):
        comm.allreduce(votes)
    return bool(votes[0]), bool(votes[1])


def after_checkpoint(signum, then, iteration, path, finished, log, how='--resume'):
    """After the checkpoint of ``iteration`` (at ``path``) that signal ``signum``
    asked for: with ``then == 'stop'`` every rank ends here
    (:class:`~theanompi_ext.errors.StoppedToResume`, 75; ``how``: how to
    resume), unless the run is ``finished`` (nothing would be left to resume);
    otherwise rank 0's ``log`` says so and training goes on."""
    if then == 'stop' and not finished:
        from ..errors import StoppedToResume
        raise StoppedToResume(signum, iteration, path, how)
    taken()             # what came while it was written asked for this checkpoint
    _notes.answered_at = time.monotonic()
    log('checkpoint of iteration %d written, as %s asked (%s)%s'
        % (iteration, signal.Signals(signum).name, path,
           '' if finished else '; training goes on'))


def _just_answered():
    """Whether a signal taken now is the one the last checkpoint answered
    (:data:`SAME_REQUEST_S`)."""
    return _notes.answered_at is not None and \
        time.monotonic() - _notes.answered_at < SAME_REQUEST_S


def _clear_pending(signum):
    """Take the pending ``signum`` (it is pending: neither call waits)."""
    if hasattr(signal, 'sigtimedwait'):      # Linux
        signal.sigtimedwait({signum}, 0)
    else:                                    # macOS has no sigtimedwait
        signal.sigwait({signum})


