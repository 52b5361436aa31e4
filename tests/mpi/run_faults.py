"""Train with a JSON config and inject one fault on one rank.

usage: run_faults.py CONFIG.json OUTDIR FAULT RANK ITERATION [ARG]

CONFIG.json holds one config or a list of configs, trained one after the
other in the same job (the fault applies to the first).

FAULT (done on RANK when it starts step ITERATION, or after it for corrupt):
  none     no fault
  kill     SIGKILL itself (what the OOM killer does)
  segv     SIGSEGV itself
  stop     SIGSTOP itself (alive, never progresses: a hung rank)
  raise    raise MemoryError (a Python-level out-of-memory)
  exit0    os._exit(0) (a library ending the process "successfully")
  sleep    sleep ARG seconds, then continue (a slow rank: a stall that recovers)
  corrupt  add ARG to the first exchanged parameter after the step (replicas diverge)
  nan      the batch holds NaN (a NaN in the input data)

Before the fault the rank prints ``FAULT <name> rank <r> pid <pid> at <time>``
(``time.time()``) on stderr. Rank 0 writes OUTDIR/summary<i>.json (without the
config) for config i; every rank writes OUTDIR/rank<r>_<i>.json with its
iteration count.
"""
import json
import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI

from theanompi_ext.train.config import TrainConfig
from theanompi_ext.train.trainer import Trainer
from theanompi_ext.train.worker import run, guarded


def inject(fault, rank, at, arg):
    me = MPI.COMM_WORLD.rank
    step = Trainer.step
    done = []

    def faulty_step(self, x, y):
        if me != rank or self.iteration != at or done:
            return step(self, x, y)
        sys.stderr.write('FAULT %s rank %d pid %d at %.6f\n'
                         % (fault, me, os.getpid(), time.time()))
        sys.stderr.flush()
        done.append(fault)
        if fault in ('kill', 'segv', 'stop'):
            sig = {'kill': signal.SIGKILL, 'segv': signal.SIGSEGV, 'stop': signal.SIGSTOP}
            os.kill(os.getpid(), sig[fault])
        elif fault == 'raise':
            raise MemoryError('injected: cannot allocate the activations')
        elif fault == 'exit0':
            os._exit(0)
        elif fault == 'sleep':
            time.sleep(arg)
        elif fault == 'nan':
            x = np.array(x, copy=True)
            x.flat[0] = np.nan
        out = step(self, x, y)
        if fault == 'corrupt':
            self.params.values[0] += np.float32(arg)
            self.params.push()
        return out

    if fault != 'none':
        Trainer.step = faulty_step


def main():
    cfg_path, out, fault, rank, at = sys.argv[1:6]
    arg = float(sys.argv[6]) if len(sys.argv) > 6 else 0.0
    with open(cfg_path) as f:
        d = json.load(f)
    cfgs = [TrainConfig.from_dict(c) for c in (d if isinstance(d, list) else [d])]
    inject(fault, int(rank), int(at), arg)
    me = MPI.COMM_WORLD.rank

    def go():
        for i, cfg in enumerate(cfgs):
            summary, trainer = run(cfg)
            with open(os.path.join(out, 'rank%d_%d.json' % (me, i)), 'w') as f:
                json.dump({'iteration': trainer.iteration,
                           'iters_per_epoch': trainer.iters_per_epoch}, f)
            if me == 0:
                with open(os.path.join(out, 'summary%d.json' % i), 'w') as f:
                    json.dump({k: v for k, v in summary.items() if k != 'config'}, f)
    return guarded(go)


if __name__ == '__main__':
    sys.exit(main())
