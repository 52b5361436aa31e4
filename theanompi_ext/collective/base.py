"""The collective-communication interface every backend implements.

A backend sums float32 buffers in place across ranks, either now
(:meth:`Communicator.allreduce`) or started now and finished later
(:meth:`Communicator.start_allreduce` returns a :class:`Handle`). Started
allreduces are performed in the order they were started, on every rank;
that shared order is what keeps ranks from deadlocking, so callers must
start the same sequence of buffers on every rank.
"""
import threading
import time


class Handle(object):
    """A started allreduce. :meth:`wait` blocks until the buffer holds the sum.

    ``t_start``/``t_end`` are ``time.perf_counter()`` stamps of when the
    transfer actually began and finished (for the timeline).
    """

    def __init__(self, buf, name=None):
        self.buf = buf           # kept referenced until complete
        self.name = name
        self.t_queued = time.perf_counter()
        self.t_start = None
        self.t_end = None
        self.error = None
        # Held until finished. A plain lock, not an Event: a handle is
        # made per bucket per step, and an Event costs ~5 us to create.
        self._done = False
        self._lock = threading.Lock()
        self._lock.acquire()

    def _finish(self, error=None):
        """Mark finished (once; later calls do nothing) and release waiters."""
        if self._done:
            return
        self.t_end = time.perf_counter()
        self.error = error
        self._done = True
        self._lock.release()

    def done(self):
        """True once the transfer has finished (successfully or not)."""
        return self._done

    def wait(self, timeout=None):
        """Block until done; re-raise a failure of the transfer; return the buffer."""
        if not self._done:
            if not self._lock.acquire(timeout=-1 if timeout is None else timeout):
                raise TimeoutError('allreduce %r did not finish within %.1f s'
                                   % (self.name, timeout))
            self._lock.release()     # let any other waiter through
        if self.error is not None:
            raise RuntimeError('allreduce %r failed: %s' % (self.name, self.error))
        return self.buf


class CompletedHandle(Handle):
    """A handle for work that finished synchronously."""

    def __init__(self, buf, name=None):
        Handle.__init__(self, buf, name)
        self.t_start = self.t_queued
        self._finish()


class Communicator(object):
    """Interface of a collective backend (see module docstring).

    Attributes: ``rank``, ``size``, ``name`` (backend name).
    """
    name = 'abstract'
    rank = 0
    size = 1
    #: dtypes this backend can send ``start_allreduce``'s buffers as
    #: (``wire=``); the sum is float32 whatever travels (collective/wire.py).
    wire_dtypes = ('float32',)

    def allreduce(self, buf):
        """Sum the contiguous float32 array ``buf`` over all ranks, in place."""
        raise NotImplementedError

    def start_allreduce(self, buf, name=None, wire='float32'):
        """Start an in-place sum of ``buf``; return a :class:`Handle`.

        The buffer must not be touched until the handle is waited on.
        ``wire``: one of :attr:`wire_dtypes`, what the values travel as.
        """
        raise NotImplementedError

    def allgather(self, obj):
        """Gather a small picklable-free Python object (str/int/tuple) from every rank."""
        raise NotImplementedError

    def bcast(self, obj, root=0):
        """Broadcast a small Python object from ``root``."""
        raise NotImplementedError

    def barrier(self):
        """Wait for every rank."""
        raise NotImplementedError

    def abort(self, code=1):
        """End every rank of the job now (used when one rank fails)."""
        raise NotImplementedError

    def close(self):
        """Release background resources (threads, sub-communicators)."""

    def describe(self):
        """One line: backend, rank/size and transport details."""
        return '%s rank %d/%d' % (self.name, self.rank, self.size)


class ObjectsOverMPI(object):
    """Small-object collectives of a backend that holds an mpi4py ``comm``.

    Every backend (MPI, NCCL, pygpu) exchanges plans and checks over MPI,
    so they share these four methods.
    """

    def allgather(self, obj):
        return self.comm.allgather(obj)

    def bcast(self, obj, root=0):
        return self.comm.bcast(obj, root=root)

    def barrier(self):
        self.comm.Barrier()

    def abort(self, code=1):
        self.comm.Abort(code)


def check_wire(comm, wire):
    """Refuse a wire dtype ``comm``'s backend cannot send, naming what it can."""
    from .wire import check_wire_dtype
    check_wire_dtype(wire)
    if wire not in comm.wire_dtypes:
        raise ValueError('the %s backend cannot send gradients as %s (wire dtypes it '
                         'can send: %s)' % (comm.name, wire, ', '.join(comm.wire_dtypes)))
    return wire


def check_buffer(buf):
    """Refuse buffers a collective cannot use, with a message saying why."""
    import numpy as np
    if not isinstance(buf, np.ndarray):
        raise TypeError('allreduce needs a numpy array, got %s' % type(buf).__name__)
    if buf.dtype != np.float32:
        raise TypeError('allreduce needs float32, got %s' % buf.dtype)
    if not buf.flags.c_contiguous:
        # Theano's conv weight gradients can have negative strides; MPI
        # would raise BufferError deep inside, so say it here.
        raise ValueError('allreduce needs a C-contiguous buffer (copy it into '
                         'a contiguous bucket first)')
    if not buf.flags.writeable:
        raise ValueError('allreduce buffer is read-only')
