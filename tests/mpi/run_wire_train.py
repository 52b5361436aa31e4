"""Train an MLP over a float16 wire with an absurd learning rate: the
gradients leave float16's range and the documented WireOverflow must end
the run on every rank. Alone (k = 1) nothing travels and nothing is cast:
the loss turns non-finite instead (NonFiniteLoss, status 3)."""
import sys

from theanompi_ext.train.config import TrainConfig
from theanompi_ext.train.worker import run, guarded

cfg = TrainConfig(model='mlp', batch_per_worker=8, epochs=3, base_lr=1e12, warmup='none',
                  momentum=0.0, weight_decay=0.0, quiet=True, eval_every=100,
                  wire_dtype='float16', extra={'train_subset': 64})
sys.exit(guarded(lambda: run(cfg)))
