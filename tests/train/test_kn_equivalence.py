"""k real MPI ranks reproduce single-process kn-batch SGD, serial and overlapped.

The reference is independent of the package's training code: a numpy
float64 MLP with hand-written backprop, eq. (9) momentum, weight decay,
the gradual warm-up and a /10 decay computed by hand (tests/support/sgd_reference.py),
on the same per-epoch shuffles. k = 2 (n = 8) and k = 4 (n = 4) use
kn = 16, k = 3 (n = 5) kn = 15: 4 iterations per epoch of the 64 examples
either way. ``ar`` (exchange after backprop) runs at k = 2 and 4,
``ar-overlap`` (the default: buckets started during a chunked backward) at
k = 2 and 3.
"""
import json
import os

import numpy as np
import pytest

from support.sgd_reference import goyal_lr, momentum_step

SUBSET, EPOCHS, BASE_LR, REF = 64, 5, 0.1, 8
WARMUP_ITERS, DECAY_ITER = 8, 16            # 2 epochs of 4 iterations; decay at epoch 4


def kn_of(workers):
    """The global batch at ``workers`` ranks: 16, or 15 where 16 does not split."""
    return 16 if 16 % workers == 0 else 15


def config(workers, out, **kw):
    d = dict(model='mlp', batch_per_worker=kn_of(workers) // workers, epochs=EPOCHS,
             base_lr=BASE_LR, ref_batch=REF, warmup='gradual', warmup_epochs=2, decay_epochs=[4],
             momentum=0.9, weight_decay=1e-3, eval_every=100, quiet=True,
             extra={'train_subset': SUBSET, 'model_kw': {'hidden': [16]}})
    d.update(kw)
    path = os.path.join(out, 'cfg.json')
    with open(path, 'w') as f:
        json.dump(d, f)
    return path


def numpy_reference(kn):
    from theanompi_ext.data.digits import load_digits
    from theanompi_ext.data.shards import epoch_permutation
    from theanompi_ext.model import build_model
    data = load_digits(train_subset=SUBSET)
    net = build_model('mlp', data.input_shape, 10, seed=0, hidden=[16])
    p = {v.name: v.get_value().astype(np.float64) for v in net.params}
    u = {k: np.zeros_like(v) for k, v in p.items()}
    X = data.x_train.reshape(SUBSET, -1).astype(np.float64)
    t = 0
    for epoch in range(EPOCHS):
        perm = epoch_permutation(SUBSET, epoch, 0)
        for it in range(SUBSET // kn):
            idx = perm[it * kn:(it + 1) * kn]
            x, y = X[idx], data.y_train[idx]
            a = x @ p['fc0.W'] + p['fc0.b']
            h = np.maximum(a, 0)
            z = h @ p['out.W'] + p['out.b']
            e = np.exp(z - z.max(1, keepdims=True))
            dz = e / e.sum(1, keepdims=True)
            dz[np.arange(kn), y] -= 1
            dz /= kn                                   # loss over kn
            dh = (dz @ p['out.W'].T) * (a > 0)
            g = {'out.W': h.T @ dz, 'out.b': dz.sum(0), 'fc0.W': x.T @ dh, 'fc0.b': dh.sum(0)}
            lr = goyal_lr(t, BASE_LR, kn, REF, WARMUP_ITERS, [DECAY_ITER])
            names = sorted(p)
            momentum_step([p[k] for k in names], [u[k] for k in names], [g[k] for k in names],
                          lr, 0.9, 1e-3)
            t += 1
    return p


_REFERENCES = {}


def reference(kn):
    """The float64 parameters after training at global batch ``kn`` (computed once)."""
    if kn not in _REFERENCES:
        _REFERENCES[kn] = numpy_reference(kn)
    return _REFERENCES[kn]


def test_reference_learning_rates_by_hand():
    # kn = 16, ref 8: target 0.2, +0.0125 per iteration for 8 iterations, /10 at 16
    lrs = [goyal_lr(t, BASE_LR, 16, REF, WARMUP_ITERS, [DECAY_ITER])
           for t in (0, 1, 7, 8, 15, 16)]
    assert lrs == pytest.approx([0.1, 0.1125, 0.1875, 0.2, 0.2, 0.02])
    assert goyal_lr(8, BASE_LR, 15, REF, WARMUP_ITERS, [DECAY_ITER]) == pytest.approx(0.1875)


@pytest.mark.parametrize('workers,strategy', [(2, 'ar'), (4, 'ar'),
                                              (2, 'ar-overlap'), (3, 'ar-overlap')])
def test_k_ranks_equal_single_process_kn_sgd(mpirun, tmp_path, workers, strategy):
    res = mpirun(workers, 'run_train.py', config(workers, str(tmp_path), exch_strategy=strategy),
                 tmp_path, timeout=400)
    assert res.returncode == 0, res.stderr[-3000:]
    ranks = [dict(np.load(tmp_path / ('rank%d.npz' % r))) for r in range(workers)]
    for r in range(1, workers):                       # identical on every rank
        for k in ranks[0]:
            np.testing.assert_array_equal(ranks[0][k], ranks[r][k])
    kn = kn_of(workers)
    for k, ref in reference(kn).items():
        np.testing.assert_allclose(ranks[0][k], ref, rtol=2e-4, atol=2e-5, err_msg=k)
    summary = json.loads((tmp_path / 'summary.json').read_text())
    assert summary['iterations'] == 20 and summary['total_batch'] == kn
