"""The program each rank runs for a Theano-MPI model under :class:`theanompi_ext.BSP`.

usage (started by ``BSP.init`` / ``tmlauncher`` through mpiexec)::

    python -u -m theanompi_ext.theanompi_compat.worker MODELFILE MODELCLASS SYNC_TYPE \
        EXCH_STRATEGY DEVICES

``DEVICES`` is the comma-separated device list, one entry per rank: rank
r computes on entry r (Theano-MPI's ``cudaN``, ``openclP:D``; ``cpu``/``cpuN``
is the host backend, as before). The engine is configured for that device
before the model file imports Theano; a device that cannot be opened stops
every rank (exit 2). Options of the exchange
(warm-up, reference batch, ...) arrive as ``THEANOMPI_EXT_<NAME>``
environment variables, see :data:`theanompi_ext.theanompi_compat.options.OPTION_DEFAULTS`.

The loop mirrors Theano-MPI's BSP worker: build ``modelclass(config)``,
``compile_iter_fns(sync_type)``, then per epoch the training file batches,
each in ``model.n_subb`` sub-batches (the model's ``train_iter``, whose
call of ``train_iter_fn`` runs our gradient + exchange + update, see
:mod:`~theanompi_ext.theanompi_compat.train_fn`: one iteration per
sub-batch), a validation pass over every sub-batch,
``adjust_hyperp(epoch)``; ``cleanup()`` at the end. Any error on any rank
ends the job (``train.worker.guarded``). Under the restart supervisor
(``max_restarts``, :mod:`.restart_job`) rank 0 marks each iteration
(``train/attempt.py``). Under it, with ``checkpoint_signal`` or when
resuming, every rank takes part in a checkpoint at each epoch's end and
after the iteration a signal asked for (``checkpoint_signal``) or at which
rank 0's clock ran out (``checkpoint_every_s``): every rank's note and rank
0's clock summed after each step, as the trainer's; a resumed job starts
from it, within an epoch too (:mod:`.resume`).
"""
import io
import importlib
import importlib.util
import json
import os
import sys
import time

from ..train import checkpoint_request
if __name__ == '__main__':
    # A rank, started by mpiexec: catch the option checkpoint_signal before the
    # imports below (numpy: 0.1 s), within which its default would kill us
    checkpoint_request.install_for_name(os.environ.get('THEANOMPI_EXT_CHECKPOINT_SIGNAL'))
import numpy as np  # noqa: E402

from ..exchange.modes import OVERLAP, SERIAL, check_mode  # noqa: E402
from ..errors import EXIT_BAD_INPUT  # noqa: E402

#: How a run stopped after a signal's checkpoint continues (StoppedToResume's message).
HOW_TO_RESUME = "resume=True (a session: RESUME=1 or tmxlauncher --resume)"


def import_model_class(modelfile, modelclass):
    """The class ``modelclass`` from a dotted module name or a ``.py`` path.

    A dotted module is searched in the working directory first, as the ranks
    (whose PYTHONPATH starts with it, ``rule.py``) and Theano-MPI's users
    expect, also where the working directory is not on ``sys.path`` (the
    ``tmxlauncher`` console script's ``--dry-run``).
    """
    if modelfile.endswith('.py') or os.path.sep in modelfile:
        name = os.path.splitext(os.path.basename(modelfile))[0]
        spec = importlib.util.spec_from_file_location(name, modelfile)
        if spec is None:
            raise ImportError('cannot load model file %s' % modelfile)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    else:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())   # kept: the module may import its neighbours later
        mod = importlib.import_module(modelfile)
    try:
        return getattr(mod, modelclass)
    except AttributeError:
        raise ImportError('model file %s has no class %s' % (modelfile, modelclass))


