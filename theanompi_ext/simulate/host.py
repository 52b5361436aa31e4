"""CPU contention: the exchange's CPU work when ranks share too few cores.

On a cluster each rank has its own cores and a NIC that moves bytes
without them; the network model (:mod:`.network`) is all there is. When
ranks (and whatever else runs) outnumber the cores, the exchange's own CPU
work — the MPI progress of every step of an allreduce, the TCP stack on a
loopback, the 16-bit wire casts — runs at the share of a core a rank gets,
and takes ``cpu_seconds / share`` of wall time.

Processor sharing: ``n`` runnable threads on ``c`` cores each get
``min(1, c / n)`` of a core. ``k`` ranks, each one thread, next to
``outside`` other runnable threads (the load of other jobs)::

    share = min(1, cores / (ranks + outside))

On a machine whose load is not known, the share is measured instead: a
rank's CPU time per wall second while it computes (``time.process_time``
over ``time.perf_counter``; ``bench overlap`` records it as
``cpu_per_wall_compute``).
"""
import math


def _positive(value, what):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            value > 0 and math.isfinite(value)):
        raise ValueError('%s must be a finite number > 0, got %r' % (what, value))
    return float(value)


def cpu_share(ranks, cores, outside=0.0):
    """Share of a core each of ``ranks`` busy ranks gets on ``cores`` cores.

    ``outside``: runnable threads of other jobs (e.g. the load average
    minus the ranks). 1.0 while everything fits.
    """
    _positive(ranks, 'ranks')
    _positive(cores, 'cores')
    if not (outside >= 0 and math.isfinite(outside)):
        raise ValueError('outside load must be a finite number >= 0, got %r' % (outside,))
    return min(1.0, float(cores) / (ranks + outside))


def contended(cpu_seconds, share):
    """Wall seconds of ``cpu_seconds`` of work run at ``share`` of a core."""
    if not (cpu_seconds >= 0 and math.isfinite(cpu_seconds)):
        raise ValueError('CPU time must be a finite number >= 0 s, got %r' % (cpu_seconds,))
    share = _positive(share, 'CPU share')
    if share > 1:
        raise ValueError('CPU share must be <= 1 (one thread uses one core), got %r' % (share,))
    return cpu_seconds / share


def step_cpu_seconds(wall_s, share, steps, other_s=0.0):
    """CPU seconds per allreduce step from one measured exchange (the calibration).

    ``wall_s``: the measured time of ``steps`` allreduce steps at CPU
    ``share``, of which ``other_s`` (e.g. bytes through the link) is not
    CPU work. The inverse of ``other_s + steps * contended(result, share)``;
    never below 0.
    """
    share = _positive(share, 'CPU share')
    _positive(steps, 'steps')
    return max(0.0, wall_s - other_s) * min(share, 1.0) / steps
