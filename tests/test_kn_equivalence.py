"""k = 2 and k = 4 real MPI ranks reproduce single-process kn-batch SGD.

The reference is independent of the package's training code: a numpy
float64 MLP with hand-written backprop, eq. (9) momentum, weight decay,
the gradual warm-up and a /10 decay computed by hand, on the same
per-epoch shuffles. Both k = 2 (n = 8) and k = 4 (n = 4) use kn = 16.
"""
import json
import os

import numpy as np
import pytest

SUBSET, KN, EPOCHS, BASE_LR, REF = 64, 16, 5, 0.1, 8
WARMUP_ITERS, DECAY_ITER = 8, 16            # 2 epochs of 4 iterations; decay at epoch 4


def config(workers, out, **kw):
    d = dict(model='mlp', batch_per_worker=KN // workers, epochs=EPOCHS, base_lr=BASE_LR,
             ref_batch=REF, warmup='gradual', warmup_epochs=2, decay_epochs=[4],
             momentum=0.9, weight_decay=1e-3, eval_every=100, quiet=True,
             extra={'train_subset': SUBSET, 'model_kw': {'hidden': [16]}})
    d.update(kw)
    path = os.path.join(out, 'cfg.json')
    with open(path, 'w') as f:
        json.dump(d, f)
    return path


def hand_lr(t):
    target = BASE_LR * KN / REF                       # linear scaling: 0.2
    if t < WARMUP_ITERS:
        return BASE_LR + (target - BASE_LR) * t / WARMUP_ITERS
    return target * (0.1 if t >= DECAY_ITER else 1.0)


def numpy_reference():
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
        for it in range(SUBSET // KN):
            idx = perm[it * KN:(it + 1) * KN]
            x, y = X[idx], data.y_train[idx]
            a = x @ p['fc0.W'] + p['fc0.b']
            h = np.maximum(a, 0)
            z = h @ p['out.W'] + p['out.b']
            e = np.exp(z - z.max(1, keepdims=True))
            dz = e / e.sum(1, keepdims=True)
            dz[np.arange(KN), y] -= 1
            dz /= KN                                   # loss over kn
            dh = (dz @ p['out.W'].T) * (a > 0)
            g = {'out.W': h.T @ dz, 'out.b': dz.sum(0), 'fc0.W': x.T @ dh, 'fc0.b': dh.sum(0)}
            lr = hand_lr(t)
            for k in p:
                u[k] = 0.9 * u[k] + g[k] + 1e-3 * p[k]
                p[k] -= lr * u[k]
            t += 1
    return p


@pytest.fixture(scope='module')
def reference():
    return numpy_reference()


@pytest.mark.parametrize('workers', [2, 4])
@pytest.mark.parametrize('strategy', ['ar'])
def test_k_ranks_equal_single_process_kn_sgd(mpirun, tmp_path, reference, workers, strategy):
    res = mpirun(workers, 'run_train.py', config(workers, str(tmp_path), exch_strategy=strategy),
                 tmp_path, timeout=400)
    assert res.returncode == 0, res.stderr[-3000:]
    ranks = [dict(np.load(tmp_path / ('rank%d.npz' % r))) for r in range(workers)]
    for r in range(1, workers):                       # identical on every rank
        for k in ranks[0]:
            np.testing.assert_array_equal(ranks[0][k], ranks[r][k])
    for k, ref in reference.items():
        np.testing.assert_allclose(ranks[0][k], ref, rtol=2e-4, atol=2e-5, err_msg=k)
    summary = json.loads((tmp_path / 'summary.json').read_text())
    assert summary['iterations'] == 20 and summary['total_batch'] == KN