class Recorder(object):
    """The subset of Theano-MPI's recorder that models call, plus timings.

    ``train_error(count, cost, error)`` / ``val_error(count, cost, error,
    error_top5)`` collect the model's own numbers; ``start()``/``end(mode)``
    accumulate seconds per mode; any other call is accepted and ignored.
    """

    def __init__(self):
        self.times, self._t0 = {}, None
        self.train, self.val = [], []

    def start(self):
        self._t0 = time.perf_counter()

    def end(self, mode):
        if self._t0 is not None:
            self.add(mode, time.perf_counter() - self._t0)
            self._t0 = None

    def add(self, mode, seconds):
        """Count ``seconds`` under ``mode`` (a span the model's own calls are inside)."""
        self.times[mode] = self.times.get(mode, 0.0) + seconds

    def train_error(self, count, cost, error, *rest):
        self.train.append((float(cost), float(error)))

    def val_error(self, count, cost, error, *rest):
        self.val.append((float(cost), float(error)))

    def __getattr__(self, name):
        if name.startswith('__'):
            raise AttributeError(name)
        return lambda *a, **k: None


def choose_mode(model, exch_strategy):
    """(mode, reason, chunks): the exchange actually used for a contract model.

    ``exch_strategy`` has passed :func:`theanompi_ext.exchange.modes.check_mode`
    (so ``ar-overlap`` comes with ``kn``). ``ar-overlap`` cuts the backward
    pass into chunks found in the model's graph (or declared in
    ``model.tmx_layers``, :func:`~.chunks.find_chunks`); where the graph
    has no cut the serial exchange is used and the reason says why.
    ``chunks`` are the entries for the chunked backward (None: serial).
    """
    if exch_strategy == SERIAL:
        return SERIAL, 'serial exchange after the whole backward pass (exch_strategy=ar)', None
    from .chunks import find_chunks
    found = find_chunks(model)
    if found.entries is None:
        return SERIAL, ('exch_strategy=%s asked for overlap, but %s; using the serial exchange '
                        '(a model can declare its chunks in model.tmx_layers)'
                        % (exch_strategy, found.why)), None
    return OVERLAP, ('per-bucket allreduce during a chunked backward pass, %s '
                     '(exch_strategy=%s)' % (found.why, exch_strategy)), found.entries


def run(modelfile, modelclass, sync_type, exch_strategy, devices, comm=None, log=print):
    """Train the contract model on this rank; returns a summary dict."""
    from ..collective import create_communicator
    from ..engine.open import open_on_every_rank
    check_mode(sync_type, exch_strategy)     # before any rank waits on another
    own_comm = comm is None
    from .options import early_option
    comm = comm or create_communicator('auto', topology=early_option('topology'))
    # Again now that MPI has started (MPICH's handler keeps it otherwise), before
    # the start mark after which the launcher passes the signal on.
    checkpoint_request.install_for_name(early_option('checkpoint_signal'))
    rank, size = comm.rank, comm.size
    from ..train.attempt import AttemptHooks, mark_started
    mark_started(rank)     # every rank joined: the supervisor's start check (restart_job.py)
    hooks = AttemptHooks(rank)
    if len(devices) != size:
        raise ValueError('%d devices (%s) for %d ranks' % (len(devices), ','.join(devices), size))
    # Theano loads here, on this rank's entry (the list has one per rank, in
    # rank order across hosts), before the model file imports it.
    open_on_every_rank(devices[rank], comm)
    from .stepper import ContractStepper
    from .options import resolve_options
    from ..launch.places import gather_places, placement_text
    log = log if rank == 0 else (lambda *a, **k: None)
    places = gather_places(comm, devices[rank])    # the first lines: which rank runs where
    if size > 1:
        log(placement_text(places))
    model = _build_model(comm, modelfile, modelclass, sync_type, exch_strategy, devices)
    opts = resolve_options(model)
    mode, why, chunks = choose_mode(model, exch_strategy)
    stepper = ContractStepper(model, comm, sync_type, opts, log=log,
                              overlap=(mode == OVERLAP), chunks=chunks)
    stepper.take_over()
    log(_start_line(model, stepper, opts, modelclass, devices, sync_type, mode, why, size))
    history, t_start = [], time.perf_counter()
    ckpt, point = _restartable(model, stepper, opts, modelclass, history, hooks)
    first_epoch = point.epochs_done if point else 0
    _train_epochs(model, stepper, opts, comm, history, log,
                  title='%s, %d ranks' % (modelclass, size), ckpt=ckpt, hooks=hooks,
                  resume=point)
    model.cleanup()
    summary = dict(workers=size, devices=list(devices), sync_type=sync_type, mode=mode,
                   iterations=stepper.iteration, wall_s=time.perf_counter() - t_start,
                   history=history, options={k: v for k, v in opts.items()})
    if stepper.timeline is not None:
        trace = stepper.timeline.gather(comm)          # every rank takes part
        if rank == 0:
            from ..exchange.timeline import write_trace
            write_trace(trace, opts['timeline'])
    restarts_line = ''
    if ckpt is not None:
        from ..train.restarts import format_summary, summary_for
        summary.update(restarts=summary_for(opts['out']), resumed_at_epoch=first_epoch)
        restarts_line = format_summary(summary['restarts'])
    if rank == 0 and opts['out']:
        write_final(opts['out'], summary, stepper.state_dict())
    log('summary: %d ranks, %d iterations in %.1fs%s' % (size, stepper.iteration,
                                                         summary['wall_s'], restarts_line))
    if own_comm and hasattr(comm, 'close'):
        comm.close()
    return summary


