"""Theano-MPI's ``gpucomm`` for the gradient sums, host MPI for everything else.

Theano-MPI's worker hands its exchanger a ``pygpu.collectives.GpuComm``
(``gpucomm``, NCCL over all ranks) and the pygpu context ``ctx`` of the
model's device. :class:`GpuCommExchange` is the communicator the
contract stepper then runs on:

* ``start_allreduce`` (the gradient buckets) goes through
  ``gpucomm.all_reduce(dev, '+', dev)``
  (:class:`~.pygpu_nccl.PygpuNCCLCommunicator`): a pygpu array on ``ctx``
  is summed in place; a host (numpy) bucket, which is what the contract
  stepper's flat gradient is, is copied into a device buffer on ``ctx``,
  summed there and read back when waited for;
* ``allreduce`` of host buffers (the finite-gradient vote, loss
  statistics), ``allgather``, ``bcast`` and ``barrier`` stay on the host
  MPI communicator, as they are small host objects.

Tested against a fake ``GpuComm`` only (pygpu's collectives need CUDA
and NCCL); not yet run on a GPU.
"""
import numpy as np

from .base import Communicator, Handle
from .pygpu_nccl import PygpuNCCLCommunicator


class StagedGpuHandle(Handle):
    """A host bucket summed through a device copy: :meth:`wait` reads the sum back."""

    def __init__(self, host, dev, inner, name=None):
        Handle.__init__(self, host, name)
        self.t_start = self.t_queued
        self.dev, self._inner = dev, inner

    def wait(self, timeout=None):
        """Block until ``host`` holds the sum (pygpu's read waits for the context)."""
        if not self._done:
            self._inner.wait(timeout)
            self.dev.read(self.buf)
            self._finish()
        return self.buf


class GpuCommExchange(Communicator):
    """Buckets through ``gpucomm`` (NCCL), small host objects through ``host``.

    ``gpucomm``: Theano-MPI's ``pygpu.collectives.GpuComm``; ``ctx``: the
    pygpu context it was built on; ``host``: our host communicator over the
    same ranks (an :class:`~.mpi.MPICommunicator`). ``to_device``: makes
    the device copy of a host bucket (default ``pygpu.gpuarray.array(a,
    context=ctx)``; tests inject one).
    """
    name = 'pygpu-nccl'

    def __init__(self, gpucomm, ctx, host, to_device=None):
        self.host = host
        self.device = PygpuNCCLCommunicator(gpucomm, host.comm)
        self.rank, self.size = host.rank, host.size
        self.ctx = ctx
        self._to_device = to_device if to_device is not None else self._pygpu_array

    def _pygpu_array(self, a):
        import pygpu
        return pygpu.gpuarray.array(a, context=self.ctx)

    def start_allreduce(self, buf, name=None, wire='float32'):
        """Sum ``buf`` over the ranks through ``gpucomm`` (see module docstring)."""
        if isinstance(buf, np.ndarray):
            dev = self._to_device(buf)
            return StagedGpuHandle(buf, dev, self.device.start_allreduce(dev, name, wire), name)
        return self.device.start_allreduce(buf, name, wire)

    def allreduce(self, buf, op='sum', label=None):
        """Host buffers over MPI, device buffers through ``gpucomm``."""
        if isinstance(buf, np.ndarray):
            return self.host.allreduce(buf, op=op, label=label)
        return self.device.allreduce(buf, op=op, label=label)

    def allgather(self, obj, label=None):
        return self.host.allgather(obj, label=label)

    def allgather_bounded(self, obj, timeout_s, label=None):
        return self.host.allgather_bounded(obj, timeout_s, label=label)

    def bcast(self, obj, root=0, label=None):
        return self.host.bcast(obj, root, label=label)

    def barrier(self, timeout_s=None, label=None):
        return self.host.barrier(timeout_s, label=label)

    def abort(self, code=1):
        self.host.abort(code)

    def close(self):
        self.device.close()
        self.host.close()

    def describe(self):
        return '%s; host objects over %s' % (self.device.describe(), self.host.describe())
