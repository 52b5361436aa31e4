"""NCCL backend: float32 sums of GPU buffers, overlapped with compute.

One rank per GPU. The library is ``libnccl.so.2`` (see :mod:`.nccl_lib`
for where it is found); CUDA streams, events and the device come from
CuPy. Rank 0 makes the NCCL unique id and MPI broadcasts it, so the job
is launched with ``mpirun`` like the ``mpi`` backend; ``allgather``,
``bcast`` and ``barrier`` stay on MPI (small host objects).

Stream choreography of :meth:`NCCLCommunicator.start_allreduce`::

    compute stream ──●ready─────────────────────────── ... ──▲ (wait: stream waits on done)
                      ╲                                      │
    comm stream        ╲wait──[ncclAllReduce in place]──●done┘

The host never blocks in ``start_allreduce``; :meth:`NCCLHandle.wait`
makes the *current* stream wait on ``done`` (host stays free) or, with
``sync=True``, blocks the host until the sum is there.

Buffers
    Float32, C-contiguous device arrays: what is accepted and how its
    address is found is in :mod:`.nccl_buffers`; a numpy array is refused
    with a ``TypeError`` (host memory belongs to the ``mpi`` backend).

Mismatched sizes across ranks
    Checked over MPI before NCCL sees them (``size_check``, see
    :mod:`.nccl_checks`). :meth:`NCCLCommunicator.check_plan` checks a whole
    bucket plan in one allgather and marks its names as checked.

16-bit wire (``start_allreduce(..., wire='float16'|'bfloat16')``)
    CuPy buffers only: the bucket is cast on the comm stream into one
    16-bit copy (bfloat16 as uint16 bits, round-to-nearest-even, by the
    functions of :mod:`.wire` run with CuPy), summed by NCCL's native
    ``ncclFloat16``/``ncclBfloat16`` allreduce and cast back. Unlike the
    MPI path, NCCL keeps its partial sums in the 16-bit type (up to k-1
    roundings: the bound of the ``op`` method in :mod:`.mpi_wire`), and
    inf/nan are not looked for (that would block the host); a non-finite
    gradient then shows as a non-finite loss. bfloat16 needs NCCL >= 2.10.
    Not yet run on a GPU (tested against fakes).
"""
import socket
import time

from .base import Communicator, Handle, ObjectsOverMPI, check_timeout, wait_test
from .world import local_rank, world_comm
from .nccl_buffers import float32_device_buffer
from .nccl_checks import SizeChecked, check_one_rank_per_gpu, check_sizes
from .nccl_lib import (NCCLUnavailable, NCCLError, NCCL_FLOAT32, NCCL_SUM, NCCL_MAX, NCCL_MIN,
                       NCCL_FLOAT16, NCCL_BFLOAT16, load_library)
from .nccl_probe import device_count, import_cupy
from .wire import WIRE_DTYPES, bfloat16_to_float32


# -- setup helpers ------------------------------------------------------------------

# Asked for when CuPy cannot tell the device's range: CUDA clamps a priority
# outside the range to its nearest end (cudaStreamCreateWithPriority), so
# this yields the greatest one on any device.
PRIORITY_BEYOND_RANGE = -1000


def greatest_priority(cp):
    """The stream priority to ask for: the device's greatest (numerically least).

    CuPy <= 13 exposes ``runtime.deviceGetStreamPriorityRange``; CuPy 14
    does not, and gets :data:`PRIORITY_BEYOND_RANGE`, which CUDA clamps.
    """
    query = getattr(cp.cuda.runtime, 'deviceGetStreamPriorityRange', None)
    if query is None:
        return PRIORITY_BEYOND_RANGE
    return query()[1]




# -- handle -------------------------------------------------------------------