def _build_model(comm, modelfile, modelclass, sync_type, exch_strategy, devices):
    """The user's model, built and compiled on this rank (rank 0 first)."""
    from ..step.assemble import compile_in_turn
    rank, size = comm.rank, comm.size
    # The engine is configured (run: open_on_every_rank): a model module that
    # imports Theano itself finds it on this rank's device (a user's .theanorc
    # still wins, see engine).
    cls = import_model_class(modelfile, modelclass)
    from ..launch.same_software import check_same_model_code
    check_same_model_code(comm, cls)      # each host imported its own copy
    config = {'verbose': rank == 0, 'rank': rank, 'size': size, 'mname': modelclass,
              'device': devices[rank], 'sync_type': sync_type, 'exch_strategy': exch_strategy}

    def build():
        m = cls(config)
        # Theano-MPI models know 'avg' and 'cdd' only; their train functions are
        # replaced by our step (stepper.take_over), so 'avg' stands in for 'kn'.
        m.compile_iter_fns(sync_type='cdd' if sync_type == 'cdd' else 'avg')
        return m
    # Rank 0 fills the compile cache first; the others then only load from it.
    return compile_in_turn(comm, build)


def _start_line(model, stepper, opts, modelclass, devices, sync_type, mode, why, size):
    """What rank 0 says before the first step: ranks, exchange, batch, schedule, loading."""
    hook = getattr(model, 'load_train_batch', None)
    n = stepper.n
    return ('theanompi_ext: %s on %d ranks (%s), sync_type=%s, exchange mode %s: %s; '
            'batch %d x %d = %d per iteration (one iteration = one sub-batch; %s), '
            '%d iterations per epoch, lr %g -> %g (warmup %s over %g epochs); exchange %s; '
            'batch loading: %s'
            % (modelclass, size, ','.join(devices), sync_type, mode, why, size, n, size * n,
               stepper.feed.describe(), stepper.iters_per_epoch, opts['base_lr'],
               stepper.schedule.target_lr, opts['warmup'], opts['warmup_epochs'],
               stepper.exchange_path, 'model.load_train_batch(i) per file batch' if hook else
               'model.train_iter(i) per sub-batch, its train_iter_fn replaced by our step '
               '(one step per iteration)'))


