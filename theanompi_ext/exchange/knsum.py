"""The kn-sum gradient exchange over buckets (serial and started forms).

Handle discipline (as Horovod's): every bucket of the plan is started once
per step, in plan order on every rank, and every started handle is waited
for, on the error paths too (:meth:`KnSumExchanger.drain`,
:meth:`KnSumExchanger.settling`): a transfer left running would write into
a gradient buffer the next step reuses, and its unmatched partner on the
other ranks would wait for it.
"""
import contextlib

from ..collective.base import check_wire, drain, wait_all
from ..errors import IncompleteExchange


class KnSumExchanger(object):
    """Sums each bucket of the flat gradient across ranks.

    Only the exchanged prefix of the gradient (``n_exchanged_entries``) is
    touched; the local tail is the update's (:mod:`theanompi_ext.update.policy`).
    ``wire``: what the buckets travel as (``float32``, ``float16``,
    ``bfloat16``; summed in float32 either way, see collective/wire.py);
    a backend that cannot send it is refused here, by name.
    """

    def __init__(self, comm, buckets, n_exchanged_entries, wire='float32'):
        if wire != 'float32':
            check_wire(comm, wire)
        # Only a 16-bit wire is passed on: float32 keeps the plain call.
        self._wire_kw = {'wire': wire} if wire != 'float32' else {}
        self.wire = wire
        self.comm = comm
        self.buckets = buckets
        self.n_exch = n_exchanged_entries
        self._started = []       # this step's (bucket index, handle), in start order
        self._next = 0           # next bucket for start_ready
        self.last_handles = []   # the last finished step's handles (for the timeline)

    def start(self, bucket, grads):
        """Start bucket ``bucket``'s allreduce (its gradients are final)."""
        if any(i == bucket for i, _ in self._started):
            raise ValueError('bucket%d started twice in one step' % self.buckets[bucket].index)
        self._started.append((bucket, self._start(self.buckets[bucket], grads)))

    def _start(self, b, grads):
        """The handle of bucket ``b``'s started allreduce."""
        return self.comm.start_allreduce(grads[b.start:b.stop], name='bucket%d' % b.index,
                                         **self._wire_kw)

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

    def _take(self):
        """This step's started ``(bucket, handle)`` pairs (the step is over for
        the exchanger). Refuses a step that did not start every bucket of the
        plan, after waiting for those it did start."""
        started, self._started = self._started, []
        self._next = 0
        self.last_handles = [h for _, h in started]
        missing = sorted(set(range(len(self.buckets))) - {i for i, _ in started})
        if missing:
            drain(self.last_handles)
            raise IncompleteExchange(
                'finish() before every bucket was started: %s of the %d buckets of the plan '
                'not started (the %d started were waited for)'
                % (', '.join('bucket%d' % self.buckets[i].index for i in missing),
                   len(self.buckets), len(started)))
        return started

    def finish(self, grads):
        """Wait for every bucket of the plan (refused unless all were started)."""
        started = self._take()
        wait_all([h for _, h in started])
        return self.last_handles

    def drain(self):
        """Wait for every handle started this step, ignoring their failures, and
        forget them: the error path of a step that will not finish."""
        started, self._started = self._started, []
        self._next = 0
        drain([h for _, h in started])

    @contextlib.contextmanager
    def settling(self):
        """Context of a step's exchange: an ``Exception`` raised inside drains
        the started handles (:meth:`drain`) before it propagates.

        ``KeyboardInterrupt``/``SystemExit`` are not drained: the job is being
        stopped, and waiting for peers that stop too could hang.
        """
        try:
            yield self
        except Exception:
            self.drain()
            raise

    def reduce(self, grads):
        """Serial form: all buckets, after the whole backward pass."""
        for i in range(len(self.buckets)):
            self.start(i, grads)
        return self.finish(grads)
