"""Background preparation of the next minibatches while the current one trains.

A daemon thread walks ``indices_iter``, calls ``batch_fn(indices)`` and puts
the results on a bounded queue (``depth`` batches ahead). The consumer
iterates the :class:`Prefetcher` and gets the batches in order. Reading
HDF5, resampling and normalising in numpy release the GIL for much of their
time, so a thread overlaps usefully with the training step.

The worker holds no reference to the Prefetcher, so dropping the
Prefetcher (or leaving a ``for`` loop early and losing it) lets it be
collected, which stops the worker.
"""
import queue
import threading
import time
import weakref

from .. import stop_signals

# How often blocked calls wake to check for shutdown.
_POLL_S = 0.05
_DONE = 'done'
_ITEM = 'item'
_ERROR = 'error'


def _worker(batch_fn, indices_iter, q, stop):
    """Produce batches into ``q`` until exhausted, failed or stopped."""
    def put(msg):
        while not stop.is_set():
            try:
                q.put(msg, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    try:
        for indices in indices_iter:
            if stop.is_set():
                return
            t0 = time.perf_counter()
            batch = batch_fn(indices)
            if not put((_ITEM, batch, time.perf_counter() - t0)):
                return
    except BaseException as exc:  # handed to the consumer, re-raised there
        put((_ERROR, exc, 0.0))
        return
    put((_DONE, None, 0.0))


def _shutdown(q, stop, thread, timeout):
    stop.set()
    # Drain so a worker blocked on put() sees the stop flag promptly.
    try:
        while True:
            q.get_nowait()
    except queue.Empty:
        pass
    if thread is not threading.current_thread():
        thread.join(timeout)
    return not thread.is_alive()


class Prefetcher(object):
    """Iterate ``batch_fn(indices)`` for each ``indices`` of ``indices_iter``,
    computed ``depth`` batches ahead in a background thread.

    Parameters
    ----------
    batch_fn : callable
        ``batch_fn(indices) -> (x, y)`` (any object is passed through).
    indices_iter : iterable
        The minibatch index arrays, in order.
    depth : int
        Batches computed ahead (queue size), >= 1.

    Attributes
    ----------
    wait_s : float
        Total time the consumer spent waiting for a batch.
    count : int
        Batches handed to the consumer so far.
    fetch_s : float
        Total time spent in ``batch_fn`` for those batches.

    Notes
    -----
    An exception raised by ``batch_fn`` or by ``indices_iter`` is re-raised
    (the same exception object, so same type and message) by the ``next``
    call that would have returned that batch; iteration then ends.
    Use as a context manager or call :meth:`close` to stop early.
    """

    def __init__(self, batch_fn, indices_iter, depth=2):
        depth = int(depth)
        if depth < 1:
            raise ValueError('depth must be >= 1, got %r' % (depth,))
        self.depth = depth
        self.wait_s = 0.0
        self.fetch_s = 0.0
        self.count = 0
        self._finished = False
        self._queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=_worker, args=(batch_fn, iter(indices_iter), self._queue, self._stop),
            name='theanompi_ext-prefetch', daemon=True)
        self._finalizer = weakref.finalize(self, _shutdown, self._queue, self._stop,
                                           self._thread, 1.0)
        stop_signals.start_thread(self._thread)

    def __iter__(self):
        return self

    def __next__(self):
        if self._finished:
            raise StopIteration
        t0 = time.perf_counter()
        while True:
            try:
                kind, payload, fetch = self._queue.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    # The worker ended without a final message (stopped).
                    self._finished = True
                    self.wait_s += time.perf_counter() - t0
                    raise StopIteration
        self.wait_s += time.perf_counter() - t0
        if kind == _ITEM:
            self.count += 1
            self.fetch_s += fetch
            return payload
        self._finished = True
        self.close()
        if kind == _ERROR:
            raise payload
        raise StopIteration

    next = __next__

    @property
    def mean_wait_s(self):
        """Average wait per batch handed out (0 before the first)."""
        return self.wait_s / self.count if self.count else 0.0

    @property
    def alive(self):
        """Whether the worker thread is still running."""
        return self._thread.is_alive()

    def close(self, timeout=1.0):
        """Stop the worker; returns True if it ended within ``timeout`` s.

        A ``batch_fn`` call in progress is not interrupted: the (daemon)
        thread exits as soon as it returns. Safe to call more than once.
        """
        self._finished = True
        if self._finalizer.alive:
            self._finalizer.detach()
        return _shutdown(self._queue, self._stop, self._thread, timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def stats(self):
        """``{'batches', 'wait_s', 'mean_wait_s', 'fetch_s'}`` so far."""
        return {'batches': self.count, 'wait_s': self.wait_s,
                'mean_wait_s': self.mean_wait_s, 'fetch_s': self.fetch_s}
