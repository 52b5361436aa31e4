"""Seconds per iteration of Theano-MPI models through our worker's loop, interleaved.

Run under mpiexec (every rank)::

    PYTHONPATH=examples/theanompi_style mpiexec -n 2 .venv/bin/python \
        scripts/contract_iter_time.py --models resnet20_tm:ResNet20TM,resnet20_tm:ResNet20TMHooked \
        --exch ar-overlap --reps 8 [--json OUT.json]

Every rank builds each model as the worker does
(``theanompi_compat.worker``: the model, its ``compile_iter_fns``, the
exchange mode :func:`choose_mode` picks, a :class:`ContractStepper` that
takes over its train functions) and then runs blocks of one epoch each
through the worker's own epoch loop (``worker._train_epoch``: the hook
``load_train_batch`` + our step where the model has the hook, else the
model's own ``train_iter`` calling our step), the models alternating
block by block and the order rotating each repetition, after one untimed
warm-up epoch each. A block's seconds per iteration is its wall time
(after a barrier, the slower rank's) over its iterations. Rank 0 prints,
per model, the median over blocks with the min and max, and its ratio to
the last model: the median over repetitions of the ratio of the two blocks
of one repetition (run one after the other, so a load that comes and goes
on a shared machine weighs on both alike), with the min and max of those
ratios; ``--json`` writes them.
"""
import argparse
import json
import sys
import time

import numpy as np


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--models', required=True, metavar='M:C,M:C',
                   help='comma-separated MODULE:CLASS of Theano-MPI models (the last is the '
                        'reference of the ratios)')
    p.add_argument('--exch', default='ar', choices=('ar', 'ar-overlap'),
                   help='exch_strategy (sync_type kn)')
    p.add_argument('--reps', type=int, default=8, help='timed epochs per model')
    p.add_argument('--train-files', type=int, default=0, metavar='N',
                   help="set the model module's n_train_files (file batches per rank per "
                        "epoch, a module-level hyper-parameter as in Theano-MPI's model files) "
                        "before building: shorter epochs, finer alternation (0: the module's)")
    p.add_argument('--json', default='', help='rank 0 writes the results here')
    return p.parse_args(argv)


def build(comm, spec, exch, devices):
    """(model, stepper, opts, mode) for ``spec`` = 'module:Class', as the worker builds them."""
    from theanompi_ext.theanompi_compat import worker
    from theanompi_ext.theanompi_compat.options import resolve_options
    from theanompi_ext.theanompi_compat.stepper import ContractStepper
    module, _, cls = spec.partition(':')
    model = worker._build_model(comm, module, cls, 'kn', exch, devices)
    opts = resolve_options(model)
    mode, why, chunks = worker.choose_mode(model, exch)
    stepper = ContractStepper(model, comm, 'kn', opts, log=lambda *a, **k: None,
                              overlap=mode == 'ar-overlap', chunks=chunks)
    stepper.take_over()
    return model, stepper, opts, mode


def time_blocks(comm, built, reps):
    """{spec: [seconds per iteration of each timed block]} (this rank's)."""
    from theanompi_ext.theanompi_compat.worker import Recorder, _train_epoch
    specs = list(built)
    times = {s: [] for s in specs}

    def epoch(spec):
        model, stepper, opts, _ = built[spec]
        before = stepper.iteration
        comm.barrier()
        t0 = time.perf_counter()
        _train_epoch(model, stepper, opts, Recorder())
        model.reset_iter('train')
        return (time.perf_counter() - t0) / max(stepper.iteration - before, 1)

    for spec in specs:
        epoch(spec)                                   # warm-up
    for rep in range(reps):
        k = rep % len(specs)
        for spec in specs[k:] + specs[:k]:
            times[spec].append(epoch(spec))
    return times


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    from theanompi_ext.collective import create_communicator
    from theanompi_ext.engine.open import open_on_every_rank
    comm = create_communicator('auto')
    devices = ['cpu%d' % r for r in range(comm.size)]
    open_on_every_rank(devices[comm.rank], comm)
    specs = [s for s in args.models.split(',') if s]
    if args.train_files > 0:
        import importlib
        for s in specs:
            importlib.import_module(s.partition(':')[0]).n_train_files = args.train_files
    built = {s: build(comm, s, args.exch, devices) for s in specs}
    mine = time_blocks(comm, built, args.reps)
    # The slower rank's time of each block.
    every = comm.allgather(json.dumps(mine))
    if comm.rank == 0:
        blocks = {s: np.max([json.loads(e)[s] for e in every], axis=0) for s in specs}
        rows = []
        for s in specs:
            med = float(np.median(blocks[s]))
            ratios = blocks[s] / blocks[specs[-1]]        # repetition by repetition
            rows.append(dict(model=s, ranks=comm.size, exch=args.exch, mode=built[s][3],
                             iters_per_block=built[s][1].iters_per_epoch, blocks=len(blocks[s]),
                             median_s=med, min_s=float(np.min(blocks[s])),
                             max_s=float(np.max(blocks[s])),
                             ratio_to_last=float(np.median(ratios)),
                             ratio_min=float(np.min(ratios)), ratio_max=float(np.max(ratios)),
                             block_s=[float(v) for v in blocks[s]]))
            print('%-36s %d rank(s) %-10s (mode %s): %.4f s/iteration median of %d blocks '
                  '(min %.4f, max %.4f); x%.3f of the last (paired, min %.3f, max %.3f)' % (
                      s, comm.size, args.exch, built[s][3], med, len(blocks[s]),
                      rows[-1]['min_s'], rows[-1]['max_s'], rows[-1]['ratio_to_last'],
                      rows[-1]['ratio_min'], rows[-1]['ratio_max']))
        if args.json:
            with open(args.json, 'w') as f:
                json.dump(rows, f, indent=1)
    for model, _, _, _ in built.values():
        model.cleanup()
    comm.barrier()
    if hasattr(comm, 'close'):
        comm.close()
    return 0


if __name__ == '__main__':
    sys.exit(main())