def _restartable(model, stepper, opts, modelclass, history, hooks):
    """``(the checkpoint, where to resume)``: checkpoints are written under the
    restart supervisor, with ``checkpoint_signal`` and when resuming (else
    ``(None, None)``); resuming (the supervisor's restart or ``resume=True``),
    the finished epochs are replayed here and the :class:`~.resume.ResumePoint`
    given (else None): its state is loaded once the steps of its epoch
    already done have been loaded again (:func:`_train_epoch`)."""
    from .resume import RESUME_VAR, ContractCheckpoint, EpochSoFar, check_resumable, replay
    resuming = os.environ.get(RESUME_VAR) == '1'
    if not (hooks.max_restarts or opts['checkpoint_signal'] or opts['checkpoint_every_s'] or
            resuming):
        return None, None
    check_resumable(model)
    if not opts['out']:
        raise ValueError('options max_restarts, checkpoint_signal, checkpoint_every_s and '
                         'resume need the option out (the checkpoint lives there)')
    so_far = EpochSoFar(stepper.iters_per_epoch, stepper.has_error)
    ckpt = ContractCheckpoint(model, stepper, modelclass, opts, opts['out'], history, so_far)
    if not resuming:
        return ckpt, None
    point = ckpt.position()
    replay(model, point.epochs_done)
    return ckpt, point


class _Checkpoints(object):
    """The checkpoints of a run that writes them (``ckpt``; None: none): at each
    epoch's end, and within one after the step a ``checkpoint_signal`` asked for
    or at which rank 0's ``checkpoint_every_s`` clock ran out; and the resume at
    ``point`` (a :class:`~.resume.ResumePoint`, or None)."""

    def __init__(self, ckpt, stepper, opts, hooks, log, point=None):
        self.ckpt, self.stepper, self.opts, self.hooks, self.log = ckpt, stepper, opts, hooks, log
        self.point, self.signalled = point, None
        self.every_s = opts.get('checkpoint_every_s', 0.0) if ckpt is not None else 0.0
        self.voting = ckpt is not None and bool(opts['checkpoint_signal'] or self.every_s)
        self._last_save_t = time.monotonic()

    def so_far(self, epoch):
        """The lists of epoch ``epoch``'s losses and errors (those of the steps a
        resumed epoch already did come with the state, :meth:`resumed`)."""
        if self.ckpt is None:
            return [], []
        if self.point is None or epoch != self.point.epochs_done:
            self.ckpt.so_far.clear()
        return self.ckpt.so_far.losses, self.ckpt.so_far.errors

    def skip(self, epoch):
        """How many steps of epoch ``epoch`` to load again without a step (resume)."""
        return self.point.steps_in_epoch if self.point and epoch == self.point.epochs_done else 0

    def resumed(self, finished=False):
        """Load the checkpoint's state now (the model is where it was); the epoch's
        ``(losses, errors)`` so far. ``finished``: the checkpoint is the run's end."""
        point, self.point = self.point, None
        self.ckpt.restore(point)
        h, st = self.hooks, self.stepper
        within = (', step %d of %d' % (point.steps_in_epoch, st.iters_per_epoch)
                  if point.steps_in_epoch else '')
        where = ('after its last epoch, nothing left to train' if finished else
                 'at epoch %d%s' % (point.epochs_done + 1, within))
        self.log('%sresumed from %s %s (iteration %d)' % (
            'restart %d of %d: ' % (h.attempt, h.max_restarts) if h.attempt else '',
            self.ckpt.path, where, st.iteration))
        return self.ckpt.so_far.losses, self.ckpt.so_far.errors

    def after_step(self, epoch, steps_done):
        """Every rank, after each step: a checkpoint within the epoch now if a signal
        asked for one or rank 0's clock ran out (at its last step, the epoch's own
        follows)."""
        if not self.voting:
            return
        clock = self.every_s > 0 and self.stepper.comm.rank == 0 and \
            time.monotonic() - self._last_save_t >= self.every_s
        asked, clock = checkpoint_request.vote(self.stepper.comm, self.stepper.iteration,
                                               self.opts['collective_timeout_s'], clock)
        if asked:
            self.signalled = checkpoint_request.number(self.opts['checkpoint_signal'])
        if (asked or clock) and steps_done < self.stepper.iters_per_epoch:
            self._save(epoch, steps_done)
            self._after_signalled(last=False)

    def _save(self, epochs_done, steps_in_epoch=0):
        self.ckpt.save(epochs_done, in_write=self.hooks.in_write, steps_in_epoch=steps_in_epoch)
        self._last_save_t = time.monotonic()

    def epoch_end(self, epochs_done, last):
        """Every rank, after epoch ``epochs_done - 1``'s record: its checkpoint."""
        if self.ckpt is not None:
            self._save(epochs_done)
            self._after_signalled(last)

    def _after_signalled(self, last):
        signum, self.signalled = self.signalled, None
        if signum is not None:
            checkpoint_request.after_checkpoint(signum, self.opts['on_checkpoint_signal'],
                                                self.stepper.iteration, self.ckpt.path, last,
                                                self.log, HOW_TO_RESUME)


