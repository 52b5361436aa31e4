"""Per-epoch shuffling shared by all ranks, split into k equal shards.

Every rank draws the same permutation (seed + epoch), so no indices are
communicated. Iteration ``i`` of an epoch uses examples
``perm[i*kn : (i+1)*kn]``; rank ``r`` takes the ``r``-th block of ``n``.
The concatenation of the k shards in rank order is therefore exactly the
kn-minibatch a single process would use (what the equivalence check
relies on).

Uneven data: an epoch has ``floor(N / kn)`` iterations on *every* rank;
the remaining ``N mod kn`` examples are skipped in that epoch (they are
different examples each epoch because the permutation changes). No rank
ever runs a step the others do not.
"""
import numpy as np

from ..errors import BadInput


def iterations_per_epoch(n_examples, workers, batch_per_worker):
    """floor(N / kn); an error if not even one full kn batch fits."""
    kn = workers * batch_per_worker
    if kn <= 0:
        raise ValueError('workers and batch size must be positive')
    iters = n_examples // kn
    if iters < 1:
        # options that do not fit the data: exit status 2
        raise BadInput('the training set has %d examples, fewer than one minibatch '
                       'of k*n = %d*%d = %d' % (n_examples, workers, batch_per_worker, kn))
    return iters


def epoch_permutation(n_examples, epoch, seed):
    """The permutation every rank uses in ``epoch``."""
    return np.random.RandomState((int(seed) * 1000003 + int(epoch)) % (2 ** 32)).permutation(n_examples)


def shard_indices(perm, iteration, rank, workers, batch_per_worker):
    """Indices of ``rank``'s n examples in ``iteration`` of the epoch."""
    kn = workers * batch_per_worker
    start = iteration * kn + rank * batch_per_worker
    return perm[start:start + batch_per_worker]


def global_indices(perm, iteration, workers, batch_per_worker):
    """All kn indices of ``iteration`` (rank-ordered concatenation of shards)."""
    kn = workers * batch_per_worker
    return perm[iteration * kn:(iteration + 1) * kn]
