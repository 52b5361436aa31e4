"""The update half of the independent float64 references, written from the paper.

The numpy references of tests/test_kn_equivalence.py, test_dropin.py and
test_dropin_subbatch.py compute their own gradients; the learning rate and
the momentum step they apply come from here, written from Goyal et al. 2017
(Sec. 2.1-2.2; docs/design.md), never from the package's
``Schedule`` or rules, so a wrong schedule cannot agree with itself.
"""


def goyal_lr(t, base_lr, kn, ref_batch, warmup_iters, decay_iters=()):
    """Learning rate of iteration ``t`` (0-based).

    Linear scaling rule: the target is ``base_lr * kn / ref_batch``. Gradual
    warm-up: start at ``base_lr`` and add the same amount every iteration,
    reaching the target at iteration ``warmup_iters``. Then /10 from each
    iteration in ``decay_iters`` on.
    """
    target = base_lr * kn / float(ref_batch)
    if t < warmup_iters:
        return base_lr + (target - base_lr) * t / float(warmup_iters)
    return target * 0.1 ** sum(1 for d in decay_iters if t >= d)


def momentum_step(params, vels, grads, lr, momentum, weight_decay):
    """Eq. (9) in place, decay on every parameter: ``u <- m u + g + wd w; w <- w - lr u``."""
    for w, u, g in zip(params, vels, grads):
        u *= momentum
        u += g + weight_decay * w
        w -= lr * u
