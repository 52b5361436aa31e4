"""The program each rank runs: build data, model and trainer; train; report.

Started by ``theanompi-ext train`` (through mpiexec) or directly inside an
``mpiexec`` the user started. Any exception on any rank is printed with
the rank number and ends the whole job (MPI_Abort), so a failing rank
never leaves the others waiting in a collective.
"""
import io
import json
import os
import sys
import time

from . import checkpoint_request
if __name__ == '__main__':
    # A rank, started by mpiexec: catch --checkpoint-signal before the imports
    # below (numpy, the config: 0.3 s), within which its default would kill us
    from ..launch.worker_job import CONFIG_VAR
    checkpoint_request.install_for_json(os.environ.get(CONFIG_VAR))
from ..files import atomic, sealed  # noqa: E402
from . import outdir                # noqa: E402
from .config import TrainConfig     # noqa: E402
from .report import curves_png      # noqa: E402


def run(cfg, comm=None, log=print):
    """Train with ``cfg`` on this rank; returns the summary (all ranks)."""
    from ..collective import create_communicator
    from ..engine.open import open_on_every_rank
    cfg = cfg.validate()
    # Again now that MPI has started, and before the start mark (the launcher passes
    # the signal on only after it): MPICH's handler passes the signal on to one
    # installed before MPI_Init, but keeps it where run() is a program's first catch
    checkpoint_request.install_for(cfg)
    comm = comm or create_communicator(cfg.backend, topology=cfg.topology)
    from .attempt import mark_started
    mark_started(comm.rank)     # every rank joined (the communicator's Dup): the start check
    dev = open_on_every_rank(cfg.device, comm)   # Theano loads here, on this rank's device
    if dev != 'cpu':
        from ..step.device import choose_exchange_path
        choose_exchange_path(cfg.exchange_path, dev, comm)   # NCCL asked for where it cannot run
    from .placement import announce_placement
    announce_placement(cfg, comm, dev, log)     # the first lines; every host sees --out
    lock = prepare_outputs(cfg, comm)
    try:
        return _run(cfg, comm, log, t0=time.perf_counter())
    finally:
        if lock is not None:
            lock.release()


def prepare_outputs(cfg, comm):
    """Rank 0 checks the output paths and locks ``--out`` unless the launcher did."""
    if comm.rank != 0 or os.environ.get(outdir.PREPARED_VAR):
        return None
    return outdir.prepare(cfg)


def _run(cfg, comm, log, t0):
    from ..model import build_model
    from .trainer import Trainer
    from ..data.source import load_dataset
    data = load_dataset(cfg)
    net = build_model(cfg.model, data.input_shape, data.n_classes, seed=cfg.seed,
                      **cfg.extra.get('model_kw', {}))
    trainer = Trainer(net, data, cfg, comm, log=log)
    if comm.rank == 0 and not cfg.quiet:
        # the run's first lines: what it will do (train --dry-run prints the same)
        from .plan import plan_of_trainer, format_plan
        plan = plan_of_trainer(trainer)
        plan.lines.append(('setup', '%.1f s' % (time.perf_counter() - t0)))
        log(format_plan(plan))
    if cfg.resume:
        trainer.resume()
    summary = trainer.train()
    if comm.rank == 0 and cfg.out and cfg.max_restarts:
        from .restarts import summary_for
        # what the supervisor's log (OUT/restarts.json) holds of the earlier attempts
        summary['restarts'] = summary_for(cfg.out) or dict(count=0,
                                                           max_restarts=cfg.max_restarts)
    if cfg.out or cfg.timeline:
        # bounded like a checkpoint: a writer hung in I/O ends the job, named
        with trainer.writing('final outputs in %s (written by rank 0)'
                             % (cfg.out or cfg.timeline), cfg.out or cfg.timeline):
            if comm.rank == 0:
                write_outputs(cfg, summary, trainer)
            trainer.comm.barrier()
    if comm.rank == 0 and not cfg.quiet:
        log(format_summary(summary))
    return summary, trainer


def output_files(cfg, summary, trainer):
    """``{path: bytes}`` of a run's final outputs, ``summary.json`` last.

    The summary records the SHA-256 of every other output (``outputs``), so a
    reader can tell that ``params.npz`` belongs to that summary.
    """
    import numpy as np
    files = {}
    if trainer.trace is not None:
        from ..exchange.timeline import plot_trace
        files[cfg.timeline + '.json'] = json.dumps(trainer.trace).encode()
        png = _render(lambda f, trace: plot_trace(trace, f), cfg.timeline + '.png',
                      trainer.trace)
        if png is not None:
            files[cfg.timeline + '.png'] = png
    if cfg.out:
        state = trainer.params.state_dict()
        bad = [k for k, v in state.items() if not np.all(np.isfinite(v))]
        if bad:
            from ..errors import DivergedState
            raise DivergedState('the final parameters are not finite (%s); params.npz and '
                                'summary.json were not written' % ', '.join(bad[:5]))
        buf = io.BytesIO()
        np.savez(buf, **state)
        files[os.path.join(cfg.out, 'params.npz')] = buf.getvalue()
        png = curves_png(cfg, summary, trainer)
        if png is not None:
            files[os.path.join(cfg.out, 'curves.png')] = png
        summary = dict(summary, outputs={os.path.basename(p): sealed.sha256_of(d)
                                         for p, d in files.items()})
        files[os.path.join(cfg.out, 'summary.json')] = json.dumps(
            summary, indent=1, default=float).encode()
    return files