class NCCLHandle(Handle):
    """A started NCCL allreduce: finished when its ``done`` event fires.

    ``t_start`` is the host time of enqueueing; ``t_end`` the host time at
    which completion was observed (host-synchronised wait or :meth:`done`
    returning True), or, after a stream wait only, when that wait was
    enqueued (``host_synced`` tells which). Device-side durations would
    need CUDA timing events.
    """

    def __init__(self, buf, name, done_event, owner, sync=False):
        Handle.__init__(self, buf, name)
        self.t_start = self.t_queued
        self.host_synced = False
        self._done_event = done_event
        self._owner = owner
        self._sync = sync

    def done(self):
        """True once the sum is in the buffer (queries the event, never blocks)."""
        if not self._done and self._done_event.done:
            self.host_synced = True
            self._finish()
        return self._done

    def wait(self, timeout=None, sync=None, stream=None):
        """Order later work after the sum; return the buffer.

        Default: the *current* CuPy stream (or ``stream``, e.g. the stream
        the update runs on) waits on the done event, the host does not block. ``sync=True`` (or the communicator's ``sync_wait``,
        or any ``timeout``) blocks the host until the sum is there and then
        reports asynchronous NCCL failures.
        """
        sync = self._sync if sync is None else sync
        timeout = check_timeout(timeout, 'timeout')
        if sync or timeout is not None:
            if timeout is None:
                self._done_event.synchronize()
            else:
                wait_test(lambda: self._done_event.done, timeout,
                          lambda: 'allreduce %r did not finish within %.1f s'
                          % (self.name, timeout), poll_s=50e-6)
            self._finish()      # idempotent
            self.host_synced = True
            self._owner._raise_async_error(self.name)
        else:
            if stream is None:
                stream = self._owner._cp.cuda.get_current_stream()
            stream.wait_event(self._done_event)
            # Not finished yet (done() keeps querying the event); t_end is
            # provisional until completion is observed.
            if self.t_end is None:
                self.t_end = time.perf_counter()
        return self.buf


# -- communicator ---------------------------------------------------------------

