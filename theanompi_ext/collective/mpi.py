"""MPI host backend (mpi4py): float32 sums in host memory.

Two ways to finish a started allreduce, the same on every rank (a blocking
``Allreduce`` on one rank does not match an ``Iallreduce`` on another):

``progress='thread'`` (default)
    One background thread takes started buffers in FIFO order and runs a
    blocking ``Allreduce`` on each, on a duplicate of the communicator.
    mpi4py releases the GIL inside MPI, so the transfer moves while the
    main thread runs compiled Theano code. MPICH polls while it waits; the
    thread can be given a lower scheduling priority (``thread_nice``) so
    its polling takes CPU only when compute leaves the core idle.
    Starting a buffer while the thread is idle hands it the GIL until it
    has taken the buffer (``thread_handoff``): otherwise it would wait for
    a core and the GIL while the caller's next compiled chunk runs.
    A ``wait()`` on a buffer the thread has not taken yet (it is next in
    line and the thread is idle) runs the transfer on the waiting thread
    instead: waking the thread costs 20-90 us on a machine whose cores the
    ranks hold (docs/performance.md), which the last bucket of a step
    would otherwise add to the critical path. One transfer runs at a time,
    in start order, whichever thread runs it, so every rank still issues
    the same sequence.
``progress='request'``
    ``Iallreduce`` now, ``Wait`` later. MPI makes little progress until
    the wait unless the library has asynchronous progress, so this mainly
    serves comparisons.

``topology='two-level'`` sums within each host first and crosses between
hosts once (collective/two_level.py), on the same thread, in the same
order; ``'auto'`` chooses it where there are several hosts and a host
with several ranks, ``'flat'`` (default) is MPI's own ``Allreduce``.
"""
import collections
import os
import threading
import time

from .base import (Communicator, CompletedHandle, Handle, ObjectsOverMPI, check_buffer,
                   check_op, check_timeout, check_wire, wait_test)
from .mpi_wire import DEFAULT_WIRE_METHOD, WIRE_METHODS, WireTransfer, wire_allreduce, free_ops
from .two_level import TwoLevel, check_topology, host_layout, two_level_pays
from .wire import WIRE_DTYPES
from .world import import_mpi
from .. import stop_signals
from ..errors import WireOverflow


# Scheduling of the communication thread. Measured (docs/overlap.md): on
# a busy machine nice 19 and SCHED_IDLE starve the thread, so transfers
# stall behind compute (exposed communication 0.4-0.7 s instead of ~25 ms
# at 2 ranks over a 20 Mbit/s link); a normal priority keeps them moving.
DEFAULT_THREAD_NICE = 0
DEFAULT_THREAD_IDLE = False
#: How the communication thread waits for a transfer: 0 parks it in a
#: blocking ``Allreduce`` (MPICH polls inside it, without the GIL); N > 0
#: starts an ``Iallreduce`` and tests it, sleeping between tests (20 us,
#: doubling up to N us). Testing burns almost no CPU, but each test needs
#: the GIL, which a compiled Theano function holds for its whole run: the
#: transfer then advances only between backward chunks. Measured
#: (docs/overlap.md): hidden fraction 0.56 instead of 0.86 for wide
#: ResNet-20 at 200 Mbit/s, so blocking stays the default; the tested mode
#: suits compute that releases the GIL.
DEFAULT_THREAD_POLL_US = 0
#: Whether ``start_allreduce`` hands the GIL (and its core) to an idle
#: communication thread until that thread has taken the bucket (and so is
#: about to enter MPI, which releases the GIL). Without it the thread, woken
#: while the caller goes on into the next compiled backward chunk, waits for
#: a core and for the GIL, which a chunk without BLAS calls keeps until it
#: returns: a model of sub-millisecond chunks then starts its transfers only
#: as backprop ends (docs/overlap.md, "When a launched bucket starts moving").
#: The cost is one thread wake-up (tens of us) per bucket started while the
#: thread is idle; a bucket started while a transfer runs is not waited for.
#: Measured (ResNet-20 at 200 Mbit/s, 2 ranks): such a bucket's start delay
#: fell from 1.8-2.1 ms median (up to 7.6 ms) to 0.06-0.07 ms.
DEFAULT_THREAD_HANDOFF = True
# How long one wait for the hand-off lasts before the caller checks that the
# thread is still alive (it takes the bucket in microseconds when it is).
_HANDOFF_CHECK_S = 0.05

