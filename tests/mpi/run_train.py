"""Train with a JSON config on every rank; save each rank's parameters.

usage: run_train.py CONFIG.json OUTDIR [RANK_OVERRIDES.json]
RANK_OVERRIDES maps a rank number to config fields that rank changes
(used to make ranks disagree on purpose).
"""
import json
import os
import sys

import numpy as np
from mpi4py import MPI

from theanompi_ext.train.config import TrainConfig
from theanompi_ext.train.worker import run, guarded


def main():
    rank = MPI.COMM_WORLD.rank
    with open(sys.argv[1]) as f:
        d = json.load(f)
    if len(sys.argv) > 3:
        with open(sys.argv[3]) as f:
            d.update(json.load(f).get(str(rank), {}))
    cfg = TrainConfig.from_dict(d)
    out = sys.argv[2]

    def go():
        summary, trainer = run(cfg)
        np.savez(os.path.join(out, 'rank%d.npz' % rank), **trainer.params.state_dict())
        if rank == 0:
            with open(os.path.join(out, 'summary.json'), 'w') as f:
                json.dump({k: v for k, v in summary.items() if k != 'config'}, f)
    return guarded(go)


if __name__ == '__main__':
    sys.exit(main())