class NCCLCommunicator(SizeChecked, ObjectsOverMPI, Communicator):
    """NCCL allreduce of float32 device buffers; small objects over MPI.

    Parameters
    ----------
    comm : mpi4py communicator (default ``MPI.COMM_WORLD``; a world of one when
        mpi4py cannot load MPI outside an MPI launcher, see :mod:`.world`); its
        ranks are the NCCL ranks.
    device : CUDA ordinal; default: local rank (MPI_COMM_TYPE_SHARED split) modulo
        the visible device count.
    stream : the communication stream (CuPy stream or raw ``cudaStream_t`` int);
        default: a new non-blocking stream, at the device's greatest priority
        where CuPy's ``Stream`` takes ``priority=`` (CuPy >= 14; so NCCL's
        blocks are scheduled ahead of queued compute blocks); CuPy 13 has no
        stream priorities and gets a normal-priority stream.
    size_check : 'first' (default), 'always' or 'off' (see module docstring).
    sync_wait : if True, ``Handle.wait()`` blocks the host by default.
    compute_stream : stream the buffers are produced on (CuPy stream or raw int);
        default: the current CuPy stream at each start.
    lib, cupy : injected library / CuPy module (tests).
    """
    name = 'nccl'
    wire_dtypes = WIRE_DTYPES

    def __init__(self, comm=None, device=None, stream=None, size_check='first',
                 sync_wait=False, compute_stream=None, lib=None, cupy=None):
        self._init_size_check(size_check)
        self.comm = comm = comm if comm is not None else world_comm()
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.sync_wait = bool(sync_wait)
        self._init_objects(comm)
        self._nccl = None
        self._inflight = []
        local = local_rank(comm)   # collective: before anything can fail
        local = self.rank if local is None else local

        # Everything that can fail on one rank only is gathered before the
        # first collective NCCL step, so every rank raises instead of some
        # hanging in ncclCommInitRank.
        error, where, cause = None, (socket.gethostname(), None), None
        try:
            self.lib = lib if lib is not None else load_library()
            self._cp = cupy if cupy is not None else import_cupy()
            self.device = self._select_device(device, local)
            where = (where[0], self._bus_id())
            self.stream = self._as_stream(stream) if stream is not None else self._new_stream()
            self._compute = self._as_stream(compute_stream) if compute_stream is not None else None
        except Exception as exc:
            error, cause = '%s: %s' % (type(exc).__name__, exc), exc
        gathered = comm.allgather((error, where))
        failed = [(r, e) for r, (e, _) in enumerate(gathered) if e]
        if failed:
            msg = '; '.join('rank %d: %s' % (r, e) for r, e in failed[:4])
            raise NCCLUnavailable('NCCL backend unusable on %d of %d rank(s): %s'
                                  % (len(failed), self.size, msg)) from cause
        check_one_rank_per_gpu([w for _, w in gathered])

        if self.rank == 0:
            try:
                payload = ('ok', self.lib.get_unique_id())
            except Exception as exc:
                payload = ('error', '%s: %s' % (type(exc).__name__, exc))
        else:
            payload = None
        status, uid = comm.bcast(payload, root=0)
        if status != 'ok':
            raise NCCLUnavailable('rank 0 could not create the NCCL unique id: %s' % uid)
        with self._cp.cuda.Device(self.device):
            self._nccl = self.lib.comm_init_rank(self.size, uid, self.rank)
        count, urank = self.lib.comm_count(self._nccl), self.lib.comm_user_rank(self._nccl)
        if (count, urank) != (self.size, self.rank):
            raise NCCLError('ncclCommInitRank', 3, 'communicator is rank %s of %s, MPI says %d of %d'
                            % (urank, count, self.rank, self.size))

    @property
    def compute_stream(self):
        """The ``compute_stream=`` given (a CuPy stream), or None (the current one)."""
        return self._compute

    @property
    def nccl_comm(self):
        """The raw ``ncclComm_t`` (ctypes ``c_void_p``), for direct calls through ``self.lib``."""
        return self._nccl

    # -- setup helpers ----------------------------------------------------------
    def _select_device(self, device, local_rank):
        n = device_count(self._cp)
        if device is None:
            device = local_rank % n
        elif not 0 <= int(device) < n:
            raise ValueError('device %r out of range: %d CUDA device(s) visible' % (device, n))
        device = int(device)
        self._cp.cuda.Device(device).use()
        return device

    def _bus_id(self):
        try:
            return self._cp.cuda.Device(self.device).pci_bus_id
        except Exception:
            return None     # unknown: the duplicate-GPU check skips this rank

    def _new_stream(self):
        cp = self._cp
        with cp.cuda.Device(self.device):
            try:
                return cp.cuda.Stream(non_blocking=True, priority=greatest_priority(cp))
            except TypeError:   # a CuPy whose Stream takes no priority
                return cp.cuda.Stream(non_blocking=True)

    def _as_stream(self, stream):
        if isinstance(stream, int):
            return self._cp.cuda.ExternalStream(stream)
        return stream

    # -- size checks --------------------------------------------------------------
    def check_plan(self, entries):
        """Collective: verify every rank will start the same buffers.

        ``entries``: ``(name, count)`` pairs or device arrays (named by
        position), in start order. Raises ``ValueError`` on every rank on a
        mismatch; on success the names count as checked.
        """
        plan = []
        for i, e in enumerate(entries):
            if isinstance(e, tuple):
                plan.append((e[0], int(e[1])))
            else:
                plan.append(('#%d' % i, float32_device_buffer(e).count))
        check_sizes(self.comm.allgather(plan))
        for name, count in plan:
            self._seen[name] = count

    # -- allreduce ----------------------------------------------------------------
    def start_allreduce(self, buf, name=None, wire='float32'):
        """Enqueue an in-place float32 sum of ``buf`` on the comm stream; see module docstring."""
        return self._start(buf, name, wire, NCCL_SUM)

    def _start(self, buf, name, wire, nccl_op):
        from .base import check_wire
        check_wire(self, wire)
        if wire == 'bfloat16' and tuple(self.lib.version) < (2, 10):
            raise NCCLUnavailable('a bfloat16 wire needs NCCL >= 2.10, this is NCCL %s'
                                  % self.lib.version_string())
        if self._nccl is None:
            raise RuntimeError('NCCL communicator is closed')
        info = float32_device_buffer(buf)
        if info.device is not None and info.device != self.device:
            raise ValueError('buffer %r is on cuda:%d, the communicator on cuda:%d'
                             % (name, info.device, self.device))
        self._check_size(name, info.count)
        cp = self._cp
        if self._compute is not None:
            compute = self._compute
        elif info.stream is not None:
            compute = cp.cuda.ExternalStream(info.stream)   # producer's stream (CAI v3)
        else:
            compute = cp.cuda.get_current_stream()
        with cp.cuda.Device(self.device):
            ready = cp.cuda.Event(disable_timing=True)
            ready.record(compute)
            self.stream.wait_event(ready)
            if wire == 'float32':
                self.lib.all_reduce(info.ptr, info.ptr, info.count, NCCL_FLOAT32, nccl_op,
                                    self._nccl, self.stream.ptr)
            else:
                self._wire_allreduce(buf, info, wire)
            done = cp.cuda.Event(disable_timing=True)
            done.record(self.stream)
        handle = NCCLHandle(buf, name, done, self, sync=self.sync_wait)
        # Keep buffers referenced until NCCL is through with them: CuPy's
        # pool could otherwise hand the memory to the compute stream while
        # the comm stream still reads it.
        self._inflight = [h for h in self._inflight if not h.done()]
        self._inflight.append(handle)
        return handle

    def _wire_allreduce(self, buf, info, wire):
        """Cast to ``wire``, NCCL's 16-bit sum, cast back: all on the comm stream."""
        cp = self._cp
        with self.stream:
            x = cupy_view(cp, buf, info)
            w = device_to_wire(cp, x, wire)
            self.lib.all_reduce(w.data.ptr, w.data.ptr, w.size,
                                NCCL_FLOAT16 if wire == 'float16' else NCCL_BFLOAT16,
                                NCCL_SUM, self._nccl, self.stream.ptr)
            device_from_wire(cp, w, x, wire)
        # freed by CuPy's stream-ordered pool after the cast back is queued

    def allreduce(self, buf, op='sum', label=None):
        """Reduce device ``buf`` over all ranks in place with ``op``; returns once
        the host can read it."""
        from .base import check_op
        nccl_op = {'sum': NCCL_SUM, 'max': NCCL_MAX, 'min': NCCL_MIN}[check_op(op)]
        self._start(buf, label, 'float32', nccl_op).wait(sync=True)
        return buf

    def _raise_async_error(self, name):
        if self._nccl is None:
            return
        code = self.lib.comm_async_error(self._nccl)
        if code:
            raise NCCLError('ncclAllReduce(%r)' % (name,), code, self.lib.error_string(code))

    def abort(self, code=1):
        if self._nccl is not None:
            try:   # unblock any kernel waiting on a dead peer before MPI kills us
                self.lib.comm_abort(self._nccl)
            except Exception:
                pass
            self._nccl = None
        from .abort_alone import run_before_abort
        run_before_abort(code)           # the rank's note for the launcher, as the MPI backends
        self.comm.Abort(code)

    def close(self):
        if self._nccl is None:
            return
        self.stream.synchronize()
        self._inflight = []
        comm, self._nccl = self._nccl, None
        self.lib.comm_destroy(comm)
        self._free_objects()

    def describe(self):
        try:
            dev = 'cuda:%d' % self.device
        except AttributeError:
            dev = 'no device'
        # CuPy >= 14 reads the stream's priority back (as clamped by CUDA).
        prio = getattr(getattr(self, 'stream', None), 'priority', None)
        prio = '' if prio is None else ', comm stream priority %s' % prio
        return 'nccl rank %d/%d (NCCL %s from %s, %s%s, size_check=%s)' % (
            self.rank, self.size, self.lib.version_string(), self.lib.source, dev, prio,
            self.size_check)