def _train_epochs(model, stepper, opts, comm, history, log, title, ckpt=None, hooks=None,
                  resume=None):
    """Every epoch from the first not finished: the steps, the validation, the
    epoch's record (appended to ``history``), the outputs, the model's
    hyper-parameter hook and (``ckpt``) the checkpoints; ``resume``: the
    :class:`~.resume.ResumePoint` of a resumed run."""
    from .outputs import write_record, snapshot_due, save_snapshot
    recorder = Recorder()
    checkpoints = _Checkpoints(ckpt, stepper, opts, hooks, log, resume)
    n_epochs = int(model.n_epochs)
    for epoch in range(resume.epochs_done if resume else 0, n_epochs):
        model.epoch = epoch
        t_epoch, times_before = time.perf_counter(), dict(recorder.times)
        losses, errs, lr, done = _train_epoch(model, stepper, opts, recorder, hooks,
                                              checkpoints, epoch)
        model.reset_iter('train')
        if not losses:
            break
        rec = _epoch_record(comm, epoch, losses, errs, _validate(model, recorder, stepper.n_subb),
                            lr, stepper.iteration)
        rec['times_s'] = {m: t - times_before.get(m, 0.0) for m, t in recorder.times.items()}
        rec['epoch_s'] = time.perf_counter() - t_epoch
        history.append(rec)
        if comm.rank == 0 and opts['out']:
            write_record(opts['out'], history, title=title)
            if snapshot_due(epoch + 1, n_epochs, opts['snapshot_freq']):
                save_snapshot(opts['out'], epoch + 1, stepper.iteration,
                              [p.name for p in model.params],
                              [p.get_value() for p in model.params])
        log('epoch %d/%d  loss %.4f  train err %.3f  val loss %.4f  val err %.3f  lr %.4f'
            % (rec['epoch'], model.n_epochs, rec['train_loss'], rec['train_err'],
               rec['val_loss'], rec['val_err'], rec['lr']))
        model.adjust_hyperp(epoch)
        if done:
            break
        checkpoints.epoch_end(epoch + 1, last=epoch + 1 == n_epochs)  # the next epoch's start
    if checkpoints.point is not None:
        # resumed from the checkpoint of a finished run: nothing left to train, its
        # state is the run's end
        checkpoints.resumed(finished=True)


