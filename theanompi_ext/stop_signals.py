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
            old[sig] = signal.signal(sig, handler)
    return old


def restore(old):
    """Put back the handlers :func:`catch` returned (``None``, a handler that was
    not set from Python, becomes ``SIG_DFL``)."""
    for sig, handler in old.items():
        signal.signal(sig, signal.SIG_DFL if handler is None else handler)
