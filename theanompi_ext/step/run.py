"""The one run of a synchronous step, for the trainer and the Theano-MPI stepper alike.

:meth:`Step.run`, on every rank, in this order::

    arm the watchdog for this iteration
    backward (chunked: each bucket started as its gradients become final)
      └ host: every final gradient entry checked finite before it is sent
    the loss statistics allreduced (loss sum, error sum, examples, ranks
      with a non-finite gradient): one finiteness rule, one error class
      (:class:`~theanompi_ext.errors.NonFiniteLoss`), raised on every rank
      before anything is updated
    the exchange finished (overlapped) or run (serial, ``rule.exchanges_gradient``)
    the rule's update (:mod:`theanompi_ext.update.rules`), the parameters pushed
    the timeline recorded (when one is kept), the watchdog disarmed

Only this module starts and finishes a gradient exchange; rules only update.
An error inside waits for every started bucket first (the exchanger's
``settling``), so no transfer is left writing into the next step's buffers.
"""
import time
from collections import namedtuple

import numpy as np

from ..errors import NonFiniteLoss

#: What :meth:`Step.run` returns: the global sums of the loss, the error and
#: the examples (over ranks), this rank's own (loss, err) as the backward
#: returned them, and the seconds the step waited for the exchange.
Outcome = namedtuple('Outcome', 'loss_sum err_sum count local_loss local_err exchange_wait_s')


class Step(object):
    """The step of one rank: the assembled parts (:class:`~.assemble.StepParts`),
    the backward pass, and the watched communicator.

    ``comm`` must be a watched communicator (``arm``/``disarm``,
    :func:`~theanompi_ext.collective.watchdog.watch`). ``backward.run(x, y,
    grads, layout, on_chunk)`` fills the flat gradient and returns this
    rank's (loss, error) sums; ``overlapped`` starts buckets from its
    ``on_chunk`` reports. ``iters_per_epoch`` names the epoch in errors.
    ``timeline``: a :class:`~theanompi_ext.exchange.timeline.Timeline` to
    record each step in, or None.
    """

    def __init__(self, comm, parts, backward, overlapped, iters_per_epoch, timeline=None):
        self.comm, self.parts, self.backward = comm, parts, backward
        self.overlapped = bool(overlapped)
        self.iters_per_epoch = max(int(iters_per_epoch), 1)
        self.timeline = timeline
        # The gradient is on the host (checked entry by entry) or on a device
        # (left there: the loss statistics are checked, as the loss shows it).
        self.host_grads = parts.device_grads is None
        self._stats = np.zeros(4, np.float32)
        self._checked = 0          # gradient entries checked finite so far this step
        self._bad = False

    def make_timeline(self):
        """A :class:`~theanompi_ext.exchange.timeline.Timeline` of this rank whose
        trace carries each backward chunk's exchanged gradient sizes (what
        ``simulate --layers`` reads)."""
        from ..exchange.timeline import Timeline, chunk_grad_sizes
        timeline = Timeline(self.comm.rank)
        if hasattr(self.backward, 'chunk_params'):
            timeline.chunk_grads = chunk_grad_sizes(self.backward.chunk_params,
                                                    self.parts.layout, self.parts.n_exch_params)
        return timeline

    # -- finiteness -------------------------------------------------------------
    def _check_final(self, n_ready):
        """Check the entries of the first ``n_ready`` parameters not yet checked."""
        layout, grads = self.parts.layout, self.parts.grads
        end = layout.offsets[n_ready] if n_ready < len(layout) else layout.total
        if end > self._checked:
            if not self._bad and not np.isfinite(grads[self._checked:end]).all():
                self._bad = True
            self._checked = end

    def _on_chunk(self, chunk, n_ready):
        """The backward's report: check what became final, then start its buckets
        (a rank sends what it checked; the flag reaches every rank with the loss)."""
        if self.host_grads:
            self._check_final(n_ready)
        self.parts.exchanger.start_ready(n_ready, self.parts.grads)

    def _raise_if_not_finite(self, iteration):
        loss, _, _, bad = self._stats
        epoch = iteration // self.iters_per_epoch
        if not np.isfinite(self._stats[:3]).all():
            raise NonFiniteLoss('non-finite loss (%r) at iteration %d (epoch %d); training '
                                'stopped before the update' % (float(loss), iteration, epoch))
        if bad:
            raise NonFiniteLoss('non-finite gradient on %d of %d ranks (loss %r) at iteration '
                                '%d (epoch %d); training stopped before the update'
                                % (int(bad), self.comm.size, float(loss), iteration, epoch))

    # -- the step ---------------------------------------------------------------
    def run(self, x, y, lr, iteration, count):
        """One synchronous step on this rank's batch ``(x, y)`` of ``count``
        examples at rate ``lr``; returns an :class:`Outcome`."""
        clock = time.perf_counter
        parts, comm = self.parts, self.comm
        exchanger, grads = parts.exchanger, parts.grads
        t_begin = clock()
        comm.arm(iteration)
        self._checked, self._bad = 0, False
        on_chunk = self._on_chunk if self.overlapped else None
        with exchanger.settling():      # an error waits for the started buckets first
            loss, err = self.backward.run(x, y, grads, parts.layout, on_chunk)
            t_backward = clock()
            if self.host_grads:
                self._check_final(len(parts.layout))     # the rest: local tail, serial
            self._stats[...] = (loss, err, count, 1.0 if self._bad else 0.0)
            comm.allreduce(self._stats, label='loss stats')
            t_stats = clock()
            self._raise_if_not_finite(iteration)
            if self.overlapped:
                exchanger.finish(grads)
            t_wait = clock()
            if not self.overlapped and parts.rule.exchanges_gradient:
                exchanger.reduce(grads)
        parts.rule.update(parts.params.values if self.host_grads else None, grads, lr)
        parts.params.push()
        t_end = clock()
        # Waited for the exchange: the loss allreduce and the buckets' finish;
        # without overlap the serial exchange (and the update) too.
        wait_s = (t_wait if self.overlapped else t_end) - t_backward
        if self.timeline is not None:
            self.timeline.record_train_step(
                iteration, (t_begin, t_backward, t_stats, t_wait, t_end),
                getattr(self.backward, 'times', None), exchanger.last_handles,
                self.overlapped, copies=getattr(exchanger, 'copies', ()))
        comm.disarm()
        return Outcome(float(self._stats[0]), float(self._stats[1]), float(self._stats[2]),
                       loss, err, wait_s)


class RunsStep(object):
    """What the trainer and the Theano-MPI stepper alike say of the :class:`Step`
    they run (``self._step``): its timeline, and a fresh one."""

    @property
    def timeline(self):
        """The step's :class:`~theanompi_ext.exchange.timeline.Timeline` (None: none
        kept)."""
        return self._step.timeline

    @timeline.setter
    def timeline(self, timeline):
        self._step.timeline = timeline

    def make_timeline(self):
        """A fresh timeline of this rank's step (:meth:`Step.make_timeline`)."""
        return self._step.make_timeline()
