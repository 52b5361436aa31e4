"""Train an MLP with an absurd learning rate until the loss is not finite."""
import sys

from theanompi_ext.train.config import TrainConfig
from theanompi_ext.train.worker import run, guarded

cfg = TrainConfig(model='mlp', batch_per_worker=8, epochs=3, base_lr=1e12, warmup='none',
                  momentum=0.0, weight_decay=0.0, quiet=True, eval_every=100,
                  extra={'train_subset': 64})
sys.exit(guarded(lambda: run(cfg)))
