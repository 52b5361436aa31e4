"""The collective-communication interface every backend implements.

A backend reduces float32 buffers in place across ranks, either now
(:meth:`Communicator.allreduce`, with an ``op`` of :data:`REDUCE_OPS`) or
started now and finished later (:meth:`Communicator.start_allreduce`, a sum,
returns a :class:`Handle`). Started allreduces are performed in the order
they were started, on every rank; that shared order is what keeps ranks
from deadlocking, so callers must start the same sequence of buffers on
every rank, and wait for every handle they started (:func:`wait_all`,
:func:`drain`), also when a step fails.

Every collective takes a ``label`` (a started allreduce: its ``name``): the
text a stall or timeout report names it by (collective/watchdog.py); a
backend without a watchdog ignores it. A timeout (``barrier(timeout_s=)``,
``Handle.wait(timeout=)``) is honoured, raising :class:`CollectiveTimeout`
(a stop of the whole process, SIGSTOP to SIGCONT, does not count: running_clock.py),
or refused by name: no backend accepts one and waits longer.
"""
import threading
import time

from ..errors import CollectiveTimeout
from ..running_clock import RunningClock
from .world import import_mpi

#: What :meth:`Communicator.allreduce` can reduce with.
REDUCE_OPS = ('sum', 'max', 'min')


def check_op(op):
    """Refuse a reduction :data:`REDUCE_OPS` does not name."""
    if op not in REDUCE_OPS:
        raise ValueError('unknown reduce op %r; choose from %s' % (op, ', '.join(REDUCE_OPS)))
    return op


def check_timeout(timeout_s, what='timeout_s'):
    """Refuse a timeout that is neither None (wait forever) nor a number of seconds > 0."""
    if timeout_s is None:
        return None
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) \
            or not timeout_s > 0:
        raise ValueError('%s must be None (no limit) or a number of seconds > 0, got %r'
                         % (what, timeout_s))
    return float(timeout_s)


def check_bound(timeout_s, what='timeout_s'):
    """:func:`check_timeout` where a limit is required (None refused)."""
    if timeout_s is None:
        raise ValueError('%s must be a number of seconds > 0 (a bounded wait), got None' % what)
    return check_timeout(timeout_s, what)


