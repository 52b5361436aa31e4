"""Train with a JSON config and inject one fault on one rank.

usage: run_faults.py CONFIG.json OUTDIR FAULT RANK ITERATION [ARG]

CONFIG.json holds one config or a list of configs, trained one after the
other in the same job (the fault applies to the first).

FAULT (done on RANK when it starts step ITERATION, or after it for corrupt):
  none     no fault
  kill     SIGKILL itself (what the OOM killer does)
  term     SIGTERM itself (`kill PID` of that rank alone)
  int      SIGINT itself (`kill -INT PID` of that rank alone)
  segv     SIGSEGV itself
  stop     SIGSTOP itself (alive, never progresses: a hung rank)
  raise    raise MemoryError (a Python-level out-of-memory)
  exit0    os._exit(0) (a library ending the process "successfully")
  sleep    sleep ARG seconds, then continue (a slow rank: a stall that recovers)
  corrupt  add ARG to the first exchanged parameter after the step (replicas diverge)
  nan      the batch holds NaN (a NaN in the input data)
  stopwrite  SIGSTOP itself in the first checkpoint save at or after ITERATION:
           rank 0 inside the file write, another rank as it enters the save
  stopfinal  SIGSTOP itself (rank 0) while writing the final outputs
  slowwrite  rank 0: in the first checkpoint write at or after ITERATION, once the
           file is written and before it is renamed, sleep ARG seconds (a slow disk)

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
        if fault in ('kill', 'term', 'int', 'segv', 'stop'):
            sig = {'kill': signal.SIGKILL, 'term': signal.SIGTERM, 'int': signal.SIGINT,
                   'segv': signal.SIGSEGV, 'stop': signal.SIGSTOP}
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

    if fault in ('stopwrite', 'stopfinal', 'slowwrite'):
        inject_write(fault, rank, at, arg)
    elif fault != 'none':
        Trainer.step = faulty_step


def announce(fault, me, iteration):
    sys.stderr.write('FAULT %s rank %d pid %d at %.6f iteration %d\n'
                     % (fault, me, os.getpid(), time.time(), iteration))
    sys.stderr.flush()


def inject_write(fault, rank, at, arg):
    from theanompi_ext.files import atomic
    from theanompi_ext.train import checkpoint
    me = MPI.COMM_WORLD.rank
    if me != rank:
        return
    save, write_tmp, write_all = checkpoint.save, atomic._write_tmp, atomic.write_all
    armed = []

    def faulty_save(trainer, path, partial=None, **kw):
        if trainer.iteration >= at and not armed:
            armed.append(trainer.iteration)
            if me != 0:
                announce(fault, me, trainer.iteration)
                os.kill(os.getpid(), signal.SIGSTOP)
        return save(trainer, path, partial, **kw)

    def faulty_write_tmp(path, data, what):
        if len(armed) != 1:
            return write_tmp(path, data, what)
        armed.append('done')
        if fault == 'stopwrite':
            announce(fault, me, armed[0])
            os.kill(os.getpid(), signal.SIGSTOP)
        tmp = write_tmp(path, data, what)
        announce(fault, me, armed[0])
        time.sleep(arg)
        return tmp

    def faulty_write_all(files, what='the outputs'):
        announce(fault, me, -1)
        os.kill(os.getpid(), signal.SIGSTOP)
        return write_all(files, what)

    if fault == 'stopfinal':
        atomic.write_all = faulty_write_all
    else:
        checkpoint.save = faulty_save
        atomic._write_tmp = faulty_write_tmp


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
