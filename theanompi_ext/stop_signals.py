"""Stop signals (SIGINT, SIGTERM, SIGHUP) caught only where they are not ignored.

A stop signal ignored when we come to catch it stays ignored: that is what
whoever started us asked for. ``nohup`` ignores SIGHUP so that a training
outlives the terminal's hangup; a shell without job control starts ``cmd &``
with SIGINT ignored, so that a Ctrl-C meant for the foreground does not
reach it. Python keeps an inherited SIG_IGN of SIGINT for the same reason,
and a POSIX shell cannot trap a signal that was ignored on entry. Every
handler of ours for these signals is installed through :func:`catch`.
"""
import contextlib
import signal

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def ignored(sig):
    """True when ``sig`` is ignored in this process now (``SIG_IGN``)."""
    return signal.getsignal(sig) == signal.SIG_IGN


def catch(handlers):
    """Install each ``{signal: handler}`` whose signal is not ignored now.

    Returns the previous handlers of those installed, for :func:`restore`;
    an ignored signal is left ignored and is not in the result. Main thread
    only (Python's rule for ``signal.signal``).
    """
    old = {}
    for sig, handler in handlers.items():
        if not ignored(sig):
            old[sig] = _set(sig, handler)
    return old


def restore(old):
    """Put back the handlers :func:`catch` (or :func:`hold`) returned (``None``, a
    handler that was not set from Python, becomes ``SIG_DFL``); the stop signals
    stay ignored once :func:`begin_stop` was called."""
    for sig, handler in old.items():
        if _stop_begun and sig in STOP_SIGNALS:
            continue
        _set(sig, signal.SIG_DFL if handler is None else handler)


def set_through(sig, setter):
    """Have :func:`catch` and :func:`restore` set each handler of ``sig`` through
    ``setter(sig, handler)`` (which returns the previous handler, as
    ``signal.signal`` does) instead of ``signal.signal`` (``None``: no longer). For
    a handler of C code that runs before the one set, chained to it, which
    ``signal.signal`` replaces and Python cannot name: a rank's
    :mod:`faulthandler` mark of SIGTERM, SIGINT or SIGQUIT
    (``launch/signal_marks.py``), which must come off and go back on around the
    swap in an order that never leaves a stale handler in place."""
    if setter is None:
        _setters.pop(sig, None)
    else:
        _setters[sig] = setter


#: Set by :func:`set_through`.
_setters = {}


def _set(sig, handler):
    return _setters.get(sig, signal.signal)(sig, handler)


#: The signals a thread other than the main one leaves to it (:func:`start_thread`):
#: SIGINT, whose handler is Python's and runs in the main thread anyway. Not
#: SIGTERM or SIGQUIT: their default action ends a rank in whichever thread takes
#: them first, and left to the main thread alone, under load (2 ranks and a busy
#: process on 2 cores), a rank was SIGKILLed by mpiexec, its peer dead of the
#: SIGQUIT, before its main thread ran to mark it: 3 runs in 6, against 0 in 6.
LEFT_TO_MAIN = (signal.SIGINT,)


def start_thread(thread):
    """``thread.start()``, the new thread blocking :data:`LEFT_TO_MAIN` for good,
    first thing: the kernel then gives a SIGINT sent to the process to the main
    thread, where Python runs its handler anyway. So the main thread may hold it
    back for a moment (``launch/signal_marks.py``, while it swaps a handler)
    without another thread taking it meanwhile. For every thread of a rank."""
    run = thread.run

    def run_blocked():
        # in the new thread: the main one does not hold the signal while it waits
        # for the thread to start
        signal.pthread_sigmask(signal.SIG_BLOCK, LEFT_TO_MAIN)
        run()
    thread.run = run_blocked
    thread.start()
    return thread


def held_back(signals=STOP_SIGNALS + (signal.SIGQUIT,)):
    """Context: the calling thread holds ``signals`` back meanwhile (blocked): one
    sent meanwhile comes after. For a moment only (a signal must not wait)."""
    return _masked(signal.SIG_BLOCK, signals)


def for_children():
    """Context, around starting a process from a thread that :func:`start_thread`
    started (a watchdog's abort starts a watcher): the thread unblocks
    :data:`LEFT_TO_MAIN` meanwhile, since a new process keeps its creator's mask
    (through ``exec`` too) and would otherwise ignore a SIGINT (Ctrl-C) until it
    ended by itself."""
    return _masked(signal.SIG_UNBLOCK, LEFT_TO_MAIN)


@contextlib.contextmanager
def _masked(how, signals):
    old = signal.pthread_sigmask(how, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def hold():
    """Ignore every stop signal not ignored now (main thread); the previous
    handlers, for :func:`restore`. A stop under way must not be cut short by a
    second signal: Ctrl-C twice, or a scheduler's SIGTERM to every process of a
    job beside the one passed on. Raised inside a handler, the second one broke
    the first's work (a ``KeyError`` from ``threading``'s own bookkeeping instead
    of the stop, once in 7 runs of a Theano-MPI session signalled so)."""
    return catch({sig: signal.SIG_IGN for sig in STOP_SIGNALS})


def begin_stop():
    """This process is stopping, for good: :func:`hold`, and the stop signals stay
    ignored until it ends (:func:`restore` leaves them so); returns :func:`hold`'s
    result. Call it first thing in a stop's handler. Before, a launcher put its
    handlers back once its job was stopped, and a later copy of the signal (a
    burst of SIGTERMs) then killed it by the default action after its last line
    (status -15 for 143, its clean-up cut short: 6 runs in 6) or raised
    KeyboardInterrupt where nothing caught it."""
    _stop_begun.append(True)
    return hold()


#: Set by :func:`begin_stop`.
_stop_begun = []