def wait_test(test, timeout_s, message, poll_s=1e-3):
    """Call ``test()`` until it returns True; after ``timeout_s`` raise
    :class:`CollectiveTimeout` with ``message()``. Sleeps ``poll_s`` between
    tests (the test of an MPI request needs the GIL; a sleep gives it back)."""
    clock = RunningClock()      # a stop of this whole process is not waiting
    deadline = clock.now() + timeout_s
    while not test():
        if clock.now() >= deadline:
            raise CollectiveTimeout(message())
        time.sleep(poll_s)
        clock.tick(poll_s)


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
        """Block until done; re-raise a failure of the transfer; return the buffer.

        ``timeout`` (s > 0): raise :class:`CollectiveTimeout` when it has not
        finished by then (the handle stays started: wait on it again).
        """
        timeout = check_timeout(timeout, 'timeout')
        if not self._done:
            if not self._lock.acquire(timeout=-1 if timeout is None else timeout):
                raise CollectiveTimeout('allreduce %r did not finish within %.1f s'
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


def wait_all(handles, after=None):
    """Wait for every handle, in order; ``after(i)`` once handle ``i`` holds its sum.

    When a wait fails the remaining handles are still waited for (:func:`drain`)
    before the first error is raised, so no transfer is left running into a
    buffer the caller may reuse.
    """
    for i, h in enumerate(handles):
        try:
            h.wait()
        except Exception:
            drain(handles[i + 1:])
            raise
        if after is not None:
            after(i)


def drain(handles):
    """Wait for every handle, ignoring their failures (an error path: the
    caller is already raising); returns the errors seen."""
    errors = []
    for h in handles:
        try:
            h.wait()
        except Exception as exc:
            errors.append(exc)
    return errors


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

    def allreduce(self, buf, op='sum', label=None):
        """Reduce the contiguous float32 array ``buf`` over all ranks, in place,
        with ``op`` (one of :data:`REDUCE_OPS`); returns ``buf``."""
        raise NotImplementedError

    def start_allreduce(self, buf, name=None, wire='float32'):
        """Start an in-place sum of ``buf``; return a :class:`Handle`.

        The buffer must not be touched until the handle is waited on.
        ``name`` labels it; ``wire``: one of :attr:`wire_dtypes`, what the
        values travel as.
        """
        raise NotImplementedError

    def allgather(self, obj, label=None):
        """Gather a small picklable-free Python object (str/int/tuple) from every rank."""
        raise NotImplementedError

    def allgather_bounded(self, obj, timeout_s, label=None):
        """Gather ``obj`` (what JSON carries: dict, list, str, numbers, bools, None;
        a tuple comes back as a list) from every rank, within ``timeout_s`` for
        each of its two phases, else :class:`CollectiveTimeout`. It runs on the
        bounded barrier's communicator, so a rank that is inside another
        collective (or another program's start-up) cannot be matched with it."""
        raise NotImplementedError

    def bcast(self, obj, root=0, label=None):
        """Broadcast a small Python object from ``root``."""
        raise NotImplementedError

    def barrier(self, timeout_s=None, label=None):
        """Wait for every rank.

        With ``timeout_s`` (> 0) the barrier is bounded: it raises
        :class:`CollectiveTimeout` on a rank that waited that long without
        every rank arriving. A bounded barrier runs on a communicator of its
        own, so a rank may call it while others are inside any other
        collective (an agreement after a failure, train/faults.py); after a
        timeout the ranks' bounded barriers are out of step: end the job.
        """
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
    so they share these methods, the bounded barrier and host reductions.
    The constructor calls :meth:`_init_objects` (collective).
    """
    _agree_comm = None

    def _init_objects(self, comm):
        self.comm = comm
        # Made now: Dup is collective, and a bounded barrier is wanted when
        # ranks may be anywhere (a world of one needs none).
        self._agree_comm = comm.Dup() if comm.Get_size() > 1 else None

    def _free_objects(self):
        if self._agree_comm is not None:
            self._agree_comm.Free()
            self._agree_comm = None

    def allgather(self, obj, label=None):
        return self.comm.allgather(obj)

    def bcast(self, obj, root=0, label=None):
        return self.comm.bcast(obj, root=root)

    def allgather_bounded(self, obj, timeout_s, label=None):
        import json
        import numpy as np
        timeout_s = check_bound(timeout_s)
        data = np.frombuffer(json.dumps(obj).encode('utf-8'), np.uint8)
        if self._agree_comm is None:
            return [json.loads(data.tobytes().decode('utf-8'))]
        MPI = import_mpi()

        def wait(req, phase):
            wait_test(req.Test, timeout_s, lambda: (
                '%r: not every rank took part within %.1f s (%s; rank %d of %d waited; a '
                'rank failed, is stopped, or is elsewhere)' % (
                    label or 'allgather', timeout_s, phase, self.rank, self.size)),
                poll_s=0.005)
        size, sizes = np.array([data.size], np.int64), np.empty(self.size, np.int64)
        wait(self._agree_comm.Iallgather(size, sizes), 'the sizes')    # (buffers held here)
        counts = [int(n) for n in sizes]
        displs = [sum(counts[:r]) for r in range(self.size)]
        out = np.empty(sum(counts), np.uint8)
        wait(self._agree_comm.Iallgatherv([data, MPI.BYTE], [out, (counts, displs), MPI.BYTE]),
             'the values')
        return [json.loads(out[d:d + n].tobytes().decode('utf-8'))
                for d, n in zip(displs, counts)]

    def barrier(self, timeout_s=None, label=None):
        timeout_s = check_timeout(timeout_s)
        if timeout_s is None:
            self.comm.Barrier()
            return
        if self._agree_comm is None:
            return            # one rank: every rank has arrived
        req = self._agree_comm.Ibarrier()
        wait_test(req.Test, timeout_s, lambda: (
            'barrier %r: not every rank arrived within %.1f s (rank %d of %d waited; a rank '
            'failed, is stopped, or is elsewhere)' % (label or 'barrier', timeout_s,
                                                      self.rank, self.size)), poll_s=0.005)

    def abort(self, code=1):
        from .abort_alone import abort
        abort(self.comm.Abort, code)     # also where the launcher cannot be reached

    def host_allreduce(self, buf, op='sum'):
        """Reduce host float32 ``buf`` in place over ``comm`` with ``op``."""
        check_buffer(buf)
        check_op(op)
        if self.comm.Get_size() > 1:
            MPI = import_mpi()
            self.comm.Allreduce(MPI.IN_PLACE, buf,
                                op={'sum': MPI.SUM, 'max': MPI.MAX, 'min': MPI.MIN}[op])
        return buf


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
