"""Our side of ``bench compare``, inside each rank: the trainers and their timed modes.

Started by :func:`theanompi_ext.bench.compare.run_setting` as
``python -m theanompi_ext.bench.compare_rank SPEC.json`` on every rank.
"""
import json
import os
import sys

import numpy as np

from .common import rank_main
from .compare_systems import WIRE_SUFFIX, ours_modes
from .timing import time_modes


def measure_ours(spec):
    """Time this project's modes on this rank (collective over COMM_WORLD).

    Returns, on every rank, ``{mode: [[per-step seconds] of each rank]}``
    for :func:`.compare_systems.ours_modes` of ``spec['wire_dtypes']``, plus sizes. The
    compute modes run on the first wire's trainers (they exchange nothing).
    """
    from ..collective.registry import create_communicator
    from ..collective.watchdog import watch
    from .overlap import synthetic_dataset, compute_step
    # As users run it: the trainers' step watchdog included (one shared), and the
    # topology as `train` chooses it (two-level across hosts by default; a flat
    # 16-bit wire crosses the link twice as much: docs/exchange-across-hosts.md)
    comm = watch(create_communicator('mpi', topology=spec.get('topology', 'auto')))
    n, k = spec['batch'], comm.size
    wires = spec.get('wire_dtypes', ['float32'])
    data = synthetic_dataset(tuple(spec['model_spec']['input_shape']), 4 * n * k,
                             spec['n_classes'])
    trainers = {(s, w): _our_trainer(comm, spec, data, s, w)
                for w in wires for s in ('ar', 'ar-overlap')}
    x, y = data.train_batch(np.arange(comm.rank * n, (comm.rank + 1) * n))
    lr = np.float32(0.001)
    first = trainers['ar', wires[0]]
    zeros = np.zeros_like(first.grads)
    run = {'compute': lambda: compute_step(first, x, y, lr),
           'compute_chunked': lambda: compute_step(trainers['ar-overlap', wires[0]], x, y, lr)}
    for w in wires:
        serial, overlap = trainers['ar', w], trainers['ar-overlap', w]
        sfx = WIRE_SUFFIX[w]
        run['serial' + sfx] = lambda t=serial: t.step(x, y)
        run['overlap' + sfx] = lambda t=overlap: t.step(x, y)
        run['allreduce' + sfx] = lambda t=serial: t.exchanger.reduce(zeros)
    modes = ours_modes(wires)
    cpu = {}
    local = time_modes(run, modes, spec['steps'], spec['reps'], comm.barrier,
                       warmup=spec['warmup'], cpu=cpu)
    everyone = [json.loads(e) for e in comm.allgather(json.dumps(local))]
    out = {mode: [[float(v) for v in r[mode]] for r in everyone] for mode in modes}
    out['cpu_per_wall'] = cpu_per_wall([json.loads(e) for e in comm.allgather(json.dumps(cpu))])
    # --mpi-env as the ranks got it (rank 0's view: every rank has the same environment)
    out['mpi_env'] = {key: os.environ.get(key) for key in spec.get('mpi_env', {})}
    out.update(topology=comm.topology_in_use, grad_bytes=4 * int(first.n_exch),
               params=int(first.layout.total),
               buckets=len(first.buckets),
               chunks=trainers['ar-overlap', wires[0]].backward.n_chunks, ranks=k)
    comm.barrier()
    comm.close()
    return out


def cpu_per_wall(per_rank):
    """``{mode: [CPU seconds / wall seconds of each rank]}`` from each rank's
    ``{mode: [CPU s, wall s]}`` (:func:`.timing.time_modes`' ``cpu``): the
    process's CPU, every thread of it, so over 1 where the communication
    thread runs beside the compute, under 1 where the rank waited or was
    off its core."""
    return {m: [c[m][0] / max(c[m][1], 1e-9) for c in per_rank] for m in per_rank[0]}


def _our_trainer(comm, spec, data, strategy, wire):
    """A trainer of ``spec``'s model with ``exch_strategy=strategy`` and ``wire_dtype=wire``."""
    from ..model import build_model
    from ..model.resnet import cifar_resnet
    from ..train.config import TrainConfig
    from ..train.trainer import Trainer
    m, shape = spec['model_spec'], tuple(spec['model_spec']['input_shape'])
    if m['kind'] == 'cifar_resnet':
        net = cifar_resnet(shape, spec['n_classes'], depth=m['depth'], width=m['width'],
                           seed=0, name=spec['model'])
    else:
        net = build_model(m['kind'], shape, spec['n_classes'], seed=0, width=m['width'])
    cfg = TrainConfig(model=spec['model'], batch_per_worker=spec['batch'], epochs=1,
                      warmup='none', base_lr=0.01, quiet=True, checkpoint=False,
                      exchange_bn=True, exch_strategy=strategy, wire_dtype=wire)
    return Trainer(net, data, cfg, comm, log=lambda *a, **kw: None)


def worker_main(spec_path):
    """Entry point of each rank: ``python -m theanompi_ext.bench.compare SPEC.json``."""
    return rank_main(spec_path, measure_ours)



if __name__ == '__main__':
    sys.exit(worker_main(sys.argv[1]))
