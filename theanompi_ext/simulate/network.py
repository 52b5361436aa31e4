"""Allreduce cost models (alpha-beta): how long one allreduce of N bytes takes.

Every model is ``latency_terms * alpha + byte_terms * N / bandwidth``, so an
allreduce's cost is linear in its size. Bandwidths are in bytes per second,
latencies in seconds; the CLI converts from Gbit/s and microseconds.

Formulas, for ``p`` ranks and ``N`` bytes (Thakur, Rabenseifner & Gropp
2005; Patarasuk & Yuan 2009):

``ring``
    reduce-scatter then allgather around a ring, ``2(p-1)`` steps of ``N/p``
    bytes: ``2(p-1) alpha + 2(p-1)/p N/bw``.
``rhd`` (recursive halving / doubling)
    for ``p`` a power of two: ``2 log2(p) alpha + 2(p-1)/p N/bw``. Otherwise
    binary blocks (Rabenseifner & Traeff 2004; what Goyal et al. use): ``p``
    is split into power-of-two blocks ``p = B0 + b1 + b2 + ...`` (its binary
    digits, ``B0`` the largest); each block halves within itself, every
    smaller block ``b`` hands its ``N/b``-byte segments to the next larger
    block and gets the result back. Cost: ``2 log2(B0) alpha + 2(B0-1)/B0
    N/bw + sum over smaller blocks b of 2 (alpha + N/(b bw))``. For ``p = 3``
    this is the familiar fold-in ``2 alpha + N/bw + 2 (alpha + N/bw)``. The
    small blocks' own halving runs while the big one's does, so it is not
    counted; their hand-offs are counted one after another (conservative).
``asa`` (alltoall, sum, allgather: Theano-MPI's ``asa16``, this project's
    16-bit MPI method) an alltoall whose ``p-1`` transfers of ``N/p`` bytes
    are in flight together (one latency), then an allgather by recursive
    doubling (``ceil(log2 p)`` latencies, MPICH's algorithm for short
    messages): ``(1 + ceil(log2 p)) alpha + 2(p-1)/p N/bw``.
``hierarchical`` (NCCL-style, Goyal et al. 2017 section 4)
    ``G`` GPUs per server, ``k/G`` servers: an intra-node reduce to a leader,
    an inter-node allreduce among the leaders, and an
    intra-node broadcast. The leaders always use ``rhd`` (binary blocks when
    the number of servers is not a power of two), as the paper does. Reduce
    and broadcast are pipelined chains (NCCL's ring reduce/broadcast):
    ``(G-1) alpha_intra + N/bw_intra`` each.
``two-level`` (collective/two_level.py's ``rsag``; ``G`` ranks per host)
    a reduce-scatter within the host, ``(G-1) alpha_i + (G-1)/G N/bw_i``;
    ``G`` allreduces of ``N/G`` bytes at once between the hosts, one per
    local rank, sharing the host's link (each gets ``bw/G``), ``rhd``
    among the ``k/G`` hosts: ``2 log2(H) alpha + 2(H-1)/H N/bw``; an
    allgather within the host, as the reduce-scatter. Cut into ``pieces``
    whose phases overlap, the link's phase runs while the host's run, and
    only one piece's reduce-scatter and allgather stay outside it:
    ``2 intra(N/pieces) + max(inter(N), 2 intra(N))``. With a host's CPU
    (``Network.cpu``, simulate/host.py's ``HostCPU``): the ranks' sums, copies
    and TCP work serialised over ``min(G, cores)`` cores of the host, where
    ranks outnumber cores (see ``two_level_allreduce``).

The flat algorithms (``ring``, ``rhd``) use the intra-node link while all
``k`` ranks fit in one server and the inter-node link otherwise: every step
is charged at the slowest link it crosses. For a ring with ranks numbered
server by server that is exact (one ring edge per direction leaves each
server). For ``rhd`` it ignores that the ``G`` ranks of a server share its
NIC in the cross-server steps; with the in-server steps done first those
steps move about as many bytes per NIC as ``hierarchical``'s inter phase,
so flat ``rhd`` on multi-GPU servers is an estimate, not a bound.
"""
import math
from dataclasses import dataclass

ALGORITHMS = ('ring', 'rhd', 'asa', 'hierarchical', 'two-level')


def _check_ranks(p):
    if int(p) != p or p < 1:
        raise ValueError('number of ranks must be a positive integer, got %r' % (p,))
    return int(p)


def _check_link(alpha, bw):
    if not (alpha >= 0 and math.isfinite(alpha)):
        raise ValueError('latency must be >= 0 and finite, got %r s' % (alpha,))
    if not (bw > 0 and math.isfinite(bw)):
        raise ValueError('bandwidth must be > 0 and finite, got %r bytes/s' % (bw,))


def ring_allreduce(nbytes, p, alpha, bw):
    """Seconds for a ring allreduce of ``nbytes`` over ``p`` ranks."""
    p = _check_ranks(p)
    _check_link(alpha, bw)
    if p == 1:
        return 0.0
    return 2 * (p - 1) * alpha + 2.0 * (p - 1) / p * nbytes / bw


