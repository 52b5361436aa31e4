"""The kn-sum gradient exchange over buckets (serial and started forms)."""
import numpy as np


class KnSumExchanger(object):
    """Sums each bucket of the flat gradient across ranks.

    The local tail of the gradient (parameters not exchanged) is multiplied
    by ``local_scale`` = k, turning a kn-normalised local gradient into the
    worker's own n-mean (see :mod:`theanompi_ext.update.policy`).
    ``wire``: what the buckets travel as (``float32``, ``float16``,
    ``bfloat16``; summed in float32 either way, see collective/wire.py);
    a backend that cannot send it is refused here, by name.
    """

    def __init__(self, comm, buckets, n_exchanged_entries, local_scale, wire='float32'):
        from ..collective.base import check_wire
        if wire != 'float32':
            check_wire(comm, wire)
        # Only a 16-bit wire is passed on: float32 keeps the plain call.
        self._wire_kw = {'wire': wire} if wire != 'float32' else {}
        self.wire = wire
        self.comm = comm
        self.buckets = buckets
        self.n_exch = n_exchanged_entries
        self.local_scale = np.float32(local_scale)
        self._handles = []
        self._next = 0           # next bucket for start_ready
        self.last_handles = []   # the last finished step's handles (for the timeline)

    def start(self, bucket, grads):
        """Start bucket ``bucket``'s allreduce (its gradients are final)."""
        b = self.buckets[bucket]
        self._handles.append(self.comm.start_allreduce(grads[b.start:b.stop],
                                                       name='bucket%d' % b.index,
                                                       **self._wire_kw))

    def start_ready(self, n_ready, grads):
        """Start, in plan order, every bucket not yet started whose parameters
        are all among the first ``n_ready`` of the flat layout (the backward's
        ``on_chunk`` report)."""
        while self._next < len(self.buckets) and self.buckets[self._next].last <= n_ready:
            self.start(self._next, grads)
            self._next += 1

    def chunk_hook(self, grads):
        """The backward pass's ``on_chunk(chunk, n_ready)`` callback that
        starts buckets of ``grads`` as they become final (:meth:`start_ready`)."""
        return lambda chunk, n_ready: self.start_ready(n_ready, grads)

    def finish(self, grads):
        """Wait for every started bucket; rescale the local tail."""
        handles, self._handles = self._handles, []
        self._next = 0
        self.last_handles = handles
        for h in handles:
            h.wait()
        if self.local_scale != 1 and self.n_exch < grads.size:
            grads[self.n_exch:] *= self.local_scale
        return handles

    def reduce(self, grads):
        """Serial form: all buckets, after the whole backward pass."""
        for i in range(len(self.buckets)):
            self.start(i, grads)
        return self.finish(grads)