# MPICH's own polling is kept (no MPIR_CVAR_* set here): its heavy-yield
# mode (MPIR_CVAR_ENABLE_HEAVY_YIELD=1) cuts the CPU a wait burns from
# about 33% to 15%, but multiplies the latency of a shared-memory
# allreduce (4 KB: 6.5 -> 297 us; 1 MB: 289 -> 767 us). docs/overlap.md
# has both measurements; users who want it set the variable.


def _mpi():
    return import_mpi()


class MPICommunicator(ObjectsOverMPI, Communicator):
    """Allreduce over an mpi4py communicator (COMM_WORLD by default)."""
    name = 'mpi'
    wire_dtypes = WIRE_DTYPES      # 16-bit wires: collective/mpi_wire.py

    def __init__(self, comm=None, progress='thread', thread_nice=None, thread_idle=None,
                 thread_poll_us=None, wire_method=DEFAULT_WIRE_METHOD, topology='flat',
                 two_level_algorithm=None, two_level_piece_bytes=None, thread_handoff=None):
        MPI = _mpi()
        if progress not in ('thread', 'request'):
            raise ValueError("progress must be 'thread' or 'request', got %r" % (progress,))
        if wire_method not in WIRE_METHODS:
            raise ValueError('wire_method must be one of %s, got %r'
                             % (', '.join(WIRE_METHODS), wire_method))
        self.wire_method = wire_method
        self._wire_ops = {}
        self._MPI = MPI
        self._init_objects(comm if comm is not None else MPI.COMM_WORLD)
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.progress = progress
        self.thread_nice = DEFAULT_THREAD_NICE if thread_nice is None else int(thread_nice)
        self.thread_idle = DEFAULT_THREAD_IDLE if thread_idle is None else bool(thread_idle)
        self.thread_poll_us = (DEFAULT_THREAD_POLL_US if thread_poll_us is None
                               else float(thread_poll_us))
        if self.thread_poll_us < 0:
            raise ValueError('thread_poll_us must be >= 0 (0: blocking wait), got %r'
                             % (thread_poll_us,))
        self.thread_handoff = (DEFAULT_THREAD_HANDOFF if thread_handoff is None
                               else bool(thread_handoff))
        # Collectives of the background thread must never interleave with
        # the main thread's (allgather, barrier): give it its own context.
        self._bg_comm = self.comm.Dup()
        # two levels: one set of sub-communicators per thread's communicator
        self.topology = check_topology(topology)
        self._two, self._two_main = self._two_levels(progress, two_level_algorithm,
                                                     two_level_piece_bytes)
        # FIFO of started handles and whether a transfer is running; one
        # condition guards both (re-entrant: a test may hold it to keep
        # the thread from taking work).
        self._cond = threading.Condition()
        self._todo = collections.deque()
        self._issuing = False
        self._thread = None

    def _two_levels(self, progress, algorithm, piece_bytes):
        """``(for the communication thread, for the caller's)`` two-level sums, or
        ``(None, None)`` for the flat one (collective: every rank decides alike)."""
        if self.topology == 'flat' or self.size == 1:
            return None, None
        if self.topology == 'auto' and (progress != 'thread' or not two_level_pays(
                host_layout(self.comm)[1])):
            return None, None
        if progress != 'thread':
            raise ValueError("topology='two-level' needs progress='thread' (its phases "
                             "are blocking calls on the communication thread)")
        return (TwoLevel(self._bg_comm, algorithm, piece_bytes=piece_bytes),
                TwoLevel(self.comm, algorithm, piece_bytes=piece_bytes))

    @property
    def topology_in_use(self):
        """``'flat'``, or ``'two-level rsag'``/``'two-level leader'``: what the sums run as."""
        return 'flat' if self._two is None else 'two-level ' + self._two.algorithm

    # -- blocking ---------------------------------------------------------
    def allreduce(self, buf, op='sum', label=None, wire='float32'):
        """:meth:`Communicator.allreduce`; ``wire`` (sums only) as for
        :meth:`start_allreduce`."""
        check_buffer(buf)
        check_op(op)
        check_wire(self, wire)
        if wire != 'float32' and op != 'sum':
            raise ValueError('a %s wire exists for sums only, not op=%r' % (wire, op))
        if self._two_main is not None and op == 'sum':
            self._two_main.allreduce(buf, wire, self.wire_method)
        elif self.size > 1 and wire != 'float32':
            wire_allreduce(self.comm, buf, wire, self.wire_method, label or 'allreduce',
                           self._wire_ops)
        else:
            self.host_allreduce(buf, op)
        return buf

    # -- started ------------------------------------------------------------
    def start_allreduce(self, buf, name=None, wire='float32'):
        check_buffer(buf)
        check_wire(self, wire)
        if self.size == 1:
            return CompletedHandle(buf, name)     # nothing travels: no cast
        if wire != 'float32' and self.progress != 'thread':
            raise ValueError("a %s wire needs progress='thread' (its sum has no "
                             "nonblocking form)" % wire)
        if self.progress == 'thread':
            handle = _StartedHandle(buf, name, self)
            handle.wire = wire
            if wire != 'float32' and self._two is None:
                # cast now, on the starting thread, which holds the GIL between
                # backward chunks anyway (see mpi_wire.WireTransfer)
                handle.transfer = WireTransfer(buf, wire, name)
            self._ensure_thread()
            with self._cond:
                idle = not self._issuing and not self._todo
                if idle and self.thread_handoff:
                    handle._untaken = threading.Lock()
                    handle._untaken.acquire()
                self._todo.append(handle)
                if not self._issuing:    # else whoever is issuing looks again when done
                    self._cond.notify()
            if handle._untaken is not None:
                self._hand_over(handle)
        else:
            handle = _RequestHandle(buf, name, self._bg_comm.Iallreduce(
                self._MPI.IN_PLACE, buf, op=self._MPI.SUM))
        return handle

    def _ensure_thread(self):
        if self._thread is None:
            self._thread = stop_signals.start_thread(threading.Thread(
                target=self._run, name='allreduce', daemon=True))

    def _hand_over(self, handle):
        """Block (without the GIL) until the thread has taken ``handle``.

        The thread then holds the GIL only until its MPI call releases it,
        so the transfer starts now, not whenever the thread finds a core and
        the GIL while the caller's next compiled chunk runs. Gives up if the
        thread has died.
        """
        lock = handle._untaken
        while not lock.acquire(timeout=_HANDOFF_CHECK_S):
            if self._thread is None or not self._thread.is_alive():
                return
        handle.t_handed = time.perf_counter()

    def _run(self):
        lower_thread_priority(self.thread_nice, self.thread_idle)
        while True:
            with self._cond:
                while self._issuing or not self._todo:
                    self._cond.wait()
                handle = self._todo.popleft()
                if handle is None:
                    return
                self._issuing = True
            self._transfer(handle)

    def _run_inline(self, handle):
        """Run ``handle``'s transfer on the calling thread if it is next
        in line and no transfer is running; return whether it did."""
        with self._cond:
            if self._issuing or not self._todo or self._todo[0] is not handle:
                return False
            self._todo.popleft()
            self._issuing = True
        handle.ran_inline = True
        self._transfer(handle)
        return True

    def _transfer(self, handle):
        """The allreduce of one started handle (``_issuing`` is set)."""
        MPI = self._MPI
        if handle._untaken is not None:
            handle._untaken.release()    # a hand-off (start_allreduce) waits for this
        handle.t_start = time.perf_counter()
        error = None
        try:
            if self._two is not None:
                self._two.allreduce(handle.buf, handle.wire, self.wire_method)
            elif handle.wire != 'float32':
                handle.transfer.exchange(self._bg_comm, self.wire_method, self._wire_ops)
            elif self.thread_poll_us > 0:
                req = self._bg_comm.Iallreduce(MPI.IN_PLACE, handle.buf, op=MPI.SUM)
                wait_sleeping(req, self.thread_poll_us * 1e-6)
            else:
                self._bg_comm.Allreduce(MPI.IN_PLACE, handle.buf, op=MPI.SUM)
        except Exception as exc:  # report on the waiting side
            error = exc
        with self._cond:
            self._issuing = False
            if self._todo:    # a wake costs tens of us on a busy core: only with work
                self._cond.notify()
        handle._finish(error)

    def close(self):
        if self._thread is not None:
            with self._cond:
                self._todo.append(None)
                self._cond.notify_all()
            self._thread.join()
            self._thread = None
        free_ops(self._wire_ops)
        for two in (self._two, self._two_main):
            if two is not None:
                two.free()
        self._two = self._two_main = None
        if self._bg_comm is not None:
            self._bg_comm.Free()
            self._bg_comm = None
        self._free_objects()

    def describe(self):
        wait = ('tests + sleeps <= %g us' % self.thread_poll_us if self.thread_poll_us
                else 'blocking')
        if self.progress == 'thread' and self.thread_handoff:
            wait += ', GIL handed over at start'
        topo = self._two.describe() if self._two is not None else 'flat'
        return 'mpi rank %d/%d (%s, progress=%s, thread wait %s, 16-bit wires by %s, %s)' % (
            self.rank, self.size, library_version(), self.progress, wait, self.wire_method,
            topo)


