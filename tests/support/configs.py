"""Small training configurations written for rank scripts (tests/mpi/run_faults.py)."""
import json


def write_cfg(path, **kw):
    """A short MLP run as JSON at ``path``, ``kw`` overriding its fields; returns ``path``."""
    d = dict(model='mlp', batch_per_worker=8, epochs=3, warmup='none', quiet=True,
             eval_every=100, max_steps=6, extra={'train_subset': 100, 'model_kw': {'hidden': [8]}})
    d.update(kw)
    with open(path, 'w') as f:
        json.dump(d, f)
    return path