def cupy_view(cp, buf, info):
    """A CuPy array over ``buf``'s device memory (no copy), for the casts.

    A pygpu bucket (the trainer's flat device gradient) has no
    ``__cuda_array_interface__`` for ``cupy.asarray``: its address, from
    ``info`` (:func:`~.nccl_buffers.float32_device_buffer`), is wrapped
    as memory CuPy does not own, kept alive by ``buf``.
    """
    if info.kind == 'cupy':
        return cp.asarray(buf)
    mem = cp.cuda.UnownedMemory(info.ptr, 4 * info.count, buf, info.device
                                if info.device is not None else -1)
    return cp.ndarray((info.count,), dtype=cp.float32, memptr=cp.cuda.MemoryPointer(mem, 0))


# float32 bits -> bfloat16 bits: the rounding of wire.float32_to_bfloat16
# (nearest, ties to even; NaN kept quiet), fused into one kernel. Composed
# of CuPy's array operations it took 1.04 ms for a 64 MB bucket on an H200,
# each step a pass over memory with a temporary (float16's cast: 0.20 ms).
_BF16_SRC = """
unsigned int a = u & 0x7FFFFFFFu;
r = (a > 0x7F800000u) ? (unsigned short)((u >> 16) | 0x0040u)
                      : (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
"""
_BF16_KERNELS = {}


def _bfloat16_kernel(cp):
    kernel = _BF16_KERNELS.get(cp)
    if kernel is None:
        kernel = _BF16_KERNELS[cp] = cp.ElementwiseKernel(
            'uint32 u', 'uint16 r', _BF16_SRC, 'theanompi_ext_to_bfloat16')
    return kernel


def device_to_wire(cp, x, wire):
    """The 16-bit copy (uint16 bits) of CuPy float32 array ``x``, on the current stream."""
    if wire == 'float16':
        return x.astype(cp.float16).view(cp.uint16)
    return _bfloat16_kernel(cp)(cp.ascontiguousarray(x).reshape(-1).view(cp.uint32))


def device_from_wire(cp, w, x, wire):
    """Cast 16-bit bits ``w`` back into ``x`` in place, on the current stream."""
    if wire == 'float16':
        x[...] = w.view(cp.float16).reshape(x.shape)
    else:
        bfloat16_to_float32(w, x, xp=cp)


__all__ = ['NCCLCommunicator', 'NCCLHandle', 'cupy_view', 'device_from_wire', 'device_to_wire',
           'greatest_priority']