def rhd_allreduce(nbytes, p, alpha, bw):
    """Seconds for a recursive halving/doubling allreduce over ``p`` ranks.

    Non-powers of two use binary blocks (see the module doc).
    """
    p = _check_ranks(p)
    _check_link(alpha, bw)
    if p == 1:
        return 0.0
    blocks = [1 << i for i in range(p.bit_length()) if p >> i & 1]
    big = blocks.pop()                      # largest power of two <= p
    t = 2 * math.log2(big) * alpha + 2.0 * (big - 1) / big * nbytes / bw
    for b in blocks:
        # A block of b ranks holds segments of N/b after its own halving,
        # hands them to the next larger block and gets the result back.
        t += 2 * (alpha + nbytes / b / bw)
    return t


def asa_allreduce(nbytes, p, alpha, bw):
    """Seconds for an alltoall + local sum + allgather of ``nbytes`` over ``p`` ranks."""
    p = _check_ranks(p)
    _check_link(alpha, bw)
    if p == 1:
        return 0.0
    return (1 + math.ceil(math.log2(p))) * alpha + 2.0 * (p - 1) / p * nbytes / bw


def chain_reduce(nbytes, p, alpha, bw):
    """Seconds for a pipelined chain reduce (or broadcast) over ``p`` ranks."""
    p = _check_ranks(p)
    _check_link(alpha, bw)
    if p == 1:
        return 0.0
    return (p - 1) * alpha + nbytes / bw


def host_scatter(nbytes, g, alpha, bw):
    """Seconds for a reduce-scatter (or allgather) of ``nbytes`` among ``g`` ranks of a host."""
    g = _check_ranks(g)
    _check_link(alpha, bw)
    return (g - 1) * alpha + (g - 1.0) / g * nbytes / bw


def two_level_allreduce(nbytes, hosts, g, alpha, bw, intra_alpha, intra_bw, pieces=1,
                        cpu=None):
    """Seconds for the two-level ``rsag`` allreduce of ``nbytes``: ``hosts`` hosts of
    ``g`` ranks, inter-host link ``(alpha, bw)`` per host, the host's own
    ``(intra_alpha, intra_bw)``; ``pieces`` > 1 overlaps the phases (module doc).

    ``cpu`` (a :class:`~theanompi_ext.simulate.host.HostCPU`): the host's cores and
    per-byte costs. Then each phase within the host takes the longer of its link
    term and its CPU work (sums, copies) serialised over ``min(g, cores)`` cores,
    the phase between hosts the longer of the link and TCP's work, plus the sums
    between its steps (the link waits for them). In pieces the host's CPU work
    overlaps the link, but all of it shares the cores: ``rs(N/p) + ag(N/p) +
    max(link(N) + sums(N/p), rs(N) + ag(N) + sums(N) + tcp(N))``."""
    hosts, pieces = _check_ranks(hosts), _check_ranks(pieces)
    g = _check_ranks(g)

    def rs(n):                  # reduce-scatter within the host
        t = host_scatter(n, g, intra_alpha, intra_bw)
        return max(t, cpu.host_reduce(n, g)) if cpu else t

    def ag(n):                  # allgather within the host
        t = host_scatter(n, g, intra_alpha, intra_bw)
        return max(t, cpu.host_copy(n, g)) if cpu else t

    def sums(n):                # the sums between the steps across hosts
        return cpu.cross_reduce(n, hosts, g) if cpu and hosts > 1 else 0.0

    # the g shard allreduces share the host's link: N/g bytes each at bw/g
    inter = rhd_allreduce(float(nbytes) / g, hosts, alpha, float(bw) / g)
    tcp = cpu.cross_tcp(nbytes, hosts, g) if cpu and hosts > 1 else 0.0
    if pieces == 1:
        return rs(nbytes) + max(inter, tcp) + sums(nbytes) + ag(nbytes)
    n = float(nbytes) / pieces
    return rs(n) + ag(n) + max(inter + sums(n),
                               rs(nbytes) + ag(nbytes) + sums(nbytes) + tcp)


def tcp_payload_share(mtu=1500):
    """The share of a shaped Ethernet link's rate that carries TCP payload: a
    segment of ``mtu - 52`` bytes (IP, TCP with timestamps) in a frame of
    ``mtu + 14`` (1448 of 1514 at 1500: 0.956)."""
    if mtu < 100:
        raise ValueError('mtu must be >= 100 bytes, got %r' % (mtu,))
    return (mtu - 52.0) / (mtu + 14.0)


#: Linux's least TCP retransmission timeout (TCP_RTO_MIN, /proc/net/snmp's
#: RtoMin): on a link whose round trip is far below it, what one timeout costs.
TCP_RTO_MIN = 0.2


def with_timeouts(seconds, timeouts, rto=TCP_RTO_MIN):
    """An allreduce of ``seconds`` on a lossless link, plus ``timeouts`` TCP
    retransmission timeouts on its critical path: the flow waits ``rto`` for
    each (Linux's least RTO where the round trip is short) while the link
    idles for it (the other flows of the collective wait on that one)."""
    if timeouts < 0 or rto < 0:
        raise ValueError('timeouts and rto must be >= 0, got %r, %r' % (timeouts, rto))
    return seconds + timeouts * rto


