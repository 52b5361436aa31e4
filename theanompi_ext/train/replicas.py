"""Replica consistency: are the exchanged parameters the same on every rank?

Under every sync rule the exchanged prefix of the flat parameter vector
(``values[:n_exch]``) must be bitwise identical on all ranks after a step:
they start equal (same seed, checked layout) and receive the same summed
update. A silent corruption (a bad DIMM, a bug that lets one rank skip or
repeat an update) breaks that without any error, and training continues on
diverged replicas. With ``check_replicas_every = N`` every rank, after every
N-th step, hashes its exchanged parameters (crc32 of the bytes plus a float64
sum, 16 bytes per rank through an allgather); a difference stops training on
every rank with a message naming the ranks and the iteration.

The local tail (``values[n_exch:]``: BN gamma/beta under the default policy,
updated from each worker's own gradient) is *expected* to differ. Each check
also measures how far: the largest ``max - min`` over ranks of any tail entry
(one ``max`` allreduce of ``[tail, -tail]``, exact in float32; the difference
in float64), with the parameter it belongs to. Rank 0 logs it per epoch; it goes into the epoch records
(``bn_drift``) and the summary (``replicas``).
"""
import zlib

import numpy as np

from ..errors import ReplicaMismatch


class ReplicaMonitor(object):
    """Checks of one trainer; counts and drift for its records."""

    def __init__(self):
        self.checks = 0
        self.drift_max = None        # largest drift seen in the run
        self.drift_last = None
        self.drift_param = None      # parameter of the largest entry at the last check
        self._epoch_drift = None     # largest drift since the last epoch record

    def check(self, trainer):
        """Compare the exchanged parameters across ranks; measure the tail's drift."""
        values, n_exch = trainer.params.values, trainer.n_exch
        digests = trainer.comm.allgather(digest(values[:n_exch]))
        groups = group_ranks(digests)
        if len(groups) > 1:
            raise ReplicaMismatch(describe_mismatch(groups, digests, trainer.iteration,
                                                    len(digests)))
        self.checks += 1
        drift, where = tail_drift(trainer.comm, values[n_exch:])
        if drift is None:
            return
        name = trainer.layout.names[_param_at(trainer.layout, n_exch + where)]
        self.drift_last, self.drift_param = drift, name
        self.drift_max = drift if self.drift_max is None else max(self.drift_max, drift)
        self._epoch_drift = drift if self._epoch_drift is None else max(self._epoch_drift,
                                                                         drift)

    def epoch_fields(self):
        """Fields for the epoch record (and resets the per-epoch maximum)."""
        out = {'replica_checks': self.checks}
        if self._epoch_drift is not None:
            out['bn_drift'] = float(self._epoch_drift)
        self._epoch_drift = None
        return out

    def summary_fields(self):
        """The ``replicas`` entry of the run summary."""
        return {'replicas': {'checks': self.checks, 'identical': True,
                             'bn_drift_max': self.drift_max, 'bn_drift_last': self.drift_last,
                             'bn_drift_param': self.drift_param}}


def digest(values):
    """(crc32 of the bytes, float64 sum) of a float32 vector."""
    v = np.ascontiguousarray(values)
    return (zlib.crc32(memoryview(v).cast('B')), float(np.sum(v, dtype=np.float64)))


def group_ranks(digests):
    """Ranks grouped by equal digest, largest group first (ties: lowest rank first)."""
    groups = {}
    for r, d in enumerate(digests):
        groups.setdefault(tuple(d), []).append(r)
    return sorted(groups.values(), key=lambda g: (-len(g), g[0]))


def describe_mismatch(groups, digests, iteration, size):
    """The message of a :class:`ReplicaMismatch`."""
    def ranks(g):
        return ('rank ' if len(g) == 1 else 'ranks ') + ','.join(str(r) for r in g)
    parts = ['%s (crc32 %08x, sum %.17g)' % (ranks(g), digests[g[0]][0], digests[g[0]][1])
             for g in groups]
    if len(groups[0]) > len(groups[1]):
        odd = [r for g in groups[1:] for r in g]
        verdict = '%s %s from the majority' % (ranks(odd), 'differs' if len(odd) == 1
                                                else 'differ')
    else:
        verdict = 'no majority'
    return ('exchanged parameters differ across ranks after iteration %d: %s; %s (all %d '
            'ranks must hold identical copies; training stopped)'
            % (iteration, ' vs '.join(parts), verdict, size))


def tail_drift(comm, tail):
    """(largest max-min over ranks of any entry of ``tail``, its index), or (None, None)."""
    m = tail.size
    if m == 0:
        return None, None
    if comm.size == 1:
        return 0.0, 0
    # float32 like the parameters: their max and -min are exact in it
    buf = np.empty(2 * m, np.float32)
    buf[:m] = tail
    buf[m:] = -buf[:m]
    comm.allreduce(buf, op='max', label='replica check: BN tail drift')
    spread = buf[:m].astype(np.float64) + buf[m:]          # max - min, in float64
    where = int(np.argmax(spread))
    return float(spread[where]), where


def _param_at(layout, offset):
    """Index of the parameter holding flat entry ``offset``."""
    return int(np.searchsorted(np.asarray(layout.offsets[:len(layout.names)]), offset,
                               side='right')) - 1


def monitor(trainer):
    """The trainer's monitor (created on first use)."""
    mon = getattr(trainer, '_replica_monitor', None)
    if mon is None:
        mon = trainer._replica_monitor = ReplicaMonitor()
    return mon


def enabled(trainer):
    """True when ``check_replicas_every`` is set."""
    return bool(getattr(trainer.cfg, 'check_replicas_every', 0))


def after_step(trainer):
    """Hook after every step: a check every ``check_replicas_every`` iterations."""
    every = getattr(trainer.cfg, 'check_replicas_every', 0)
    if every and trainer.iteration % every == 0:
        monitor(trainer).check(trainer)


def epoch_fields(trainer):
    """Fields for the epoch record; rank 0 logs the drift ({} when checks are off)."""
    if not enabled(trainer):
        return {}
    mon = monitor(trainer)
    out = mon.epoch_fields()
    if 'bn_drift' in out:
        trainer.log('replicas: exchanged parameters identical on all %d ranks (%d checks); '
                    'local BN gamma/beta drift: max |difference| across ranks %.3g (%s)'
                    % (trainer.comm.size, mon.checks, out['bn_drift'], mon.drift_param))
    elif mon.checks:
        trainer.log('replicas: exchanged parameters identical on all %d ranks (%d checks)'
                    % (trainer.comm.size, mon.checks))
    return out


def summary_fields(trainer):
    """``{'replicas': {...}}`` for the run summary ({} when checks are off)."""
    return monitor(trainer).summary_fields() if enabled(trainer) else {}
