"""The per-rank trainer: data -> forward/backward -> buckets -> collective -> update.

One :class:`Trainer` per rank. Every rank builds the same model from the
same seed, checks that its parameters and bucket plan match the other
ranks' before the first step, then runs identical iterations (the number
of steps per epoch is the same everywhere, see :mod:`theanompi_ext.data.shards`).
"""
import contextlib
import time

import numpy as np

from ..params import tags_of
from ..data import shards
from ..collective.watchdog import watch
from ..engine.core import on_device
from ..exchange.modes import OVERLAP
from ..step.assemble import assemble_step, compile_in_turn, make_schedule
from ..step.run import RunsStep, Step
from . import checkpoint_request, faults, replicas


class Trainer(RunsStep):
    """Trains ``net`` on ``dataset`` with the options ``cfg`` over ``comm``.

    ``bn_groups`` > 1 is for single-process references that emulate k
    workers (BN statistics per group of n). ``max_chunks`` caps the
    overlapped backward's chunks (benchmarks; None: one per layer).
    """

    def __init__(self, net, dataset, cfg, comm, bn_groups=1, log=print, max_chunks=None):
        cfg = cfg.validate()      # a checked copy: the caller's cfg stays as it is
        # Waits inside a step are bounded and reported (docs/faults.md).
        comm = watch(comm, cfg.collective_timeout_s, cfg.stall_warn_s)
        self.net, self.data, self.cfg, self.comm = net, dataset, cfg, comm
        self.log = log if comm.rank == 0 and not cfg.quiet else (lambda *a, **k: None)
        k, n = comm.size, cfg.batch_per_worker
        self.k, self.n = k, n
        # The batch this process computes on: n per worker, or kn when one
        # process stands for k workers (bn_groups).
        self.local_batch = n * bn_groups
        self.total_batch = k * self.local_batch
        params = net.params
        # params, layout, n_exch, buckets, exchanger, rule, ... on the host or
        # the device (step/assemble.py)
        parts = assemble_step(comm, params, [tags_of(p) for p in params], cfg, k * bn_groups,
                              names=[p.name for p in params])
        parts.install(self)
        self.max_chunks = max_chunks
        self.backward = compile_in_turn(comm, lambda: self._build_backward(bn_groups))
        self.iters_per_epoch = shards.iterations_per_epoch(len(dataset.y_train), k * bn_groups, n)
        self.schedule = make_schedule(cfg, self.total_batch, self.iters_per_epoch, cfg.epochs,
                                      workers=k * bn_groups)
        self.iteration = 0
        self._step = Step(comm, parts, self.backward, cfg.exch_strategy == OVERLAP,
                          self.iters_per_epoch)
        self.timeline = self.make_timeline() if cfg.timeline else None
        self._evaluator = None
        self.history = []
        self.checkpoint_s = []    # seconds of each checkpoint written (the summary's cost)
        from .attempt import AttemptHooks
        self.attempt = AttemptHooks(comm.rank)

    # -- construction --------------------------------------------------------
    def _build_backward(self, bn_groups):
        from ..backward.monolithic import MonolithicBackward
        scale = 1.0 / self.total_batch
        if self.cfg.exch_strategy == OVERLAP:
            from ..backward.chunked import ChunkedBackward
            return ChunkedBackward(self.net, self.params.vars, scale, bn_groups,
                                   device_io=on_device(), max_chunks=self.max_chunks)
        return MonolithicBackward(self.net, self.params.vars, scale, bn_groups,
                                  device_io=on_device())

    # -- one step ---------------------------------------------------------------
    def batch_indices(self, perm, it_in_epoch):
        """This process's example indices for an iteration."""
        if self.local_batch == self.n:
            return shards.shard_indices(perm, it_in_epoch, self.comm.rank, self.k, self.n)
        return shards.global_indices(perm, it_in_epoch, self.total_batch // self.n, self.n)

    def step(self, x, y):
        """One synchronous SGD step on this rank's batch (:class:`~theanompi_ext.step.run.Step`);
        returns global (loss, err) means and the rate."""
        lr = self.schedule.lr(self.iteration)
        out = self._step.run(x, y, lr, self.iteration, len(y))
        self.exchange_wait_s = out.exchange_wait_s
        self.iteration += 1
        return np.float32(out.loss_sum) / np.float32(out.count), \
            np.float32(out.err_sum) / np.float32(out.count), lr

    # -- epochs -------------------------------------------------------------
    def evaluate(self, batch=256):
        """Global validation (loss, top-1 error, top-5 error) with BN running stats."""
        if self._evaluator is None:
            from ..backward.graph import Evaluator
            self._evaluator = Evaluator(self.net)
        idx = np.arange(self.comm.rank, len(self.data.y_val), self.comm.size)
        tot = np.zeros(4, np.float32)
        for s in range(0, len(idx), batch):
            x, y = self.data.val_batch(idx[s:s + batch])
            tot[:3] += self._evaluator(x, y)
            tot[3] += len(y)
        self.comm.allreduce(tot)
        return tuple(float(v) for v in tot[:3] / max(tot[3], 1))

    def train(self):
        """Run the configured epochs; return the summary dict (rank 0 logs progress).

        The next batch is prepared on a background thread while the current
        step runs; the time a step waited for data is reported per epoch.
        With ``cfg.out`` set, a checkpoint is written after every epoch (or
        every ``cfg.checkpoint_every`` iterations).
        """
        from .progress import Progress
        cfg = self.cfg
        progress = Progress.for_trainer(self)
        t_start = time.perf_counter()
        step_times = []
        partial = self._partial or {}
        # Ranks that disagree on data or options would hang; the allgather also
        # absorbs compile/resume skew before the step timeouts apply.
        faults.check_ranks_agree(self)
        self._last_save_t = time.monotonic()
        for epoch in range(self.iteration // self.iters_per_epoch, cfg.epochs):
            perm = shards.epoch_permutation(len(self.data.y_train), epoch, cfg.data_seed)
            first = self.iteration % self.iters_per_epoch
            last = self.iters_per_epoch
            if cfg.max_steps:
                last = min(last, first + max(cfg.max_steps - self.iteration, 0))
            t_ep = time.perf_counter()
            losses, errs = partial.get('losses', []), partial.get('errs', [])
            partial = {}
            lr, data_wait_s = self._epoch_steps(epoch, perm, (first, last), losses, errs,
                                                progress, step_times)
            if last < self.iters_per_epoch or not losses:
                # max_steps reached inside this epoch: keep what was done
                if cfg.out and cfg.checkpoint and losses:
                    self.save_checkpoint({'losses': losses, 'errs': errs})
                break
            rec = self._epoch_record(epoch, losses, errs, lr, time.perf_counter() - t_ep,
                                     data_wait_s)
            self.history.append(rec)
            self.log(format_epoch(rec, cfg.epochs))
            if cfg.out and cfg.checkpoint:
                self.save_checkpoint()
                self._after_signalled_checkpoint()   # asked for at the epoch's last step
        if self.timeline is not None:
            # written with the other final outputs (worker.write_outputs)
            self.trace = self.timeline.gather(self.comm)
        return self.summary(time.perf_counter() - t_start, step_times)

    def _epoch_steps(self, epoch, perm, span, losses, errs, progress, step_times):
        """Iterations ``span = (first, last)`` (last excluded) of ``epoch``, appending
        to ``losses``, ``errs`` and ``step_times``; returns (the last learning
        rate, seconds the steps waited for data)."""
        from ..data.prefetch import Prefetcher
        first, last = span
        progress.start_epoch(epoch, first)
        batches = Prefetcher(self.data.train_batch,
                             (self.batch_indices(perm, it) for it in range(first, last)))
        lr = None
        try:
            for it, (x, y) in zip(range(first, last), batches):
                t0 = time.perf_counter()
                loss, err, lr = self.step(x, y)
                step_times.append(time.perf_counter() - t0)
                if self.first_step_unix is None:
                    self.first_step_unix = time.time()   # training again, after a restart
                replicas.after_step(self)
                self.attempt.after_step(self.iteration)
                losses.append(float(loss))
                errs.append(float(err))
                progress.step(it + 1, self.iteration, loss, batches.wait_s,
                              self.exchange_wait_s)
                if self._checkpoint_due(it + 1):
                    self.save_checkpoint({'losses': losses, 'errs': errs})
                    self._after_signalled_checkpoint()
        finally:
            batches.close()
            progress.end_epoch()
        return lr, batches.wait_s

    def _epoch_record(self, epoch, losses, errs, lr, epoch_s, data_wait_s):
        """The history entry of a finished epoch (evaluated when due)."""
        cfg = self.cfg
        rec = dict(epoch=epoch + 1, train_loss=float(np.mean(losses)),
                   train_err=float(np.mean(errs)), lr=float(lr),
                   epoch_s=epoch_s, data_wait_s=data_wait_s)
        if (epoch + 1) % cfg.eval_every == 0 or epoch + 1 == cfg.epochs:
            rec['val_loss'], rec['val_top1'], rec['val_top5'] = self.evaluate()
        rec.update(replicas.epoch_fields(self))
        return rec

    # -- checkpoints and progress --------------------------------------------
    _partial = None
    exchange_wait_s = 0.0
    _saved_at = None      # the iteration of the last checkpoint written or resumed
    _last_save_t = 0.0    # monotonic time of the last checkpoint (or of the start)
    checkpoint_signalled = None   # the signal that asked for the next checkpoint
    first_step_unix = None   # wall-clock time this process finished its first step
    trace = None          # rank 0: the gathered timeline, once train() ends

    def _checkpoint_due(self, it_in_epoch):
        """Whether every rank writes a checkpoint after this iteration (the end of
        an epoch writes one anyway). Every rank reaches the same answer: the
        clock is rank 0's and a signal's request any rank's, both summed in one
        small allreduce per step where either is on; a request is noted in
        ``self.checkpoint_signalled`` for the log and the stop."""
        cfg = self.cfg
        mid_epoch = bool(cfg.out and cfg.checkpoint and it_in_epoch < self.iters_per_epoch)
        every = mid_epoch and cfg.checkpoint_every and self.iteration % cfg.checkpoint_every == 0
        clock = mid_epoch and not every and cfg.checkpoint_every_s > 0
        if not (clock or cfg.checkpoint_signal):
            return bool(every)
        clock_due = clock and self.comm.rank == 0 and \
            time.monotonic() - self._last_save_t >= cfg.checkpoint_every_s
        asked, clock_due = checkpoint_request.vote(self.comm, self.iteration,
                                                   cfg.collective_timeout_s, clock_due)
        if asked:
            self.checkpoint_signalled = checkpoint_request.number(cfg.checkpoint_signal)
        return bool(every or (asked and mid_epoch) or clock_due)

    def _after_signalled_checkpoint(self):
        """Log the checkpoint a signal asked for; with ``--on-checkpoint-signal stop``
        end every rank here (:class:`~theanompi_ext.errors.StoppedToResume`)."""
        signum, self.checkpoint_signalled = self.checkpoint_signalled, None
        if signum is None:
            return
        end = self.cfg.total_iterations(self.iters_per_epoch)
        checkpoint_request.after_checkpoint(signum, self.cfg.on_checkpoint_signal,
                                            self.iteration, self.checkpoint_path(),
                                            self.iteration >= end, self.log)

    def checkpoint_path(self):
        """Where this run's checkpoint lives."""
        import os
        from .checkpoint import FILENAME
        return os.path.join(self.cfg.out, FILENAME)

    def save_checkpoint(self, partial=None):
        """Write the checkpoint (all ranks take part; rank 0 writes).

        The whole of it is one watched wait bounded by ``write_timeout_s``
        on every rank, so a writer hung in I/O (or stopped) ends the job
        with its rank and the file named (docs/faults.md).
        """
        from . import checkpoint
        if self.iteration == self._saved_at:
            return    # this state is on disk already (e.g. max_steps on a checkpoint step)
        path = self.checkpoint_path()
        t0 = time.perf_counter()
        with self.writing('checkpoint %s (written by rank 0)' % path, path):
            checkpoint.save(self, path, partial, in_write=self.attempt.in_write)
            self.comm.barrier()   # rank 0's write must not count against the next step
        self._saved_at = self.iteration
        self._last_save_t = time.monotonic()
        self.checkpoint_s.append(time.perf_counter() - t0)

    @contextlib.contextmanager
    def writing(self, label, path):
        """The phase in which rank 0 writes ``path`` and the others wait for it.

        Bounded by ``write_timeout_s``; SIGTERM/SIGHUP/SIGINT wait for its end
        on every rank (a rank that died meanwhile would make hydra kill the
        writer mid-write), so a job told to stop finishes the write first.
        """
        from ..files.signals import deferred_signals
        note = 'this rank (the writer) has not finished writing %s' % path \
            if self.comm.rank == 0 else None
        with deferred_signals(), self.comm.bounded(self.iteration, label,
                                                   self.cfg.write_timeout_s,
                                                   'write_timeout_s', note):
            yield

    def resume(self):
        """Continue from the checkpoint in ``cfg.out``."""
        from . import checkpoint
        self._partial = checkpoint.load(self, self.checkpoint_path())
        self._saved_at = self.iteration
        a = self.attempt
        self.log('%sresumed from %s at iteration %d' % (
            'restart %d of %d: ' % (a.attempt, a.max_restarts) if a.attempt else '',
            self.checkpoint_path(), self.iteration))

    def summary(self, wall_s, step_times):
        """Run summary: errors, times, settings."""
        last = [h for h in self.history if 'val_top1' in h]
        st = sorted(step_times[1:] or step_times)  # first step pays warm-up costs
        return dict(workers=self.k, batch_per_worker=self.n, total_batch=self.total_batch,
                    iterations=self.iteration, wall_s=wall_s,
                    step_s_median=float(np.median(st)) if st else None,
                    final_val_top1=last[-1]['val_top1'] if last else None,
                    final_val_top5=last[-1]['val_top5'] if last else None,
                    history=self.history, config=self.cfg.to_dict(),
                    checkpoints=checkpoint_cost(self.checkpoint_s, wall_s),
                    first_step_unix=self.first_step_unix,
                    **replicas.summary_fields(self))


def checkpoint_cost(seconds, wall_s):
    """The summary's record of the checkpoints this process took part in: how many,
    seconds each (mean, largest), their share of the run's time."""
    total = float(sum(seconds))
    return dict(count=len(seconds), mean_s=total / len(seconds) if seconds else None,
                max_s=max(seconds) if seconds else None, total_s=total,
                share=total / wall_s if wall_s > 0 else None)


def format_epoch(rec, epochs):
    """One progress line for an epoch record."""
    s = 'epoch %3d/%d  loss %.4f  train err %.3f  lr %.4f  %.1fs' % (
        rec['epoch'], epochs, rec['train_loss'], rec['train_err'], rec['lr'], rec['epoch_s'])
    if 'val_top1' in rec:
        s += '  val top1 %.3f top5 %.3f' % (rec['val_top1'], rec['val_top5'])
    return s
