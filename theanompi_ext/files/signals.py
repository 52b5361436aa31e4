"""Stop signals held while a file is written (:func:`deferred_signals`).

SIGTERM/SIGHUP/SIGINT arriving while a file is written wait until it is
renamed into place (then act as usual). One ignored before stays ignored
(:mod:`theanompi_ext.stop_signals`).
"""
import contextlib
import os
import threading

from .. import stop_signals

_DEFERRED = stop_signals.STOP_SIGNALS


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
    old = stop_signals.catch({sig: lambda s, f: pending.append(s) for sig in _DEFERRED})
    _held.active = True
    try:
        yield
    finally:
        _held.active = False
        stop_signals.restore(old)
        for sig in dict.fromkeys(pending):
            os.kill(os.getpid(), sig)


_held = threading.local()