def lower_thread_priority(nice=0, idle=False):
    """Lower the scheduling priority of the *calling thread* only.

    Linux schedules threads, and both ``setpriority(PRIO_PROCESS, tid)``
    and ``sched_setscheduler(0, ...)`` (0 = the caller) act on one thread.
    ``idle`` puts it in ``SCHED_IDLE``: it runs only on an otherwise idle
    core (weight 3 against 1024 for a normal thread, against 15 for nice
    19). Returns what was applied; failures (other systems, limits) are
    ignored, the thread then keeps its priority.
    """
    applied = []
    if nice:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), int(nice))
            applied.append('nice %d' % int(nice))
        except (OSError, AttributeError):
            pass
    if idle:
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            applied.append('SCHED_IDLE')
        except (OSError, AttributeError):
            pass
    return applied


def wait_sleeping(req, max_sleep_s, first_sleep_s=2e-5):
    """Wait for MPI request ``req`` by testing it, sleeping in between.

    The sleep starts at ``first_sleep_s`` and doubles up to ``max_sleep_s``:
    short transfers finish within a few tests, and a long one costs one
    test per ``max_sleep_s`` instead of a core spinning in MPICH's poll loop.
    """
    delay = min(first_sleep_s, max_sleep_s)
    while not req.Test():
        time.sleep(delay)
        delay = min(2.0 * delay, max_sleep_s)


