"""Run 2 steps of a sync rule on hand-set vectors; rank 0 prints all ranks' results.

usage: run_rules.py SYNC_TYPE GRADS_JSON   (no Theano: numpy + MPI only)
GRADS_JSON: a list with one gradient (4 numbers) per rank.
Layout: W (2 entries, weight), b (1, bias), gamma (1, BN affine, local).
"""
import json
import sys
from types import SimpleNamespace

import numpy as np

from theanompi_ext.collective.mpi import MPICommunicator
from theanompi_ext.params import ParamLayout
from theanompi_ext.buckets.plan import plan_buckets
from theanompi_ext.exchange.knsum import KnSumExchanger
from theanompi_ext.update.rules import make_rule


def main():
    comm = MPICommunicator()
    grads = json.loads(sys.argv[2])
    assert len(grads) == comm.size, 'one gradient per rank: %d for %d ranks' % (
        len(grads), comm.size)
    layout = ParamLayout([('W', (2,), 'float32'), ('b', (1,), 'float32'),
                          ('gamma', (1,), 'float32')])
    tags = [frozenset({'trainable'}), frozenset({'trainable', 'bias'}),
            frozenset({'trainable', 'bn_affine'})]
    opts = SimpleNamespace(weight_decay=0.01, momentum=0.9, momentum_form='eq9', nesterov=False)
    exch = KnSumExchanger(comm, plan_buckets(layout.sizes, 2), layout.offsets[2])
    rule = make_rule(sys.argv[1], comm, layout, layout.offsets[2], tags, opts, comm.size)
    w = np.array([1.0, 2.0, 0.5, 1.0], np.float32)
    steps = []
    for _ in range(2):
        g = np.array(grads[comm.rank], np.float32)
        if rule.exchanges_gradient:          # as the step does (step/run.py)
            exch.reduce(g)
        rule.update(w, g, 0.1)
        steps.append(w.tolist())
    everything = comm.allgather(steps)
    if comm.rank == 0:
        print(json.dumps(everything))
    comm.close()


if __name__ == '__main__':
    main()
