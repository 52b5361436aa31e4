"""``theanompi-ext train``: launch (or join) a data-parallel training run.

* Outside MPI with ``--workers K``: starts ``mpiexec -n K`` on this same
  command (with ``--hostfile`` for several machines) and returns its status.
* Inside an mpiexec the user started: every rank trains.
"""
import argparse
import os
import sys

from .. import output_faults
from ..errors import EXIT_BAD_INPUT, EXIT_OK
from . import options
from .progress import STDOUT_TTY_VAR
from ..launch.network_options import add_network_arguments, use_network  # noqa: F401


EXAMPLES = """examples:
  # the CPU demo: 2 workers x 32 on the built-in digits, warm-up to 0.05 x 64/32
  theanompi-ext train --workers 2 --model digits_cnn --epochs 8 --batch-per-worker 32 \\
      --base-lr 0.05 --ref-batch 32 --warmup-epochs 2 --decay-epochs 6 --out runs/demo
  # the paper's ResNet-50 recipe (kn = 8 x 32 = 256), plan only: nothing is launched
  theanompi-ext train --workers 8 --model resnet50 --data imagenet.h5 --crop 224 \\
      --epochs 90 --batch-per-worker 32 --decay-epochs 30,60,80 --dry-run
"""


def add_launch_arguments(p, workers=None, config=None, dry_run=None):
    """``--workers``, ``--hostfile``, ``--iface``, ``--transport``, ``--config`` and
    ``--dry-run`` of ``train``;
    ``trials`` words its own help for ``--workers``, ``--config`` and ``--dry-run``
    (they apply to each of its runs)."""
    g = p.add_argument_group('launch')
    g.add_argument('--workers', type=int, default=1, metavar='K',
                   help=workers or 'k, the ranks to start when not already inside mpiexec '
                                   '(default 1)')
    g.add_argument('--hostfile', default=None, metavar='FILE',
                   help='MPI host file, to place the ranks on several machines (default: '
                        'all on this one)')
    add_network_arguments(g)
    g.add_argument('--config', default=None, metavar='FILE',
                   help=config or 'key=value file of training options (Theano-MPI session '
                                  'style); options on the command line override it')
    g.add_argument('--dry-run', action='store_true',
                   help=dry_run or 'resolve every option, print the plan (batch, iterations, '
                                   'learning rates, exchange, outputs) and warnings, launch '
                                   'nothing')
    return g