@dataclass(frozen=True)
class Network:
    """A cluster's interconnect and the allreduce algorithm run on it.

    ``alpha``/``bandwidth`` describe the inter-node link (seconds, bytes/s),
    ``intra_alpha``/``intra_bandwidth`` the link between GPUs of one server.
    """
    algorithm: str = 'hierarchical'
    alpha: float = 10e-6
    bandwidth: float = 50e9 / 8
    intra_alpha: float = 5e-6
    intra_bandwidth: float = 160e9 / 8
    gpus_per_node: int = 8
    pieces: int = 1          # two-level: parts whose phases overlap
    cpu: object = None       # two-level: a simulate.host.HostCPU (cores, per-byte costs)

    def __post_init__(self):
        if self.algorithm not in ALGORITHMS:
            raise ValueError('unknown allreduce algorithm %r (choose from %s)'
                             % (self.algorithm, ', '.join(ALGORITHMS)))
        if not (self.bandwidth > 0 and math.isfinite(self.bandwidth)):
            raise ValueError('inter-node bandwidth must be > 0, got %r Gbit/s'
                             % (self.bandwidth * 8 / 1e9,))
        if not (self.intra_bandwidth > 0 and math.isfinite(self.intra_bandwidth)):
            raise ValueError('intra-node bandwidth must be > 0, got %r Gbit/s'
                             % (self.intra_bandwidth * 8 / 1e9,))
        if not (self.alpha >= 0 and math.isfinite(self.alpha)):
            raise ValueError('inter-node latency must be >= 0, got %r us'
                             % (self.alpha * 1e6,))
        if not (self.intra_alpha >= 0 and math.isfinite(self.intra_alpha)):
            raise ValueError('intra-node latency must be >= 0, got %r us'
                             % (self.intra_alpha * 1e6,))
        if int(self.gpus_per_node) != self.gpus_per_node or self.gpus_per_node < 1:
            raise ValueError('gpus per node must be a positive integer, got %r'
                             % (self.gpus_per_node,))

    @classmethod
    def from_units(cls, algorithm='hierarchical', bandwidth_gbit=50.0,
                   latency_us=10.0, intra_bandwidth_gbit=160.0,
                   intra_latency_us=5.0, gpus_per_node=8):
        """Build from Gbit/s and microseconds, the CLI's units."""
        return cls(algorithm=algorithm,
                   alpha=latency_us * 1e-6,
                   bandwidth=bandwidth_gbit * 1e9 / 8,
                   intra_alpha=intra_latency_us * 1e-6,
                   intra_bandwidth=intra_bandwidth_gbit * 1e9 / 8,
                   gpus_per_node=gpus_per_node)

    def check_workers(self, k):
        """Raise ValueError if ``k`` workers cannot run on this network."""
        k = _check_ranks(k)
        if (self.algorithm in ('hierarchical', 'two-level') and k > 1
                and k % self.gpus_per_node != 0):
            raise ValueError(
                '%s allreduce needs whole servers: k=%d GPUs is not a '
                'multiple of gpus-per-node=%d' % (self.algorithm, k, self.gpus_per_node))
        return k

    def allreduce(self, nbytes, k):
        """Seconds for one allreduce of ``nbytes`` among ``k`` workers."""
        if nbytes < 0:
            raise ValueError('message size must be >= 0 bytes, got %r' % (nbytes,))
        k = self.check_workers(k)
        if k == 1:
            return 0.0                       # nothing to exchange
        if self.algorithm == 'two-level':
            g = min(self.gpus_per_node, k)
            return two_level_allreduce(nbytes, k // g, g, self.alpha, self.bandwidth,
                                       self.intra_alpha, self.intra_bandwidth, self.pieces,
                                       self.cpu)
        if self.algorithm == 'hierarchical':
            g = min(self.gpus_per_node, k)
            nodes = k // g
            return (chain_reduce(nbytes, g, self.intra_alpha, self.intra_bandwidth)
                    + rhd_allreduce(nbytes, nodes, self.alpha, self.bandwidth)
                    + chain_reduce(nbytes, g, self.intra_alpha, self.intra_bandwidth))
        if k <= self.gpus_per_node:
            alpha, bw = self.intra_alpha, self.intra_bandwidth
        else:
            alpha, bw = self.alpha, self.bandwidth
        algo = {'ring': ring_allreduce, 'rhd': rhd_allreduce, 'asa': asa_allreduce}[self.algorithm]
        return algo(nbytes, k, alpha, bw)

    def latency_steps(self, k):
        """How many latency terms one allreduce among ``k`` workers pays (its alpha count)."""
        unit = Network(self.algorithm, 1.0, self.bandwidth, 1.0, self.intra_bandwidth,
                       self.gpus_per_node, self.pieces)
        return unit.allreduce(0, k)

    def barrier(self, k):
        """Seconds for a barrier: an allreduce of zero bytes (latency only)."""
        return self.allreduce(0, k)
