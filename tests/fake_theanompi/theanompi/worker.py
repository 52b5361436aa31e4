"""Stand-in for Theano-MPI's BSP worker (tests only), following its real call pattern.

usage: mpiexec -n K python -m theanompi.worker DEVICE SYNC_TYPE EXCH_STRATEGY MODELFILE MODELCLASS

As Theano-MPI's worker does: it refuses ``THEANO_FLAGS``, sets
``device=...`` and imports Theano *before* the model (so the user's
``.theanorc`` configures it), builds ``modelclass(config)``, calls
``compile_iter_fns(sync_type)``, makes the exchanger, and per epoch runs
``lr_warmup`` (``shared_lr`` times ``k**(1/5)`` at the start of epochs
1..5), then for each file batch ``model.n_subb`` times ``train_iter`` +
``exchange``, a validation pass over every sub-batch, ``adjust_hyperp``;
``cleanup`` at the end. Rank 0 prints one JSON line: the exchanger's
module, the recorder's mode counts, every rank's parameters, the final
``shared_lr``.
"""
import importlib
import json
import os
import sys


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


class BSP_Worker(object):  # noqa: N801 (Theano-MPI's name)
    def __init__(self, device, sync_type, exch_strategy):
        from mpi4py import MPI
        self.comm = MPI.COMM_WORLD
        self.rank, self.size = self.comm.rank, self.comm.size
        if 'THEANO_FLAGS' in os.environ:
            raise ValueError('Use theanorc to set the theano config')
        os.environ['THEANO_FLAGS'] = 'device=%s' % device
        import theano  # noqa: F401  (before the model, as the real worker does)
        self.sync_type, self.exch_strategy = sync_type, exch_strategy

    def build(self, model, config):
        model.compile_iter_fns(sync_type=self.sync_type)
        self.recorder = Recorder()
        from theanompi.lib.exchanger import BSP_Exchanger
        self.exchanger = BSP_Exchanger(self.comm, None, self.exch_strategy, self.sync_type,
                                       None, model)

    def lr_warmup(self, model, epoch):
        import numpy as np
        if epoch == 0:
            self.warmup_epochs = 5.
            self.power_base = self.size ** (1. / self.warmup_epochs)
        elif epoch <= self.warmup_epochs:
            model.shared_lr.set_value(np.float32(model.shared_lr.get_value() *
                                                 self.power_base))

    def BSP_run(self, model):  # noqa: N802
        self.comm.Barrier()
        recorder, exchanger = self.recorder, self.exchanger
        for epoch in range(model.n_epochs):
            model.epoch = epoch
            self.lr_warmup(model, epoch)
            for batch_i in range(model.data.n_batch_train):
                for _ in range(model.n_subb):
                    model.train_iter(batch_i, recorder)
                    exchanger.exchange(recorder)
            model.reset_iter('train')
            self.comm.Barrier()
            for batch_j in range(model.data.n_batch_val):
                for _ in range(model.n_subb):
                    model.val_iter(batch_j, recorder)
            model.reset_iter('val')
            model.adjust_hyperp(epoch)
        model.cleanup()


def main():
    device, sync_type, exch_strategy, modelfile, modelclass = sys.argv[1:6]
    worker = BSP_Worker(device, sync_type, exch_strategy)
    config = {'verbose': worker.rank == 0, 'rank': worker.rank, 'size': worker.size,
              'mname': modelclass}
    modcls = getattr(importlib.import_module(modelfile), modelclass)
    model = modcls(config)
    worker.build(model, config)
    worker.BSP_run(model)
    values = [p.get_value().tolist() for p in model.params]
    out = worker.comm.gather(values)
    if worker.rank == 0:
        print(json.dumps({'exchanger': type(worker.exchanger).__module__,
                          'modes': worker.recorder.modes, 'params': out,
                          'shared_lr': float(model.shared_lr.get_value())}))


if __name__ == '__main__':
    main()