def register(sub):
    """Add the ``train`` sub-command."""
    p = sub.add_parser('train', help='train a model with k workers (launches mpiexec)',
                       description='Data-parallel synchronous SGD with the recipe of Goyal '
                                   'et al. 2017: every option below, with its unit.',
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_launch_arguments(p)
    options.add_config_arguments(p)
    p.set_defaults(func=main)


def before_launch(cfg, workers, hostfile, dry_run, out=None, label=''):
    """Print the warnings (and with ``dry_run`` the plan) of ``cfg`` on ``workers``
    ranks; the cores rule applies only when every rank runs on this machine.
    ``hostfile``: its path (read here: a bad one is a ValueError before anything
    is made), or True when the user's own mpiexec placed the ranks.
    ``label`` (a trials setting's name) starts each warning."""
    from . import advice
    from .plan import resolve_plan, format_plan
    from ..engine.flags import cache_dir
    from ..launch.hostlists import read_hostfile, slot_warnings
    slots = read_hostfile(hostfile) if isinstance(hostfile, str) else []
    if hostfile is not True:
        # unusable: bad input, before anything starts; another host's ranks, and
        # each rank under the user's own mpiexec, say theirs (rank 0 alone must not
        # end here, before MPI starts: the others would wait for it there)
        cache_dir()
    out = out or sys.stdout
    if dry_run:
        out.write(format_plan(resolve_plan(cfg, workers)) + '\n')
        out.flush()
    cores = None if hostfile else advice.machine_cores()
    advice.print_warnings(advice.check(cfg, workers, cores) +
                          (slot_warnings(slots, workers) if slots else []),
                          prefix='theanompi-ext: warning: %s' % (label + ': ' if label else ''))


def main(args):
    """Validate options, then launch or run."""
    try:
        file_values = options.read_kv_file(args.config, options.config_keys()) \
            if args.config else None
        cfg = options.config_from(args, file_values)
        if args.workers < 1:
            raise ValueError('--workers must be >= 1, got %d' % args.workers)
        if cfg.backend == 'local' and args.workers > 1:
            raise ValueError('--backend local is a world of one process, not --workers %d: '
                             'choose mpi or auto' % args.workers)
    except ValueError as exc:
        sys.stderr.write('theanompi-ext train: error: %s\n' % exc)
        return EXIT_BAD_INPUT
    # --checkpoint-signal: caught from now on (its default would end us), in the
    # launcher as in a rank; a rank catches it again once MPI has started
    from .checkpoint_request import install_for
    install_for(cfg)
    from ..launch import in_mpi_job
    if in_mpi_job():
        from ..collective.world import launcher_rank_size, world_comm
        if args.dry_run:
            # rank 0's plan imports Theano, which imports mpi4py and so starts MPI;
            # MPI's start waits for every rank, so the others start it too
            world_comm()
        rank, size = launcher_rank_size()
        workers, hostfile = size or args.workers, True   # the user's mpiexec placed them
    else:
        rank, workers, hostfile = 0, args.workers, args.hostfile
    try:
        if rank == 0:
            before_launch(cfg, workers, hostfile, args.dry_run)
        if args.dry_run:
            return EXIT_OK
    except (OSError, ValueError) as exc:   # e.g. less data than one minibatch
        if isinstance(exc, BrokenPipeError) or output_faults.failed_write(exc):
            raise                          # our own output's: output_faults.run_command
        sys.stderr.write('theanompi-ext train: error: %s\n' % exc)
        return EXIT_BAD_INPUT
    if in_mpi_job():
        if cfg.max_restarts:
            sys.stderr.write('theanompi-ext train: error: --max-restarts needs the launcher to '
                             'start the ranks (run `theanompi-ext train --workers K` outside '
                             'mpiexec): inside your own mpiexec nothing can restart the job\n')
            return EXIT_BAD_INPUT
        from .worker import run, guarded
        return guarded(lambda: run(cfg))
    # Every output path, the folder's contents and its lock: before anything runs.
    from . import outdir
    try:
        lock = outdir.prepare(cfg)
    except ValueError as exc:
        sys.stderr.write('theanompi-ext train: error: %s\n' % exc)
        return EXIT_BAD_INPUT
    os.environ[outdir.PREPARED_VAR] = '1'
    use_network(args)
    if lock is not None:
        os.environ[outdir.MARK_VAR] = lock.holder   # each rank checks that its host sees it
    try:
        return _launch(args, cfg)
    finally:
        if cfg.out:
            from ..files.stale import remove_stale_temporaries
            remove_stale_temporaries(cfg.out)     # of a rank killed while writing
        if lock is not None:
            lock.release()
        os.environ.pop(outdir.PREPARED_VAR, None)
        os.environ.pop(outdir.MARK_VAR, None)


def _launch(args, cfg):
    from ..errors import BadInput
    from ..launch.mpiexec import child_env, find_mpiexec
    from ..launch.postmortem import run_explained   # names a rank that died
    from ..launch.worker_job import worker_command, worker_env
    from .attempt import start_file, start_watch_env, started
    if args.workers == 1 and not args.hostfile and not cfg.max_restarts:
        # (a job that may restart runs under mpiexec even on one rank)
        from .worker import run, guarded
        return guarded(lambda: run(cfg))
    from ..launch.reach import Unreachable, check_hostfile
    try:
        find_mpiexec()
        check_hostfile(args.hostfile)      # once: later attempts may meet a link down
    except Unreachable as exc:
        sys.stderr.write('theanompi-ext: %s\n' % exc)
        return EXIT_BAD_INPUT
    except BadInput as exc:
        sys.stderr.write('theanompi-ext train: error: %s\n' % exc)
        return EXIT_BAD_INPUT

    def attempt(cfg, extra_env):
        env = worker_env(cfg.to_dict(), child_env())
        env.update(extra_env)
        if sys.stdout.isatty():
            # rank 0 writes to mpiexec's pipe: tell it that a terminal reads it
            env[STDOUT_TTY_VAR] = '1'
        mark = start_file(extra_env)
        return run_explained(worker_command(args.workers, args.hostfile), env=env,
                             size=args.workers, hostfile=args.hostfile,
                             started=(lambda: started(mark)) if mark else None,
                             start_timeout_s=cfg.start_timeout_s, forward=forward)
    # --checkpoint-signal: the launcher catches it for the whole job, attempts
    # and the waits between them included, and passes it on to the ranks
    forward = forwarded_checkpoint_signal(cfg)
    try:
        if not cfg.max_restarts:
            # a job whose ranks never all join (a rank dead before MPI started: hydra
            # leaves the others waiting) ends after --start-timeout-s, as under restarts
            with start_watch_env(cfg.out, bool(args.hostfile)) as watch_env:
                return attempt(cfg, watch_env)
        from .restarts import recorded_run, supervise
        return supervise(cfg, lambda c, e: recorded_run(lambda: attempt(c, e)))
    finally:
        if forward is not None:
            forward.restore()


def forwarded_checkpoint_signal(cfg):
    """The launcher's :class:`~..launch.forwarded_signal.ForwardedSignal` of
    ``cfg.checkpoint_signal``, installed, holding a request noted since
    :func:`main` caught it (None without the option)."""
    if not cfg.checkpoint_signal:
        return None
    from ..launch.forwarded_signal import ForwardedSignal
    from .checkpoint_request import number, taken
    early = taken() is not None       # before install() unblocks it: one held back
    forward = ForwardedSignal(number(cfg.checkpoint_signal)).install()
    forward.pending = forward.pending or early
    return forward
