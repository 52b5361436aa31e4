"""Exit statuses and the error classes that decide them.

Exit status (the same from ``theanompi-ext train`` and from each rank):

=== ======================================================================
0   :data:`EXIT_OK`: success
1   :data:`EXIT_CHECK_FAILED`: a check ran and did not pass (``check-equivalence``
    FAIL), or a benchmark setting could not run (``bench overlap``, ``compare``,
    ``allreduce``, ``validate``: the message names the setting)
2   :data:`EXIT_BAD_INPUT`: bad input: options or config file (refused before
    launch), a data file (missing, corrupt, wrong shapes/dtypes/labels), a
    checkpoint that does not fit, ranks given different models, data or options;
    also an output folder in use or holding another run, an output path that
    cannot be written, a corrupt checkpoint or one resumed with other options,
    a compile cache that cannot be used (``$THEANOMPI_EXT_CACHE``)
3   :data:`EXIT_FAILED`: training failed: an exception on a rank (the message
    names it), a non-finite loss, replicas that diverged, a rank that ended
    without finishing while the launcher reported success; also a file that
    cannot be written (:class:`WriteError`), a state that is not finite when it
    would be saved (:class:`DivergedState`); ``trials``: a trial failed; a
    command other than ``train``, ``trials``, ``convert`` whose standard output
    cannot be written (a full disk, ``output_faults.py``)
4   :data:`EXIT_TIMEOUT`: a wait in a step's collective exceeded
    ``collective_timeout_s`` (the message names the ranks that had not
    arrived); also a checkpoint or final-output write longer than
    ``write_timeout_s``
75  :data:`EXIT_RESUMABLE`: every rank stopped after the checkpoint a signal asked
    for (``--checkpoint-signal``, ``--on-checkpoint-signal stop``): resume it with
    ``--resume`` (sysexits' EX_TEMPFAIL: try again later)
124 :data:`EXIT_TIMED_OUT`: a job that its launcher stopped after a time limit
    (``check-equivalence --timeout``, ``trials --run-timeout``, benchmarks), as
    ``timeout(1)`` reports it
N   ``mpiexec``'s own status when a rank was killed by a signal (9 for SIGKILL
    and the OOM killer, 11 for a segfault); the launcher names the rank (Open
    MPI's mpiexec exits 128 + N: the launcher exits N, ``launch/postmortem.py``)
1xx :data:`EXIT_SIGNAL_BASE` + the signal's number: the launcher was stopped
    (130 SIGINT, 143 SIGTERM, 129 SIGHUP; every rank has ended,
    ``launch/postmortem.py``), or (143, 130) every rank was sent SIGTERM or
    SIGINT from outside it, e.g. by mpiexec signalled alone
    (``launch/signal_marks.py``); 141 from any command whose output's reader
    has gone, a broken pipe (``output_faults.py``)
=== ======================================================================

Two marks, each said one way:

* bad input (exit status 2): the class derives from :class:`BadInput`
  (a ``ValueError``); :func:`exit_status` maps it.
* raised on all ranks: the class derives from :class:`AllRanks`; such an error
  is found by every rank at the same point (after a collective), so the ranks
  may end normally instead of aborting the job (:func:`raised_on_all_ranks`,
  confirmed by ``train/faults.failed_together``, and said once by rank 0).

Nothing here imports anything of the package: every layer may import it.
"""
import signal

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_FAILED = 3
EXIT_TIMEOUT = 4
EXIT_RESUMABLE = 75
EXIT_TIMED_OUT = 124
EXIT_SIGNAL_BASE = 128


class BadInput(ValueError):
    """Bad input (exit status 2): the message names what was wrong."""


class AllRanks(Exception):
    """Mark of an error that every rank raises at the same point."""


def exit_status(exc):
    """The exit status for an exception that ended a rank (see the module docstring):
    130 for a Ctrl-C (``KeyboardInterrupt``: SIGINT), as the launcher's."""
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_SIGNAL_BASE + signal.SIGINT
    if isinstance(exc, StoppedToResume):
        return EXIT_RESUMABLE
    return EXIT_BAD_INPUT if isinstance(exc, BadInput) else EXIT_FAILED


def raised_on_all_ranks(exc):
    """True when ``exc`` is marked as raised on every rank (:class:`AllRanks`)."""
    return isinstance(exc, AllRanks)


# -- training (train/, theanompi_compat/) ------------------------------------------

class NonFiniteLoss(AllRanks, FloatingPointError):
    """The summed loss became NaN or infinite, or a rank's gradient did; training
    stopped before the update (on every rank). The one error of a non-finite
    step, whichever face runs it (``theanompi_ext.step.run``)."""


