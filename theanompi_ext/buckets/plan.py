"""Bucket planning and the cross-rank check of the plan."""
import hashlib

# Chosen by measurement (docs/overlap.md): the exchange still exposed after
# backprop is at least the transfer of the last bucket, and a ResNet's last
# gradients (stem, first stage) are small; 0.1 MB keeps them in small
# buckets. With 1 MB / 4 MB, ResNet-20 had 2 buckets, the first holding
# 1.0 of its 1.03 MB (nothing could overlap) and wide ResNet-20 exposed
# 207 ms of a 1.38 s exchange at 200 Mbit/s; with 0.02 / 0.1, 0.4 ms. Each
# bucket costs a hand-off to the communication thread (0.1-0.2 ms on shared
# memory): ResNet-20 gets 12 buckets, the wide one 22, ResNet-50 54.
DEFAULT_CAP_MB = 0.1
DEFAULT_FIRST_CAP_MB = 0.02


class Bucket(object):
    """Parameters ``[first, last)`` of the flat layout; entries ``[start, stop)``."""

    def __init__(self, index, first, last, start, stop):
        self.index, self.first, self.last = index, first, last
        self.start, self.stop = start, stop

    @property
    def nbytes(self):
        """Size of the bucket in bytes (float32)."""
        return 4 * (self.stop - self.start)

    def __repr__(self):
        return 'Bucket(%d, params %d..%d, %d bytes)' % (self.index, self.first,
                                                        self.last - 1, self.nbytes)


def flat_order(exchanged, local):
    """Order of parameters in the flat layout: exchanged ones reversed, then local.

    ``exchanged``, ``local``: model indices, as the BN policy splits them
    (:func:`theanompi_ext.update.policy.split_exchanged`). Returns
    (order, n_exchanged) where ``order`` lists model indices.
    """
    return list(reversed(exchanged)) + list(local), len(exchanged)


def exchanged_entries(sizes, n_exchanged):
    """Entries of the flat vector that are exchanged: those of the first
    ``n_exchanged`` parameters (``sizes`` in flat-layout order), which
    :func:`flat_order` puts in front of the local ones."""
    return int(sum(sizes[:n_exchanged]))


def plan_buckets(sizes, n_exchanged, cap_mb=DEFAULT_CAP_MB, first_cap_mb=DEFAULT_FIRST_CAP_MB):
    """Group the first ``n_exchanged`` parameters into buckets.

    Parameters
    ----------
    sizes : list of int
        Entries per parameter, flat-layout order.
    n_exchanged : int
        How many leading parameters are exchanged.
    cap_mb, first_cap_mb : float
        Size caps (MB = 2**20 bytes); the first bucket is small so the
        first transfer starts early (as DDP does). A parameter larger
        than the cap gets a bucket of its own.
    """
    if cap_mb <= 0 or first_cap_mb <= 0:
        raise ValueError('bucket caps must be > 0 MB, got %r and %r' % (cap_mb, first_cap_mb))
    buckets, first, start, nbytes = [], 0, 0, 0
    offset = 0
    for i in range(n_exchanged):
        cap = (first_cap_mb if not buckets else cap_mb) * 2 ** 20
        size_b = 4 * sizes[i]
        if i > first and nbytes + size_b > cap:
            buckets.append(Bucket(len(buckets), first, i, start, offset))
            first, start, nbytes = i, offset, 0
        nbytes += size_b
        offset += sizes[i]
    if n_exchanged > first:
        buckets.append(Bucket(len(buckets), first, n_exchanged, start, offset))
    return buckets


def plan_signature(buckets, layout):
    """A digest of the plan and the layout it slices, compared across ranks."""
    h = hashlib.sha1()
    h.update(repr(layout.signature()).encode())
    h.update(repr([(b.first, b.last, b.start, b.stop) for b in buckets]).encode())
    return h.hexdigest()


def check_plan_across_ranks(comm, buckets, layout, extra=()):
    """Refuse to start unless every rank planned the same buckets.

    ``extra`` are settings that must also agree (e.g. the progress mode);
    on a mismatch every rank raises the same ValueError (no rank is left
    waiting in a collective).
    """
    mine = (plan_signature(buckets, layout), tuple(extra),
            [(b.first, b.last, b.nbytes) for b in buckets])
    all_ = comm.allgather(mine)
    if all(a[0] == all_[0][0] and a[1] == all_[0][1] for a in all_):
        return
    lines = ['bucket plans differ across ranks:']
    for r, (sig, ex, plan) in enumerate(all_):
        lines.append('  rank %d: %d buckets %s settings %s' % (r, len(plan), plan[:4], list(ex)))
    raise ValueError('\n'.join(lines))