class _StartedHandle(Handle):
    """A handle queued for the communication thread; ``wait()`` without a
    timeout runs the transfer itself when the thread has not taken it yet
    (an inline blocking call could not honour a timeout)."""

    def __init__(self, buf, name, comm):
        Handle.__init__(self, buf, name)
        self.ran_inline = False   # True: the waiting thread ran the transfer
        self.wire = 'float32'     # dtype on the wire (set by start_allreduce)
        self.transfer = None      # a 16-bit wire's WireTransfer (start_allreduce)
        self.t_handed = None      # when the starting thread saw the thread take it
        self._untaken = None      # held until the thread takes it (a hand-off)
        self._comm = comm

    def wait(self, timeout=None):
        """:meth:`Handle.wait`; a 16-bit wire's sum is cast back (and checked for
        overflow, :class:`~theanompi_ext.errors.WireOverflow`) here, on the
        waiting thread."""
        if timeout is None and not self.done():
            self._comm._run_inline(self)
        buf = Handle.wait(self, timeout)
        if self.transfer is not None:
            try:
                self.transfer.finish()
            except WireOverflow as exc:
                self.error = exc      # a second wait raises it again
                raise RuntimeError('allreduce %r failed: %s' % (self.name, exc)) from None
        return buf


class _RequestHandle(Handle):
    """An ``Iallreduce`` request (``progress='request'``); ``wait(timeout)``
    tests it until ``timeout`` (then :class:`~.base.CollectiveTimeout`)."""

    def __init__(self, buf, name, req):
        Handle.__init__(self, buf, name)
        self.t_start = self.t_queued
        self._req = req

    def done(self):
        if not self._done and self._req.Test():
            self._finish()
        return self._done

    def wait(self, timeout=None):
        timeout = check_timeout(timeout, 'timeout')
        if not self._done:
            if timeout is None:
                self._req.Wait()
                self._finish()
            else:
                wait_test(self.done, timeout, lambda: 'allreduce %r did not finish within '
                          '%.1f s' % (self.name, timeout))
        return self.buf


def mpi4py_version():
    """mpi4py's version; importing the package does not start MPI (``mpi4py.MPI`` does)."""
    import mpi4py
    return mpi4py.__version__


def library_version():
    """First line of the MPI library's version string."""
    # Open MPI's string ends in a NUL byte (5.0.11 through mpi4py 4.1.2)
    return _mpi().Get_library_version().replace('\0', '').strip().splitlines()[0].strip()


def thread_level():
    """The thread support level MPI was initialised with, as a name."""
    MPI = _mpi()
    names = {MPI.THREAD_SINGLE: 'SINGLE', MPI.THREAD_FUNNELED: 'FUNNELED',
             MPI.THREAD_SERIALIZED: 'SERIALIZED', MPI.THREAD_MULTIPLE: 'MULTIPLE'}
    return names.get(MPI.Query_thread(), str(MPI.Query_thread()))


