"""The kn-sum of device gradient buckets through NCCL, overlapped with backprop.

For a flat device gradient on a CUDA device where NCCL can run. When the
backward reports a bucket final, its slice of the flat device gradient (a
view: the flat buffer's address + 4 x the bucket's start, no copy) is
summed in place by :meth:`NCCLCommunicator.start_allreduce
<theanompi_ext.collective.nccl.NCCLCommunicator.start_allreduce>`::

    compute stream (pygpu's) ─[chunk c kernels]─●ready ─[chunk c+1]─ ... ─▲─▲─[update]
                                                  ╲                        │ │
    comm stream (NCCL's)                           wait─[allreduce b]─●done┘ │
                                                          ...  [allreduce b+1]─●done┘

1. ``ready`` is recorded on the compute stream right after the chunk's
   gradient kernels were queued (the backward's ``on_chunk`` report);
2. the communication stream waits on ``ready`` (on the GPU: the host
   does not block);
3. ``ncclAllReduce`` (float32 sum, in place) is queued on the
   communication stream and ``done`` recorded after it;
4. ``finish`` (before the update) makes the compute stream wait on every
   bucket's ``done``; the update's kernels are queued there after it.

The compute stream is the pygpu context's own (:mod:`~theanompi_ext.collective.pygpu_stream`),
the one Theano's kernels use. One NCCL communicator spans all ranks (NCCL
builds the node-local and cross-node hierarchy itself). Host objects
(loss statistics, checks, barriers) stay on the trainer's host
communicator. The BN-local tail is not touched here: the device update
scales it (``update/device.py``).
"""
from .knsum import KnSumExchanger


class ComputeStreamHandle(object):
    """A started bucket whose ``wait()`` makes the compute stream (not CuPy's
    current one) wait for the sum; the host does not block. Everything
    else (``t_start``, ``name``, ``done()``...) is the NCCL handle's."""

    def __init__(self, handle, stream):
        self.handle, self.stream = handle, stream

    def __getattr__(self, attr):
        return getattr(self.handle, attr)

    def wait(self, timeout=None):
        return self.handle.wait(timeout, stream=self.stream)


class DeviceNCCLExchanger(KnSumExchanger):
    """:class:`~theanompi_ext.exchange.knsum.KnSumExchanger` over an
    :class:`~theanompi_ext.collective.nccl.NCCLCommunicator` whose
    ``compute_stream`` is the stream the gradients are made (and the
    update runs) on. Every wait of a started bucket (``finish``, and
    ``drain`` on the error paths) is that stream's, so the next kernels on
    it (the update, or the next step's backward) run after the sum."""

    path = 'NCCL'

    def __init__(self, comm, buckets, n_exchanged_entries, wire='float32'):
        KnSumExchanger.__init__(self, comm, buckets, n_exchanged_entries, wire)
        if comm.compute_stream is None:
            raise ValueError('DeviceNCCLExchanger needs an NCCLCommunicator built with '
                             'compute_stream= (the stream the gradients are computed on)')
        self.compute_stream = comm.compute_stream

    def _start(self, b, grads):
        """Start bucket ``b``'s in-place allreduce on its view of ``grads`` (no copy)."""
        return ComputeStreamHandle(KnSumExchanger._start(self, b, grads), self.compute_stream)


def cuda_ordinal(device):
    """``'cuda1'`` -> 1; ``'cuda'`` -> None (NCCLCommunicator binds by local rank)."""
    if not device.startswith('cuda'):
        raise ValueError('NCCL needs a CUDA device, got %r' % (device,))
    return int(device[4:]) if device[4:] else None


def nccl_exchanger(host_comm, device, context, buckets, n_exchanged_entries,
                   communicator=None, wire='float32'):
    """A :class:`DeviceNCCLExchanger` over one NCCL communicator of all ranks.

    ``host_comm``: the trainer's host communicator (its mpi4py ranks are
    the NCCL ranks; it keeps the loss statistics); ``device``: the Theano
    device string (``cuda0``); ``context``: its pygpu context, whose stream
    the gradients are computed on. The whole bucket plan is checked
    across ranks once, here. ``communicator``: the NCCLCommunicator class
    (tests inject one built on fakes). ``wire``: what the buckets travel as
    (a 16-bit wire is cast on the comm stream, NCCL sums the 16-bit copy).
    """
    from ..collective.pygpu_stream import context_stream
    if communicator is None:
        from ..collective.nccl import NCCLCommunicator as communicator
    comm = communicator(comm=getattr(host_comm, 'comm', None), device=cuda_ordinal(device),
                        compute_stream=context_stream(context))
    comm.check_plan([('bucket%d' % b.index, b.stop - b.start) for b in buckets])
    return DeviceNCCLExchanger(comm, buckets, n_exchanged_entries, wire)
