"""Allreduce through pygpu's own NCCL communicator (Theano-MPI's ``gpucomm``).

Where Theano's GPU backend (pygpu/libgpuarray built with NCCL) is
installed, Theano-MPI already holds a ``pygpu.collectives.GpuComm``. Its
documented API (pygpu 0.7)::

    GpuCommCliqueId(context=None)          .comm_id -> bytes (settable)
    GpuComm(cid, ndev, rank)               .count, .rank  (get_count()/get_rank() in older builds)
    comm.all_reduce(src, op, dest=None)    op in '+', 'sum', '*', 'prod', 'max', 'min'
    comm.broadcast(array, root=-1), comm.all_gather(src, dest=None), comm.reduce(...)

``all_reduce`` enqueues ``ncclAllReduce`` on the GpuContext's own stream,
the stream Theano's kernels run on, so stream order already puts the sum
after the gradient that produced it and before the update that reads it;
there is no separate communication stream and therefore no overlap with
compute on the GPU. A started allreduce here is "enqueued", and waiting
costs nothing unless the host must read the result (``sync=True`` calls
``GpuArray.sync()``).

pygpu is not installable from any reachable registry; this class is
written to the documented API and tested against a fake that mirrors it.
"""
from .base import Communicator, Handle, ObjectsOverMPI, check_op, check_timeout, check_wire
from .nccl_buffers import float32_device_buffer
from .nccl_checks import SizeChecked
from .world import world_comm


def _comm_int(gpucomm, attr):
    # pygpu >= 0.7 exposes .count/.rank; earlier builds get_count()/get_rank().
    value = getattr(gpucomm, attr, None)
    if value is None:
        value = getattr(gpucomm, 'get_' + attr)
    return int(value() if callable(value) else value)


def make_gpucomm(context, comm=None):
    """Build a ``pygpu.collectives.GpuComm`` over ``comm``'s ranks (Theano-MPI's recipe).

    Rank 0 makes the clique id on ``context``; MPI broadcasts its bytes;
    every rank builds ``GpuComm(cid, size, rank)`` (collective).
    """
    from pygpu import collectives
    comm = comm if comm is not None else world_comm()
    cid = collectives.GpuCommCliqueId(context=context)
    uid = comm.bcast(bytes(cid.comm_id) if comm.Get_rank() == 0 else None, root=0)
    cid.comm_id = bytearray(uid)
    return collectives.GpuComm(cid, comm.Get_size(), comm.Get_rank())


class PygpuHandle(Handle):
    """An allreduce enqueued on the pygpu context stream (see module docstring)."""

    def __init__(self, buf, name):
        Handle.__init__(self, buf, name)
        self.t_start = self.t_queued

    def done(self):
        """Always True: later pygpu work on this context is ordered after the sum."""
        return True

    def wait(self, timeout=None, sync=False):
        """Return the buffer; with ``sync=True`` block the host until it holds the sum.

        ``timeout`` is refused: ``GpuArray.sync()`` cannot be bounded.
        """
        if check_timeout(timeout, 'timeout') is not None:
            raise ValueError('a pygpu-nccl allreduce cannot be waited for with a timeout '
                             '(GpuArray.sync() blocks until the context is idle); '
                             'wait with timeout=None')
        if sync and hasattr(self.buf, 'sync'):
            self.buf.sync()
        self._finish()      # idempotent
        return self.buf


class PygpuNCCLCommunicator(SizeChecked, ObjectsOverMPI, Communicator):
    """Communicator over a pygpu ``GpuComm`` (device sums) and an MPI comm (host objects).

    ``gpucomm``: a ``pygpu.collectives.GpuComm`` (see :func:`make_gpucomm`);
    ``comm``: the mpi4py communicator of the same ranks (default COMM_WORLD).
    ``size_check`` as for :class:`~.nccl.NCCLCommunicator`.
    """
    name = 'pygpu-nccl'

    def __init__(self, gpucomm, comm=None, size_check='first'):
        self._init_size_check(size_check)
        comm = comm if comm is not None else world_comm()
        self.gpucomm = gpucomm
        self.rank = _comm_int(gpucomm, 'rank')
        self.size = _comm_int(gpucomm, 'count')
        if (self.rank, self.size) != (comm.Get_rank(), comm.Get_size()):
            raise ValueError('gpucomm is rank %d of %d but the MPI comm is rank %d of %d; '
                             'build the gpucomm over the same ranks'
                             % (self.rank, self.size, comm.Get_rank(), comm.Get_size()))
        self._init_objects(comm)

    def start_allreduce(self, buf, name=None, wire='float32'):
        """Enqueue ``all_reduce(buf, '+', buf)`` on the context stream; return a handle."""
        check_wire(self, wire)
        return self._start(buf, name, '+')

    def _start(self, buf, name, op):
        info = float32_device_buffer(buf)
        if info.kind != 'pygpu':
            raise TypeError('PygpuNCCLCommunicator needs a pygpu GpuArray, got %s; use the '
                            '"nccl" backend for CuPy arrays' % type(buf).__name__)
        self._check_size(name, info.count)
        self.gpucomm.all_reduce(buf, op, buf)
        return PygpuHandle(buf, name)

    def allreduce(self, buf, op='sum', label=None):
        """Reduce ``buf`` in place over all ranks with ``op``; returns once the
        host could read it."""
        return self._start(buf, label, {'sum': '+', 'max': 'max', 'min': 'min'}[check_op(op)]
                           ).wait(sync=True)

    def close(self):
        self._free_objects()

    def describe(self):
        return 'pygpu-nccl rank %d/%d (pygpu GpuComm on the context stream)' % (self.rank, self.size)
