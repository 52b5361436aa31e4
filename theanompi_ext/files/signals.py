"""Stop signals held while a file is written (:func:`deferred_signals`).

SIGTERM/SIGHUP/SIGINT arriving while a file is written wait until it is
renamed into place (then act as usual).
"""
import contextlib
import os
import signal
import threading

_DEFERRED = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


@contextlib.contextmanager
def deferred_signals():
    """Hold SIGTERM, SIGHUP and SIGINT until the block ends, then deliver them.

    So a job told to stop while writing finishes the write (a rename away)
    and then stops as it would have. Only in the main thread (elsewhere,
    and when nested, the block runs unchanged).
    """
    if threading.current_thread() is not threading.main_thread() or \
            getattr(_held, 'active', False):
        yield
        return
    pending = []
    old = {}
    for sig in _DEFERRED:
        try:
            old[sig] = signal.signal(sig, lambda s, f: pending.append(s))
        except (ValueError, OSError):
            pass
    _held.active = True
    try:
        yield
    finally:
        _held.active = False
        for sig, handler in old.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        for sig in dict.fromkeys(pending):
            os.kill(os.getpid(), sig)


_held = threading.local()
