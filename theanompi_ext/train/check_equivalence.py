"""``theanompi-ext check-equivalence``: is k-worker training kn-batch SGD?

Trains a small BN model for T steps with K ranks x n examples (gamma/beta
in the allreduce, as the paper does), and again in one process on the same
kn examples with BN statistics over n-sized groups; prints the largest
relative parameter difference as its last line and exits 1 if it exceeds
the stated tolerance. A self-test to run on one's own cluster.
"""
import json
import os
import sys
import tempfile

import numpy as np

TOLERANCE = 1e-4


def _cfg(args, out):
    from .config import TrainConfig
    return TrainConfig(model=args.model, batch_per_worker=args.batch, epochs=args.epochs,
                       base_lr=args.lr, ref_batch=args.batch, warmup='gradual',
                       warmup_epochs=1, decay_epochs=(args.epochs - 1,),
                       momentum=0.9, weight_decay=1e-4, exchange_bn=True,
                       exch_strategy=args.exch_strategy, max_steps=args.steps,
                       eval_every=10 ** 6, quiet=True, out=out, device=args.device,
                       extra={'train_subset': args.subset}).validate()


def reference_params(cfg, workers):
    """Parameters after single-process training on the kn batches (BN per n-group),
    on this process's engine (the CPU)."""
    from ..collective.local import LocalCommunicator
    from ..model import build_model
    from .trainer import Trainer
    from .worker import load_dataset
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
    from ..launch import mpiexec_command, run_mpiexec
    from ..launch.mpiexec import child_env
    out = tempfile.mkdtemp(prefix='tmx-equiv-')
    cfg = _cfg(args, out)
    path = os.path.join(out, 'cfg.json')
    with open(path, 'w') as f:
        json.dump(cfg.to_dict(), f)
    print('check-equivalence: %s, %d workers x %d examples, %d steps, kn-batch %d; '
          'tolerance %.0e (relative, float32)' % (cfg.model, args.workers, args.batch,
                                                  args.steps, args.workers * args.batch,
                                                  TOLERANCE))
    cmd = mpiexec_command(args.workers, [sys.executable, '-m', 'theanompi_ext.train.worker', path])
    rc = run_mpiexec(cmd, env=child_env(), timeout=args.timeout)
    if rc != 0:
        print('check-equivalence: the %d-rank run failed (exit %d)' % (args.workers, rc))
        return 2
    with np.load(os.path.join(out, 'params.npz')) as z:
        dist = {k: z[k] for k in z.files}
    cfg.out = ''
    ref = reference_params(cfg, args.workers)
    diff = max_relative_difference(dist, ref)
    ok = diff <= TOLERANCE
    print('check-equivalence: %s' % ('PASS' if ok else 'FAIL (exceeds %.0e)' % TOLERANCE))
    print('max relative parameter difference: %.3e' % diff)
    return 0 if ok else 1


def register(sub):
    """Add the ``check-equivalence`` sub-command."""
    p = sub.add_parser('check-equivalence',
                       help='k ranks vs one process on the same kn examples')
    p.add_argument('--workers', type=int, default=2)
    p.add_argument('--steps', type=int, default=30)
    p.add_argument('--batch', type=int, default=16, help='n, examples per worker')
    p.add_argument('--model', default='digits_cnn')
    p.add_argument('--lr', type=float, default=0.1)
    p.add_argument('--epochs', type=int, default=4)
    p.add_argument('--subset', type=int, default=256, help='training examples used')
    p.add_argument('--exch-strategy', default='ar', choices=['ar', 'ar-overlap'])
    p.add_argument('--timeout', type=float, default=600)
    p.add_argument('--device', default='cpu',
                   help='device of the K ranks (cpu, cuda0, opencl0:0, or one per rank: '
                        'cuda0,cuda1); the one-process reference runs on the CPU')
    p.set_defaults(func=main)
