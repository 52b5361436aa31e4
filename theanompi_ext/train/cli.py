"""``theanompi-ext train``: launch (or join) a data-parallel training run.

* Outside MPI with ``--workers K``: starts ``mpiexec -n K`` on this same
  command (with ``--hostfile`` for several machines) and returns its status.
* Inside an mpiexec the user started: every rank trains.
"""
import json
import os
import sys
import tempfile

from . import options


def register(sub):
    """Add the ``train`` sub-command."""
    p = sub.add_parser('train', help='train a model with k workers (launches mpiexec)')
    p.add_argument('--workers', type=int, default=1,
                   help='ranks to start when not already inside mpiexec (default 1)')
    p.add_argument('--hostfile', default=None, help='MPI host file for several machines')
    p.add_argument('--config', default=None,
                   help='key=value file (Theano-MPI session style); options override it')
    options.add_config_arguments(p)
    p.set_defaults(func=main)


def main(args):
    """Validate options, then launch or run."""
    try:
        file_values = options.read_kv_file(args.config, options.config_keys()) \
            if args.config else None
        cfg = options.config_from(args, file_values)
        if args.workers < 1:
            raise ValueError('--workers must be >= 1, got %d' % args.workers)
    except ValueError as exc:
        sys.stderr.write('theanompi-ext train: error: %s\n' % exc)
        return 2
    from ..launch import in_mpi_job
    if in_mpi_job():
        from .worker import run, guarded
        return guarded(lambda: run(cfg))
    # Every output path, the folder's contents and its lock: before anything runs.
    from . import outdir
    try:
        lock = outdir.prepare(cfg)
    except ValueError as exc:
        sys.stderr.write('theanompi-ext train: error: %s\n' % exc)
        return 2
    os.environ[outdir.PREPARED_VAR] = '1'
    try:
        return _launch(args, cfg)
    finally:
        if cfg.out:
            from ..atomic import remove_stale_temporaries
            remove_stale_temporaries(cfg.out)     # of a rank killed while writing
        if lock is not None:
            lock.release()
        os.environ.pop(outdir.PREPARED_VAR, None)


def _launch(args, cfg):
    from ..launch import mpiexec_command
    from ..launch.mpiexec import child_env
    if args.workers == 1 and not args.hostfile:
        from .worker import run, guarded
        return guarded(lambda: run(cfg))
    with tempfile.NamedTemporaryFile('w', suffix='.json', delete=False) as fh:
        json.dump(cfg.to_dict(), fh)
        path = fh.name
    try:
        cmd = mpiexec_command(args.workers, [sys.executable, '-u', '-m',
                                             'theanompi_ext.train.worker', path],
                              hostfile=args.hostfile)
        from ..launch.postmortem import run_explained   # names a rank that died
        return run_explained(cmd, env=child_env(), size=args.workers)
    finally:
        os.unlink(path)