#: The name the Theano-MPI stepper raised before the step was written once.
NonFiniteStep = NonFiniteLoss


class RankMismatchError(AllRanks, BadInput):
    """Ranks disagree on the model or the exchange plan (raised on every rank)."""


class ReplicaMismatch(AllRanks, RuntimeError):
    """Exchanged parameters differ between ranks (raised on every rank)."""


class StoppedToResume(AllRanks, Exception):
    """Every rank stopped, as asked, after the checkpoint a signal asked for
    (exit status 75); ``signum`` and ``iteration`` say which and where."""

    def __init__(self, signum, iteration, path, how='--resume'):
        self.signum, self.iteration, self.path = signum, iteration, path
        Exception.__init__(self, 'stopped by %s after the checkpoint of iteration %d (%s): '
                           'continue with %s' % (signal.Signals(signum).name,
                                                 iteration, path, how))


class CheckpointError(AllRanks, BadInput):
    """A checkpoint that cannot be used, with the file and the reason."""


class DivergedState(AllRanks, FloatingPointError):
    """The state to be saved holds NaN or infinity (found on every rank; exit status 3)."""


class OutputFolderError(BadInput):
    """An output path that cannot be used, or a folder in use (exit status 2)."""


class NotInstallable(RuntimeError):
    """Why :func:`install_into_theanompi` could not install (its message says)."""


# -- data and files ----------------------------------------------------------------

class DataError(BadInput):
    """A data file (or the data given to a writer) is missing or malformed."""


class CorruptFile(BadInput):
    """A sealed file whose checksum or length does not match (bad input, exit 2)."""


class WriteError(OSError):
    """A file could not be written; the message names the path and the cause.

    Nothing was replaced: the previous version of the file (if any) is intact
    and no temporary file is left. Exit status 3.
    """

    def __init__(self, err, message):
        super(WriteError, self).__init__(message)
        self.errno = err


# -- devices and the collective layer ----------------------------------------------

class DeviceError(BadInput):
    """A device string that is malformed, or a device that cannot be opened (exit 2)."""


class DeviceErrorOnRanks(AllRanks, DeviceError):
    """A device failed on some ranks; every rank raises this (after agreeing)."""


class CompilerProbeFailed(RuntimeError):
    """Theano's import found no C++ compiler although one is on PATH (its probe
    ``g++ -v`` failed): this process would run Theano's Python implementations,
    slower and with other roundings than the ranks that found it (exit status 3)."""


class WireOverflow(ArithmeticError):
    """An exchanged bucket holds inf or nan after a 16-bit wire cast."""


class NCCLUnavailable(RuntimeError):
    """NCCL cannot be used here: library missing, no CUDA device, no CuPy..."""


#: ncclResult_t names, for :class:`NCCLError`'s message.
NCCL_RESULT_NAMES = {
    0: 'ncclSuccess', 1: 'ncclUnhandledCudaError', 2: 'ncclSystemError',
    3: 'ncclInternalError', 4: 'ncclInvalidArgument', 5: 'ncclInvalidUsage',
    6: 'ncclRemoteError', 7: 'ncclInProgress',
}


class NCCLError(RuntimeError):
    """A NCCL call returned an error code; ``code`` holds the ncclResult_t."""

    def __init__(self, func, code, message):
        self.func = func
        self.code = code
        RuntimeError.__init__(self, '%s failed: %s (%s)' % (
            func, message, NCCL_RESULT_NAMES.get(code, 'ncclResult %d' % code)))


# -- options and the exchange (exchange/, collective/) ------------------------------

class ModeError(BadInput):
    """A refused ``sync_type`` / ``exch_strategy`` / ``wire_dtype`` value or combination.

    ``option``, ``value`` and ``why`` let an entry point name the option its
    own way (:meth:`named`); the message is ``invalid option NAME=VALUE: WHY``.
    """

    def __init__(self, option, value, why):
        self.option, self.value, self.why = option, value, why
        BadInput.__init__(self, self.named(option))

    def named(self, name):
        """The message with the option spelled ``name`` (e.g. a session file's key)."""
        return 'invalid option %s=%r: %s' % (name, self.value, self.why)


class IncompleteExchange(RuntimeError):
    """``finish`` came before every bucket of the plan was started."""


class BackendRefused(AllRanks, BadInput):
    """A backend name this job cannot use (every rank refuses it alike: bad input)."""


class CollectiveTimeout(TimeoutError):
    """A bounded collective or handle wait ran out of time (the message names it)."""
