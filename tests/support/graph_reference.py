"""kn-sum SGD of a Theano-MPI model's own graph, k virtual ranks in one process.

The independent reference for unmodified models (tests/dropin/tmzoo/unmodified.py),
written from docs/migrating-from-theano-mpi.md and the paper, not from the
package: the model is built once per rank (config rank r, size k); each step
every rank's gradient of the model's own cost on its own sub-batch comes
from ONE monolithic ``theano.function([subb_ind], model.grads, givens=...)``,
fed as Theano-MPI's ``pre_model_iter_fn`` feeds the model's train function.
That call also applies the model's ``default_update``\\ s (batch-norm running
statistics) exactly once per step per rank: the single-step reference of
the running statistics. The update is float64:

* exchanged parameters: the mean of the k gradients (the kn-mean), eq. (9)
  momentum with weight decay (:mod:`support.sgd_reference`), one copy
  shared by every rank;
* BN gamma/beta (named ``'gamma'``/``'beta'``: the documented fallback;
  ``exchange_bn`` off): each rank's own n-mean gradient, its own momentum,
  no weight decay;
* the rate: :func:`support.sgd_reference.goyal_lr` (linear scaling to
  ``base_lr * kn / n``, gradual warm-up over ``min(5, epochs / 2)`` epochs).

The float64 values are copied back into every rank's shared variables
before each step.
"""
import numpy as np

from support.sgd_reference import goyal_lr, momentum_step

BN_AFFINE = ('gamma', 'beta')


def _grad_function(model):
    from theanompi_ext.engine.core import theano
    givens = [(model.x, model.shared_x_slice), (model.y, model.shared_y_slice),
              (model.lr, model.shared_lr)]
    return theano.function([model.subb_ind], model.grads, givens=givens,
                           on_unused_input='ignore', name='reference_grads')


def reference_run(model_class, k):
    """Train ``model_class`` for its ``n_epochs`` on ``k`` virtual ranks.

    Returns ``[{'params': [float64 arrays, model.params order], 'bn_stats':
    [arrays]} for each rank]`` and the number of iterations.
    """
    models = [model_class({'verbose': False, 'rank': r, 'size': k}) for r in range(k)]
    fns = [_grad_function(m) for m in models]
    first = models[0]
    local = [i for i, p in enumerate(first.params) if p.name in BN_AFFINE]
    exch = [i for i in range(len(first.params)) if i not in local]
    start = [[np.asarray(p.get_value(), np.float64) for p in m.params] for m in models]
    for r in range(1, k):
        assert all(np.array_equal(a, b) for a, b in zip(start[0], start[r])), \
            'rank %d starts from other weights than rank 0' % r
    shared = [start[0][i] for i in exch]
    shared_vel = [np.zeros_like(w) for w in shared]
    own = [[start[r][i] for i in local] for r in range(k)]
    own_vel = [[np.zeros_like(w) for w in own[r]] for r in range(k)]
    n, n_subb = first.batch_size, first.n_subb
    per_epoch = first.data.n_batch_train * n_subb
    warmup_iters = int(round(min(5.0, first.n_epochs / 2.0) * per_epoch))
    it = 0

    def load_weights():
        for r, m in enumerate(models):
            for j, i in enumerate(exch):
                m.params[i].set_value(shared[j].astype(np.float32))
            for j, i in enumerate(local):
                m.params[i].set_value(own[r][j].astype(np.float32))

    for _ in range(first.n_epochs):
        for i in range(first.data.n_batch_train):
            for m in models:
                m._load(m.data.train_img, m.data.train_labels, i)
            for s in range(n_subb):
                lr = goyal_lr(it, float(first.base_lr), k * n, n, warmup_iters)
                load_weights()
                grads = [[np.asarray(g, np.float64) for g in fn(s)] for fn in fns]
                mean = [sum(grads[r][i] for r in range(k)) / k for i in exch]
                momentum_step(shared, shared_vel, mean, lr, first.mu, first.eta)
                for r in range(k):
                    momentum_step(own[r], own_vel[r], [grads[r][i] for i in local], lr,
                                  first.mu, 0.0)
                it += 1
    load_weights()
    out = []
    for r, m in enumerate(models):
        params = [None] * len(m.params)
        for j, i in enumerate(exch):
            params[i] = shared[j]
        for j, i in enumerate(local):
            params[i] = own[r][j]
        out.append({'params': params,
                    'bn_stats': [np.asarray(v.get_value(), np.float64) for v in m.bn_stats()]})
    return out, it
