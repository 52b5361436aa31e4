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


def _non_negative(value, what):
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError('%s must be a finite number >= 0, got %r' % (what, value))
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
    _non_negative(cpu_seconds, 'CPU time (s)')
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


# -- a host's cores and the exchange's per-byte work (two levels) ----------------------

def machine_cores():
    """Cores of the machine this runs on (``os.cpu_count()``; 1 if unknown)."""
    import os
    return os.cpu_count() or 1


def emulated_cores_per_host(hosts, cores=None):
    """Cores each of ``hosts`` emulated hosts gets when they all run on one machine of
    ``cores`` (default :func:`machine_cores`): processor sharing, ``cores / hosts``
    (a fraction where hosts outnumber cores)."""
    _positive(hosts, 'hosts')
    return _positive(machine_cores() if cores is None else cores, 'cores') / hosts


def serialised(per_rank_s, ranks, cores):
    """Wall seconds for ``ranks`` ranks of a host each doing ``per_rank_s`` of CPU work
    at once on the host's ``cores``: the work of all of them, ``ranks * per_rank_s``,
    spread over ``min(ranks, cores)`` cores (one rank uses one core at most)."""
    _non_negative(per_rank_s, 'CPU time (s)')
    ranks, cores = _positive(ranks, 'ranks'), _positive(cores, 'cores')
    return ranks * per_rank_s / min(ranks, cores)


class HostCPU:
    """A host's compute for the exchange: ``cores`` (default :func:`machine_cores`) and
    the per-byte CPU seconds of a float32 sum into a buffer (``sum_s_per_byte``: bytes
    of one operand), of a memcpy (``copy_s_per_byte``) and of TCP moving a byte between
    hosts, sender's and receiver's kernel work together (``tcp_s_per_byte``)."""

    def __init__(self, cores=None, sum_s_per_byte=0.0, copy_s_per_byte=0.0,
                 tcp_s_per_byte=0.0):
        self.cores = _positive(machine_cores() if cores is None else cores, 'cores per host')
        self.sum_s_per_byte = _non_negative(sum_s_per_byte, 'sum seconds per byte')
        self.copy_s_per_byte = _non_negative(copy_s_per_byte, 'copy seconds per byte')
        self.tcp_s_per_byte = _non_negative(tcp_s_per_byte, 'tcp seconds per byte')

    def __repr__(self):
        return 'HostCPU(cores=%g, sum=%.3g, copy=%.3g, tcp=%.3g s/B)' % (
            self.cores, self.sum_s_per_byte, self.copy_s_per_byte, self.tcp_s_per_byte)

    def host_reduce(self, nbytes, g):
        """Reduce-scatter within the host: each of ``g`` ranks sums ``(g-1)/g N`` bytes."""
        return serialised((g - 1.0) / g * nbytes * self.sum_s_per_byte, g, self.cores)

    def host_copy(self, nbytes, g):
        """Allgather within the host: each of ``g`` ranks copies in ``(g-1)/g N`` bytes."""
        return serialised((g - 1.0) / g * nbytes * self.copy_s_per_byte, g, self.cores)

    def cross_reduce(self, nbytes, hosts, g):
        """The sums of the allreduce between hosts: each of ``g`` ranks sums ``(H-1)/H``
        of its ``N/g`` shard, each step's sum before the next step can send (the link
        waits for them)."""
        return serialised((hosts - 1.0) / hosts * nbytes / g * self.sum_s_per_byte, g,
                          self.cores)

    def cross_tcp(self, nbytes, hosts, g):
        """TCP's work for the allreduce between hosts: each of ``g`` ranks sends and
        receives ``2 (H-1)/H`` of its ``N/g`` shard (rhd). Runs while bytes are on the
        link: it costs time only where it is slower than the link."""
        return serialised(2.0 * (hosts - 1.0) / hosts * nbytes / g * self.tcp_s_per_byte,
                          g, self.cores)
