"""Stop signals (SIGINT, SIGTERM, SIGHUP) caught only where they are not ignored.

A stop signal ignored when we come to catch it stays ignored: that is what
whoever started us asked for. ``nohup`` ignores SIGHUP so that a training
outlives the terminal's hangup; a shell without job control starts ``cmd &``
with SIGINT ignored, so that a Ctrl-C meant for the foreground does not
reach it. Python keeps an inherited SIG_IGN of SIGINT for the same reason,
and a POSIX shell cannot trap a signal that was ignored on entry. Every
handler of ours for these signals is installed through :func:`catch`.
"""
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


def after_set(sig, install):
    """Call ``install()`` after each handler :func:`catch` and :func:`restore` set
    for ``sig`` (``None``: no longer): a handler of C code that runs before the
    one set, chained to it, which ``signal.signal`` replaces and Python cannot
    name (a rank's :mod:`faulthandler` mark of SIGTERM, SIGINT or SIGQUIT,
    ``launch/signal_marks.py``)."""
    if install is None:
        _after_set.pop(sig, None)
    else:
        _after_set[sig] = install


#: Set by :func:`after_set`.
_after_set = {}


def _set(sig, handler):
    old = signal.signal(sig, handler)
    if sig in _after_set:
        _after_set[sig]()
    return old


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
