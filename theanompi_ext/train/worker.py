"""The program each rank runs: build data, model and trainer; train; report.

Started by ``theanompi-ext train`` (through mpiexec) or directly inside an
``mpiexec`` the user started. Any exception on any rank is printed with
the rank number and ends the whole job (MPI_Abort), so a failing rank
never leaves the others waiting in a collective.
"""
import json
import os
import sys
import time

from .config import TrainConfig
from .report import write_curves


def load_dataset(cfg):
    """The data set named by ``cfg.data``."""
    if cfg.data == 'digits':
        from ..data.digits import load_digits
        return load_digits(repeat=int(cfg.extra.get('repeat', 1)),
                           train_subset=int(cfg.extra.get('train_subset', 0)))
    from ..data.source import load_hdf5_dataset
    return load_hdf5_dataset(cfg.data, cfg)


def run(cfg, comm=None, log=print):
    """Train with ``cfg`` on this rank; returns the summary (all ranks)."""
    from ..collective import create_communicator
    from ..devices import open_on_every_rank
    cfg.validate()
    comm = comm or create_communicator('auto')
    dev = open_on_every_rank(cfg.device, comm)   # Theano loads here, on this rank's device
    if dev != 'cpu':
        from .device_step import choose_exchange_path
        choose_exchange_path(cfg.exchange_path, dev)    # NCCL asked for where it cannot run
    from ..model import build_model
    from .trainer import Trainer
    data = load_dataset(cfg)
    net = build_model(cfg.model, data.input_shape, data.n_classes, seed=cfg.seed,
                      **cfg.extra.get('model_kw', {}))
    t0 = time.perf_counter()
    trainer = Trainer(net, data, cfg, comm, log=log)
    if cfg.resume:
        trainer.resume()
    if comm.rank == 0 and not cfg.quiet:
        log('%s: %s, %d params, %d workers x %d = batch %d, %d iters/epoch, '
            'sync_type=%s exch_strategy=%s, %d buckets, exchange %s, setup %.1fs' % (
                cfg.model, comm.describe(), trainer.layout.total, comm.size,
                cfg.batch_per_worker, trainer.total_batch, trainer.iters_per_epoch,
                cfg.sync_type, cfg.exch_strategy, len(trainer.buckets), trainer.exchange_path,
                time.perf_counter() - t0))
    summary = trainer.train()
    if comm.rank == 0:
        write_outputs(cfg, summary, trainer)
        if not cfg.quiet:
            log(format_summary(summary))
    return summary, trainer


def write_outputs(cfg, summary, trainer):
    """summary.json, final parameters (npz) and curves.png under cfg.out, if set."""
    if not cfg.out:
        return
    os.makedirs(cfg.out, exist_ok=True)
    with open(os.path.join(cfg.out, 'summary.json'), 'w') as f:
        json.dump(summary, f, indent=1, default=float)
    import numpy as np
    np.savez(os.path.join(cfg.out, 'params.npz'), **trainer.params.state_dict())
    write_curves(cfg, summary, trainer)


def format_summary(s):
    """The closing lines of a run."""
    if s['final_val_top1'] is None:
        # e.g. --max-steps ended the run inside its first epoch
        val = 'no validation pass ran'
    else:
        val = 'final val top-1 error %.4f, top-5 error %.4f' % (
            s['final_val_top1'], s['final_val_top5'])
    return ('summary: %d workers, batch %d, %d iterations in %.1fs (median step %.1f ms); %s'
            % (s['workers'], s['total_batch'], s['iterations'], s['wall_s'],
               1000 * (s['step_s_median'] or 0), val))


def main(argv=None):
    """``python -m theanompi_ext.train.worker CONFIG.json``."""
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0]) as f:
        cfg = TrainConfig.from_dict(json.load(f))
    return guarded(lambda: run(cfg))


def guarded(fn):
    """Run ``fn``; on any exception print it with the rank and end every rank.

    Returns the exit status (``train/faults.py``: 2 bad input, 3 failed).
    """
    from . import faults
    faults.prepare_agreement()
    faults.note_rank('running')
    try:
        fn()
        faults.note_rank('done 0')
        return 0
    except BaseException as exc:  # noqa: B902 - includes KeyboardInterrupt
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        status = faults.exit_status(exc)
        faults.note_rank('failed %d' % status)
        sys.stderr.write('theanompi-ext: rank %d of %d failed: %s: %s\n'
                         % (comm.rank, comm.size, type(exc).__name__, exc))
        sys.stderr.flush()
        if os.environ.get('THEANOMPI_EXT_TRACEBACK'):
            import traceback
            traceback.print_exc()
        # An error every rank raised at the same point (found after a
        # collective) ends each rank normally; anything else may have left
        # other ranks inside a collective, so the whole job is aborted.
        if comm.size > 1 and not faults.stopped_together(exc):
            import time
            time.sleep(0.5)   # let the launcher forward this rank's message first
            comm.Abort(status)
        return status


if __name__ == '__main__':
    sys.exit(main())
