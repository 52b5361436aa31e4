"""Which parameters are exchanged, decayed, and how local gradients scale.

The default batch-norm policy (the user's design card): BN statistics stay
per worker (they are not trainable, so never in the flat vector), and BN
gamma/beta are updated from the local gradient and never exchanged.
``exchange_bn=True`` puts gamma/beta into the allreduce, as the paper does.

Scale: each worker's loss is divided by kn, so a summed gradient is the
kn-mean. A gradient that is *not* summed is k times too small; a locally
updated gamma/beta steps with its own worker's mean gradient (loss over
n), so it is multiplied by k (:func:`local_gradient_scale`).
"""
import numpy as np

BN_POLICIES = ('local', 'exchange')


def split_exchanged(tags, exchange_bn=False):
    """Indices (exchanged, local) for parameters with the given tag sets."""
    exchanged, local = [], []
    for i, t in enumerate(tags):
        (local if ('bn_affine' in t and not exchange_bn) else exchanged).append(i)
    return exchanged, local


def decay_vector(layout, tags, weight_decay):
    """Per-entry weight decay: lambda everywhere except BN gamma/beta (0)."""
    if weight_decay < 0:
        raise ValueError('weight_decay must be >= 0, got %r' % (weight_decay,))
    return layout.mask([i for i, t in enumerate(tags) if 'bn_affine' not in t]) \
        * np.float32(weight_decay)


def local_gradient_scale(workers):
    """Factor turning a kn-normalised local gradient into the worker's n-mean."""
    return float(workers)


def scale_local_tail(grads, n_exchanged, scale):
    """Multiply the local (not exchanged) tail ``grads[n_exchanged:]`` by ``scale``, in place.

    The flat layout puts exchanged entries first; what follows is updated
    from this worker's own gradient, which the kn-normalised loss made
    ``scale`` (= k, see :func:`local_gradient_scale`) times too small.
    Returns ``grads``.
    """
    scale = np.float32(scale)
    if scale != 1 and n_exchanged < grads.size:
        grads[n_exchanged:] *= scale
    return grads


def local_scale_vector(size, n_exchanged, scale):
    """The per-entry form of :func:`scale_local_tail`: 1 on the exchanged
    prefix, ``scale`` on the local tail (the device update multiplies by it)."""
    if not 0 <= n_exchanged <= size:
        raise ValueError('%d exchanged entries of %d' % (n_exchanged, size))
    vec = np.ones(size, np.float32)
    vec[n_exchanged:] = np.float32(scale)
    return vec
