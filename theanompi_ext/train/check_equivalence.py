"""``theanompi-ext check-equivalence``: is k-worker training kn-batch SGD?

Trains a small BN model for T steps with K ranks x n examples (gamma/beta
in the allreduce, as the paper does), and again in one process on the same
kn examples with BN statistics over n-sized groups; prints the largest
relative parameter difference as its last line and exits 1 if it exceeds
the stated tolerance. When the K-rank run itself fails it exits with that
run's status (``errors.py``: 2 bad input, 3 a rank failed, 4 a collective
timed out, 124 ``--timeout``), so the status says why. A self-test to run
on one's own cluster.

With ``--wire-dtype float16`` or ``bfloat16`` the distributed run sends
its buckets as 16 bits while the reference stays float32, so the figure
is the 16-bit wire's effect and the tolerance is :func:`tolerance`'s.
"""
import os
import sys
import tempfile

import numpy as np

from ..errors import EXIT_BAD_INPUT, EXIT_CHECK_FAILED, EXIT_OK, BadInput

TOLERANCE = 1e-4
MOMENTUM = 0.9


def tolerance(wire):
    """The relative parameter difference allowed with gradients sent as ``wire``.

    float32: :data:`TOLERANCE` (reordered float32 sums only). A 16-bit
    wire rounds each summed gradient by up to 2u relative (the cast of
    each rank's part and the cast of the sum back; u = 2**-11 for float16,
    2**-8 for bfloat16), momentum keeps an error 1/(1 - m) = 10 times, and
    in these short runs the parameters move by less than their own size:
    2u / (1 - m), 9.8e-3 for float16 and 7.8e-2 for bfloat16. Measured
    with float16 (2 ranks, 12 steps, docs/performance.md): 3.9e-3, since
    the errors of different steps do not all point the same way.
    """
    from ..collective.wire import unit_roundoff
    if wire == 'float32':
        return TOLERANCE
    return 2 * unit_roundoff(wire) / (1 - MOMENTUM)


def _cfg(args, out):
    from .config import TrainConfig
    return TrainConfig(model=args.model, batch_per_worker=args.batch, epochs=args.epochs,
                       base_lr=args.lr, ref_batch=args.batch, warmup='gradual',
                       warmup_epochs=1, decay_epochs=(args.epochs - 1,),
                       momentum=MOMENTUM, weight_decay=1e-4, exchange_bn=True,
                       wire_dtype=args.wire_dtype,
                       exch_strategy=args.exch_strategy, max_steps=args.steps,
                       eval_every=10 ** 6, quiet=True, out=out, device=args.device,
                       extra={'train_subset': args.subset}).validate()


def reference_params(cfg, workers):
    """Parameters after single-process training on the kn batches (BN per n-group),
    on this process's engine (the CPU)."""
    from ..collective.local import LocalCommunicator
    from ..model import build_model
    from .trainer import Trainer
    from ..data.source import load_dataset
    data = load_dataset(cfg)
    net = build_model(cfg.model, data.input_shape, data.n_classes, seed=cfg.seed,
                      **cfg.extra.get('model_kw', {}))
    tr = Trainer(net, data, cfg, LocalCommunicator(), bn_groups=workers)
    tr.train()
    return tr.params.state_dict()


def max_relative_difference(a, b):
    """max over parameters of max|a-b| / max(max|b|, 1e-8)."""
    worst = 0.0
    for name in b:
        d = np.max(np.abs(a[name] - b[name])) / max(float(np.max(np.abs(b[name]))), 1e-8)
        worst = max(worst, float(d))
    return worst


