"""Write checkpoints in a loop until killed (no Theano, no MPI).

usage: ckpt_writer.py OUT_DIR FIRST_VERSION ENTRIES

Version v is a checkpoint whose every value is v and whose iteration is v;
after each complete save the script prints ``saved v``. Used to kill -9 the
writer at random moments and check the file left behind is whole.
"""
import sys
from types import SimpleNamespace

import numpy as np

from theanompi_ext.collective.local import LocalCommunicator
from theanompi_ext.params import ParamLayout
from theanompi_ext.train import checkpoint
from theanompi_ext.train.config import TrainConfig


class _Rule(object):
    sync_type = 'kn'

    def __init__(self, size):
        self.velocity = np.zeros(size, np.float32)
        self.lr_prev = 0.0

    def state(self):
        return {'velocity': self.velocity, 'lr_prev': self.lr_prev}

    def load_state(self, state):
        self.velocity[...] = state['velocity']
        self.lr_prev = state['lr_prev']


class _Stat(object):
    def __init__(self, name, n):
        self.name, self.value = name, np.zeros(n, np.float32)

    def get_value(self):
        return self.value

    def set_value(self, v):
        self.value = np.asarray(v, np.float32)


def fake_trainer(out, entries):
    """An object with what checkpoint.save/load use: one exchanged vector, a local tail."""
    layout = ParamLayout([('w', (entries,), 'float32'), ('bn.gamma', (8,), 'float32')])
    values = np.zeros(layout.total, np.float32)
    return SimpleNamespace(
        comm=LocalCommunicator(), layout=layout, n_exch=entries, iteration=0, history=[],
        cfg=TrainConfig(model='fake', out=out), rule=_Rule(layout.total),
        params=SimpleNamespace(values=values, push=lambda: None),
        net=SimpleNamespace(stats=[_Stat('bn.mean', 8)]))


def set_version(tr, v):
    """Make every saved number of ``tr`` equal to ``v``."""
    tr.iteration = v
    tr.params.values[...] = v
    tr.rule.velocity[...] = v
    tr.rule.lr_prev = float(v)
    tr.net.stats[0].value[...] = v
    tr.history = [{'version': v}]


def main():
    out, first, entries = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    tr = fake_trainer(out, entries)
    path = tr.cfg.out + '/' + checkpoint.FILENAME
    v = first
    while True:
        set_version(tr, v)
        checkpoint.save(tr, path, {'version': v})
        sys.stdout.write('saved %d\n' % v)
        sys.stdout.flush()
        v += 1


if __name__ == '__main__':
    main()
