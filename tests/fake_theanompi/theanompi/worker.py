"""Stand-in for Theano-MPI's BSP worker loop (the documented call pattern only).

usage: mpiexec -n K python worker.py DEVICE SYNC_TYPE EXCH_STRATEGY MODELFILE MODELCLASS
"""
import importlib
import json
import sys

from theanompi.lib.exchanger import BSP_Exchanger


class Recorder(object):
    def __init__(self):
        self.modes = {}

    def start(self):
        pass

    def end(self, mode):
        self.modes[mode] = self.modes.get(mode, 0) + 1

    def train_error(self, *a):
        pass

    def val_error(self, *a):
        pass


def main():
    from mpi4py import MPI
    device, sync_type, exch_strategy, modelfile, modelclass = sys.argv[1:6]
    comm = MPI.COMM_WORLD
    modcls = getattr(importlib.import_module(modelfile), modelclass)
    model = modcls({'verbose': comm.rank == 0, 'rank': comm.rank, 'size': comm.size,
                    'mname': modelclass})
    model.compile_iter_fns(sync_type=sync_type)
    recorder = Recorder()
    exchanger = BSP_Exchanger(comm, None, exch_strategy, sync_type, None, model)
    steps = int(getattr(model, 'test_steps', 3))
    for i in range(steps):
        model.train_iter(i, recorder)
        exchanger.exchange(recorder)
    model.cleanup()
    values = [p.get_value().tolist() for p in model.params]
    out = comm.gather(values)
    if comm.rank == 0:
        print(json.dumps({'exchanger': type(exchanger).__module__, 'modes': recorder.modes,
                          'params': out}))


if __name__ == '__main__':
    main()