def _render(plot, path, *args):
    from .report import render_png
    return render_png(plot, path, *args)


def write_outputs(cfg, summary, trainer):
    """summary.json, final parameters (npz), curves.png under cfg.out and the
    timeline, if set: all built in memory, then written together
    (:func:`theanompi_ext.files.atomic.write_all`: old versions or new ones, never a mix
    after a failure)."""
    files = output_files(cfg, summary, trainer)
    if cfg.out:
        os.makedirs(cfg.out, exist_ok=True)
    atomic.write_all(files, 'the final outputs')


def format_summary(s):
    """The closing lines of a run."""
    if s['final_val_top1'] is None:
        # e.g. --max-steps ended the run inside its first epoch
        val = 'no validation pass ran'
    else:
        val = 'final val top-1 error %.4f, top-5 error %.4f' % (
            s['final_val_top1'], s['final_val_top5'])
    from .restarts import format_summary as restarts_text
    return ('summary: %d workers, batch %d, %d iterations in %.1fs (median step %.1f ms); %s%s'
            % (s['workers'], s['total_batch'], s['iterations'], s['wall_s'],
               1000 * (s['step_s_median'] or 0), val, restarts_text(s.get('restarts'))))


def main(argv=None):
    """``python -m theanompi_ext.train.worker [CONFIG.json]``: the config from the
    file, else from the environment (``launch/worker_job.CONFIG_VAR``)."""
    from ..launch.worker_job import CONFIG_VAR
    argv = sys.argv[1:] if argv is None else argv
    if argv:
        with open(argv[0]) as f:
            config = json.load(f)
    elif os.environ.get(CONFIG_VAR):
        config = json.loads(os.environ[CONFIG_VAR])
    else:
        sys.stderr.write('theanompi-ext worker: no config: name a JSON file or set %s\n'
                         % CONFIG_VAR)
        return 2
    cfg = TrainConfig.from_dict(config)
    checkpoint_request.install_for(cfg)   # at once: not caught, it would kill this rank
    return guarded(lambda: run(cfg))


def guarded(fn):
    """Run ``fn``; on any exception print it with the rank and end every rank.

    Returns the exit status (``errors.py``: 2 bad input, 3 failed; 130 after a
    Ctrl-C; 141 when this process's own output was closed,
    :mod:`theanompi_ext.output_faults`).
    """
    from . import faults
    from .. import output_faults
    from ..errors import EXIT_OK, StoppedToResume, exit_status
    output_faults.any_character()
    faults.stop_with_parent()
    comm = faults.prepare_agreement()
    faults.note_rank('running')
    faults.mark_stop_signal(comm.rank)
    faults.keep_rank(comm)
    try:
        faults.sweep_shared_memory()         # what killed jobs left on this host
        faults.check_same_software(comm)     # the job's first exchange: every rank alike
        fn()
        faults.note_rank('done %d' % EXIT_OK)
        faults.bound_the_end(comm)
        return EXIT_OK
    except BaseException as exc:  # noqa: B902 - includes KeyboardInterrupt
        who = 'rank %d of %d ' % (comm.rank, comm.size) if comm.size > 1 else ''
        closed = output_faults.is_closed(exc)
        status = output_faults.CLOSED_STATUS if closed else exit_status(exc)
        stopped = isinstance(exc, StoppedToResume)
        faults.note_rank('%s %d' % ('stopped' if stopped else 'failed', status))
        # An error every rank raised at the same point (found after a collective)
        # ends each rank normally; anything else may have left other ranks
        # inside a collective, so the whole job is aborted.
        together = None
        if stopped:
            if comm.rank == 0:      # the same on every rank: said once
                sys.stderr.write('theanompi-ext: %s (exit status %d)\n' % (exc, status))
        elif closed:
            # as SIGPIPE ends other tools (`train --workers 1 | head`): 141
            output_faults.end('theanompi-ext: %sstopped %s (exit status %d)'
                              % (who, output_faults.CLOSED_WHY, status))
        elif isinstance(exc, KeyboardInterrupt):
            # Ctrl-C of `train --workers 1` (or of the user's own mpiexec): a stop, not a
            # failure, and said as the launcher says it
            sys.stderr.write('theanompi-ext: %sstopped by SIGINT (exit status %d)\n'
                             % (who, status))
        else:               # said once for the job when every rank failed alike
            from .error_location import error_location
            together = faults.say_failure(comm, exc, error_location(exc))
        if together is None:
            together = faults.failed_together(exc, str(exc)) is not None
        sys.stderr.flush()
        if os.environ.get('THEANOMPI_EXT_TRACEBACK'):
            import traceback
            traceback.print_exc()
        if comm.size > 1 and not together:
            import time
            time.sleep(0.5)   # let the launcher forward this rank's message first
            comm.abort(status)
        faults.bound_the_end(comm)
        return status


if __name__ == '__main__':
    sys.exit(main())