def main(args):
    """Run both, compare, print the figure last."""
    from ..launch.mpiexec import child_env
    from ..launch.postmortem import run_explained   # names a rank that died, hydra's trail held
    from ..launch.network_options import use_network
    from ..launch.reach import check_hostfile
    from ..launch.worker_job import worker_command, worker_env
    hostfile = getattr(args, 'hostfile', None)
    use_network(args)
    try:
        check_hostfile(hostfile)
    except BadInput as exc:        # a host unreachable (reach.Unreachable), a bad hostfile
        print('check-equivalence: the %d-rank run cannot start' % args.workers)
        sys.stderr.write('theanompi-ext: %s\n' % exc)
        return EXIT_BAD_INPUT
    # rank 0 writes params.npz there and the launcher reads it: across hosts, a
    # folder they all see (the current one, docs/multinode.md), not this host's $TMPDIR
    out = tempfile.mkdtemp(prefix='tmx-equiv-', dir=os.getcwd() if hostfile else None)
    cfg = _cfg(args, out)
    tol = tolerance(args.wire_dtype)
    print('check-equivalence: %s, %d workers x %d examples, %d steps, kn-batch %d; '
          'tolerance %.1e (relative, %s wire)' % (cfg.model, args.workers, args.batch,
                                                  args.steps, args.workers * args.batch,
                                                  tol, args.wire_dtype))
    if args.wire_dtype != 'float32':
        print('check-equivalence: the reference sums in float32; a %s wire rounds each '
              'summed gradient by up to 2u = %.1e and momentum %.1f keeps 1/(1-m) = %.0f '
              'times that: tolerance 2u/(1-m)' % (args.wire_dtype, tol * (1 - MOMENTUM),
                                                  MOMENTUM, 1 / (1 - MOMENTUM)))
    sys.stdout.flush()        # the ranks' lines follow ours
    rc = run_explained(worker_command(args.workers, hostfile),
                       env=worker_env(cfg.to_dict(), child_env()), size=args.workers,
                       hostfile=hostfile, timeout=args.timeout,
                       heading=lambda rc: 'check-equivalence: the %d-rank run failed (exit %d)'
                       % (args.workers, rc))
    if rc != EXIT_OK:
        return rc
    with np.load(os.path.join(out, 'params.npz')) as z:
        dist = {k: z[k] for k in z.files}
    cfg.out = ''
    ref = reference_params(cfg, args.workers)
    diff = max_relative_difference(dist, ref)
    ok = diff <= tol
    print('check-equivalence: %s' % ('PASS' if ok else 'FAIL (exceeds %.1e)' % tol))
    print('max relative parameter difference: %.3e' % diff)
    return EXIT_OK if ok else EXIT_CHECK_FAILED


def register(sub):
    """Add the ``check-equivalence`` sub-command."""
    p = sub.add_parser('check-equivalence',
                       help='k ranks vs one process on the same kn examples')
    from .options import ModelNames
    from ..launch.network_options import add_network_arguments
    from ..collective.wire import WIRE_DTYPES
    from ..exchange.modes import EXCH_STRATEGIES
    p.add_argument('--workers', type=int, default=2, metavar='K',
                   help='k, ranks of the distributed run (default %(default)s)')
    p.add_argument('--steps', type=int, default=30, metavar='N',
                   help='SGD steps of each run, iterations (default %(default)s)')
    p.add_argument('--batch', type=int, default=16, metavar='N',
                   help='n, examples per worker per step; the one process takes k x n and '
                        'this is also the reference batch (default %(default)s)')
    p.add_argument('--model', default='digits_cnn', choices=ModelNames(), metavar='NAME',
                   help='network of both runs, one of %(choices)s (default %(default)s)')
    p.add_argument('--lr', type=float, default=0.1, metavar='LR',
                   help='learning rate after the one-epoch gradual warm-up (default '
                        '%(default)s)')
    p.add_argument('--epochs', type=int, default=4, metavar='EPOCHS',
                   help='length of the schedule, epochs: the rate decays at its last one; '
                        '--steps may end the runs earlier (default %(default)s)')
    p.add_argument('--subset', type=int, default=256, metavar='N',
                   help='training examples used, the first N of the digits '
                        '(default %(default)s)')
    p.add_argument('--exch-strategy', default='ar', choices=EXCH_STRATEGIES,
                   help='how the distributed run exchanges, one of %(choices)s: one '
                        'allreduce after the backward, or buckets during it (default '
                        '%(default)s)')
    p.add_argument('--wire-dtype', default='float32', choices=WIRE_DTYPES,
                   help='what the distributed run\'s gradient buckets travel as, one of '
                        '%(choices)s; the reference stays float32 (default %(default)s)')
    p.add_argument('--hostfile', default=None, metavar='FILE',
                   help='MPI host file: the K ranks across machines; the run folder is then '
                        'made in the current folder, which every host must see (default: '
                        'all on this machine, folder in $TMPDIR)')
    add_network_arguments(p)
    p.add_argument('--timeout', type=float, default=600, metavar='S',
                   help='the distributed run is stopped after this many seconds '
                        '(default %(default)s)')
    p.add_argument('--device', default='cpu', metavar='DEV',
                   help='device of the K ranks (cpu, cuda0, opencl0:0, or one per rank: '
                        'cuda0,cuda1); the one-process reference runs on the CPU (default '
                        '%(default)s)')
    p.set_defaults(func=main)