def _train_epoch(model, stepper, opts, recorder, hooks, checkpoints, epoch):
    """One epoch's steps (each sub-batch of each file batch, up to ``max_steps``);
    returns ``(losses, errors, last lr, whether max_steps was reached)``.

    With the hook ``load_train_batch`` we load and step; without it the
    model's ``train_iter`` does both (its ``train_iter_fn`` is our step).
    Resumed within this epoch, the steps already done are loaded again with the
    step skipped, then the checkpoint's state is loaded (:mod:`.resume`)."""
    hook = getattr(model, 'load_train_batch', None)
    losses, errs = checkpoints.so_far(epoch)
    skip, lr = checkpoints.skip(epoch), None
    for i in range(int(model.data.n_batch_train)):
        for subb in range(stepper.n_subb):
            at = i * stepper.n_subb + subb      # steps of this epoch done before this one
            if at == skip and checkpoints.point is not None:
                losses, errs = checkpoints.resumed()
            if at >= skip and opts['max_steps'] and stepper.iteration >= opts['max_steps']:
                return losses, errs, lr, True
            if hook:
                if subb == 0:
                    hook(i)
                if at < skip:
                    continue
                recorder.start()
                cost, err, lr = stepper.step(subb)
                recorder.end('calc+comm')
            elif at < skip:
                _load_only(model, stepper.train_fn, i)
                continue
            else:
                # The model loads and calls train_iter_fn: our step (train_fn.py).
                before, t0 = stepper.train_fn.calls, time.perf_counter()
                model.train_iter(i, recorder)
                recorder.add('calc+comm', time.perf_counter() - t0)
                stepper.train_fn.expect_one_call(before, 'model.train_iter(%d)' % i)
                cost, err, lr = stepper.train_fn.last
            losses.append(cost)
            errs.append(err)
            if hooks is not None:
                hooks.after_step(stepper.iteration)   # progress mark; the tests' faults
            checkpoints.after_step(epoch, at + 1)
    return losses, errs, lr, False


def _load_only(model, train_fn, i):
    """``model.train_iter(i)`` with our step skipped: the model's loading only."""
    before = train_fn.calls
    train_fn.skipping = True
    try:
        model.train_iter(i, Recorder())
    finally:
        train_fn.skipping = False
    train_fn.expect_one_call(before, 'model.train_iter(%d)' % i)


def _validate(model, recorder, n_subb):
    """``[(loss, error)]`` of every validation sub-batch, as Theano-MPI validates."""
    recorder.val = []
    for j in range(int(getattr(model.data, 'n_batch_val', 0) or 0)):
        for _ in range(n_subb):
            model.val_iter(j, recorder)
    model.reset_iter('val')
    return np.array(recorder.val or [(np.nan, np.nan)], np.float64)


def _epoch_record(comm, epoch, losses, errs, vals, lr, iterations):
    """The epoch's means over every rank (one allreduce)."""
    size = comm.size
    stats = np.zeros(5, np.float32)
    stats[...] = (np.mean(losses), np.nanmean(errs) if np.any(np.isfinite(errs)) else 0,
                  np.mean(vals[:, 0]), np.mean(vals[:, 1]), 1.0)
    comm.allreduce(stats)
    return dict(epoch=epoch + 1, train_loss=float(stats[0] / size),
                train_err=float(stats[1] / size), val_loss=float(stats[2] / size),
                val_err=float(stats[3] / size), lr=float(lr), iterations=iterations)


def write_final(out, summary, state):
    """``params.npz`` and then ``summary.json`` (with the checksum of the former), atomically."""
    from ..files import atomic, sealed
    os.makedirs(out, exist_ok=True)
    buf = io.BytesIO()
    np.savez(buf, **state)
    params = buf.getvalue()
    summary = dict(summary, outputs={'params.npz': sealed.sha256_of(params)})
    atomic.write_all({os.path.join(out, 'params.npz'): params,
                      os.path.join(out, 'summary.json'):
                          json.dumps(summary, indent=1, default=float).encode()},
                     'the final outputs')


def main(argv=None):
    """Entry point of each rank (see module docstring)."""
    from ..train.worker import guarded
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 5:
        sys.stderr.write('usage: python -m theanompi_ext.theanompi_compat.worker MODELFILE '
                         'MODELCLASS SYNC_TYPE EXCH_STRATEGY DEVICES\n')
        return EXIT_BAD_INPUT
    modelfile, modelclass, sync_type, exch_strategy, devices = argv
    return guarded(lambda: run(modelfile, modelclass, sync_type, exch_strategy,
                               [d for d in devices.split(',') if d]))


if __name__ == '__main__':
    sys.exit(main())
