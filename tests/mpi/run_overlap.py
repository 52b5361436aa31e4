"""Rank program for tests/test_overlap.py.

usage:
  run_overlap.py equiv MODEL STEPS VARIANTS_JSON OUT.npz
      Train STEPS steps of MODEL on the digits once per variant
      ``[exch_strategy, bucket_cap_mb, first_bucket_cap_mb]``; rank 0 saves
      each variant's final flat parameters (``v0``, ``v1``, ...) and, per
      variant, whether the exchanged parameters agree bitwise across ranks
      (``agree``), the number of buckets (``buckets``) and the number of
      exchanged entries (``n_exch``); ``initial`` is the flat vector every
      variant starts from.
  run_overlap.py mismatch
      Every rank builds a trainer with the bucket caps given for it in
      ``$OVERLAP_TEST_CAPS`` (comma-separated, one per rank); a rank whose
      trainer refuses prints ``rank R refused: <message>`` and exits 3.
  run_overlap.py trace STRATEGY STEPS PREFIX
      ``worker.run`` with ``cfg.timeline = PREFIX`` (the trainer's hook).
"""
import json
import os
import sys

import numpy as np
from mpi4py import MPI

from theanompi_ext.collective import create_communicator
from theanompi_ext.data import shards
from theanompi_ext.data.digits import load_digits
from theanompi_ext.model import build_model
from theanompi_ext.train.config import TrainConfig
from theanompi_ext.train.trainer import Trainer

MODEL_KW = {'mlp': {'hidden': (32, 16), 'bn': True}}


def watched(comm):
    """Wrap once so successive trainers share one watchdog (if the build has it)."""
    try:
        from theanompi_ext.collective.watchdog import watch
    except ImportError:
        return comm
    return watch(comm)


class CachedBackward(Trainer):
    """A Trainer that compiles each backward kind once per process.

    Every variant trains the same ``net`` from the same initial values, so
    the compiled functions of the first trainer of a kind serve the later
    ones (the shared variables they read are rebound to each new trainer's
    flat vector); this keeps the test's compile time to two builds.
    """
    cache = {}

    def _build_backward(self, bn_groups):
        key = (id(self.net), self.cfg.exch_strategy)
        if key not in self.cache:
            self.cache[key] = Trainer._build_backward(self, bn_groups)
        return self.cache[key]


def equiv(model, steps, variants, out):
    comm = watched(create_communicator('mpi'))
    data = load_digits()
    net = build_model(model, data.input_shape, data.n_classes, seed=0,
                      **MODEL_KW.get(model, {}))
    initial = [v.get_value().copy() for v in net.params + net.stats]
    finals, agree, nbuckets, n_exch = {}, [], [], []
    for i, (strategy, cap, first_cap) in enumerate(variants):
        cfg = TrainConfig(model=model, exch_strategy=strategy, bucket_cap_mb=cap,
                          first_bucket_cap_mb=first_cap, quiet=True, checkpoint=False,
                          batch_per_worker=16, warmup='none', base_lr=0.1)
        for var, value in zip(net.params + net.stats, initial):
            var.set_value(value.copy())
        tr = CachedBackward(net, data, cfg, comm)
        if i == 0:
            finals['initial'] = tr.params.values.copy()
        comm.barrier()    # rank 0 compiled first: start the timed steps together
        perm = shards.epoch_permutation(len(data.y_train), 0, cfg.data_seed)
        for it in range(steps):
            tr.step(*data.train_batch(tr.batch_indices(perm, it)))
        exchanged = tr.params.values[:tr.n_exch].tobytes()
        agree.append(len(set(comm.allgather(exchanged.hex()))) == 1)
        finals['v%d' % i] = tr.params.values.copy()
        nbuckets.append(len(tr.buckets))
        n_exch.append(tr.n_exch)
    if comm.rank == 0:
        np.savez(out, agree=np.array(agree), buckets=np.array(nbuckets),
                 n_exch=np.array(n_exch), **finals)
    comm.barrier()
    comm.close()
    return 0


def mismatch():
    rank = MPI.COMM_WORLD.rank
    caps = [float(c) for c in os.environ['OVERLAP_TEST_CAPS'].split(',')]
    comm = create_communicator('mpi')
    data = load_digits()
    cfg = TrainConfig(model='mlp', exch_strategy='ar-overlap', bucket_cap_mb=caps[rank],
                      first_bucket_cap_mb=caps[rank], quiet=True, checkpoint=False)
    net = build_model('mlp', data.input_shape, data.n_classes, seed=0, **MODEL_KW['mlp'])
    try:
        Trainer(net, data, cfg, comm)
    except ValueError as exc:
        sys.stderr.write('rank %d refused: %s\n' % (rank, exc))
        sys.stderr.flush()
        return 3
    return 0


def trace(strategy, steps, prefix):
    from theanompi_ext.train.worker import run, guarded
    cfg = TrainConfig(model='digits_cnn', exch_strategy=strategy, max_steps=steps,
                      timeline=prefix, quiet=True, checkpoint=False, warmup='none',
                      bucket_cap_mb=0.02, first_bucket_cap_mb=0.005,
                      epochs=1000, eval_every=1000)
    return guarded(lambda: run(cfg))


def main(argv):
    mode = argv[0]
    if mode == 'equiv':
        return equiv(argv[1], int(argv[2]), json.loads(argv[3]), argv[4])
    if mode == 'mismatch':
        return mismatch()
    if mode == 'trace':
        return trace(argv[1], int(argv[2]), argv[3])
    raise SystemExit('unknown mode %r' % mode)


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
