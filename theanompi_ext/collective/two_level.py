"""The two-level allreduce: within each host over shared memory, across hosts once.

Between hosts the link is the slow part; a flat allreduce whose ranks are
placed host by host may already cross each link with the buffer once
(MPICH's recursive halving does), but it cannot say so, and a ring over
hosts does not. The two-level sum crosses it once by construction, in
three phases on sub-communicators of the caller's communicator:

``rsag`` (default where every host has the same number of ranks R)
    ``Reduce_scatter`` within the host: local rank j holds shard j (1/R of
    the buffer) summed over its host; ``Allreduce`` of shard j between the
    hosts, among the ranks of local rank j (R such allreduces run at once,
    each 1/R of the bytes, together the buffer once per link);
    ``Allgatherv`` within the host. A buffer is cut into pieces of
    :data:`PIECE_BYTES` (at most :data:`MAX_PIECES`) whose phases are
    nonblocking calls issued in one order on every rank: a piece is
    gathered within the host while later ones still cross (measured 2-6%
    faster at 4-16 MB across a 200 Mbit/s link, docs/exchange-across-hosts.md).
``leader`` (any placement)
    ``Reduce`` to local rank 0, ``Allreduce`` among the hosts' local ranks 0,
    ``Bcast`` within the host.

A 16-bit wire (collective/wire.py) is used between hosts only, where it
halves the bytes that matter; within a host the sums stay float32. Every
rank ends with the same values: the between-hosts sum of a shard is the
same on its ranks and is then copied, never re-summed.

Which ranks share a host: ``Split_type(COMM_TYPE_SHARED)``. For tests on
one machine, ``THEANOMPI_EXT_FAKE_RANKS_PER_HOST=N`` (every rank must see
the same value) makes ranks 0..N-1 one host, N..2N-1 the next, and so on.
"""
import os

import numpy as np

from ..errors import WireOverflow
from .wire import chunk_counts, decode, encode, sum_encoded
from .world import import_mpi

TOPOLOGIES = ('flat', 'two-level', 'auto')
ALGORITHMS = ('rsag', 'leader')
#: rsag cuts a buffer into parts of about this many bytes, whose phases
#: overlap (0: one part; 256 KB and 4 MB parts were no faster, measured).
PIECE_BYTES = 1 << 20
MAX_PIECES = 16
FAKE_HOSTS_VAR = 'THEANOMPI_EXT_FAKE_RANKS_PER_HOST'


def check_topology(topology):
    """``topology`` if it is one of :data:`TOPOLOGIES`, else ValueError naming them."""
    if topology not in TOPOLOGIES:
        raise ValueError('unknown topology %r; choose from %s' % (topology, ', '.join(TOPOLOGIES)))
    return topology


def host_comm(comm, environ=None):
    """The ranks of ``comm`` on this rank's host (collective; free it after use)."""
    MPI = import_mpi()
    env = os.environ if environ is None else environ
    fake = env.get(FAKE_HOSTS_VAR, '')
    if fake:
        if not fake.isdigit() or int(fake) < 1:
            raise ValueError('%s must be a whole number >= 1, got %r' % (FAKE_HOSTS_VAR, fake))
        return comm.Split(comm.Get_rank() // int(fake), key=comm.Get_rank())
    return comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())


def host_layout(comm, environ=None):
    """``(hosts, ranks on each host)`` of ``comm``, the latter a tuple in host order
    (collective)."""
    local = host_comm(comm, environ)
    try:
        first = comm.allgather(local.Get_rank() == 0)
        sizes = comm.allgather(local.Get_size())
    finally:
        local.Free()
    per_host = tuple(s for s, lead in zip(sizes, first) if lead)
    return len(per_host), per_host


def two_level_pays(per_host):
    """True where two levels can help: more than one host, and a host with
    more than one rank (what ``topology='auto'`` chooses by)."""
    return len(per_host) > 1 and max(per_host) > 1


def _displs(counts):
    return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int).tolist()


def _split(buf, pieces):
    """``buf`` cut into ``pieces`` consecutive views (sizes differ by at most one)."""
    out, off = [], 0
    for n in chunk_counts(buf.size, pieces):
        out.append(buf[off:off + n])
        off += n
    return out


class _Part(object):
    """One piece of a bucket on its way through the rsag stages: its view, this
    rank's shard of it (summed within the host, then between hosts), the
    16-bit copies when a wire is used."""

    def __init__(self, buf, ranks, local_rank):
        self.buf = buf
        self.counts = chunk_counts(buf.size, ranks)
        self.displs = _displs(self.counts)
        self.shard = np.empty(self.counts[local_rank], np.float32)
        self.w = self.recv = self.sum16 = self.wcounts = None
        self.wire = None


def _run_stages(parts, stages):
    """Run each stage on each part, in stage-major order: stage s of part i is
    issued once stage s-1 of part i is done, after stage s of part i-1 was
    issued. Every rank issues in this same order, which keeps the collectives
    of each communicator matched; MPI's progress engine moves every issued
    one inside each Wait, so later parts cross the link while earlier ones
    are gathered within the host."""
    reqs = [None] * len(parts)
    for stage in stages:
        for i, part in enumerate(parts):
            if reqs[i] is not None:
                reqs[i].Wait()
            reqs[i] = stage(part)
    for req in reqs:
        if req is not None:
            req.Wait()


class TwoLevel(object):
    """The sub-communicators of a two-level allreduce over ``comm`` and the sum.

    Collective to build; :meth:`allreduce` is called by every rank of
    ``comm`` in the same order (one at a time: the sub-communicators are
    shared by the calls). ``algorithm``: one of :data:`ALGORITHMS`, or None
    for ``rsag`` where the hosts have equal rank counts, else ``leader``.
    """

    def __init__(self, comm, algorithm=None, environ=None, piece_bytes=None):
        self.piece_bytes = PIECE_BYTES if piece_bytes is None else int(piece_bytes)
        self._MPI = import_mpi()
        self.local = host_comm(comm, environ)
        self.local_rank, self.local_size = self.local.Get_rank(), self.local.Get_size()
        sizes = comm.allgather(self.local_size)
        uniform = len(set(sizes)) == 1
        if algorithm is None:
            algorithm = 'rsag' if uniform else 'leader'
        if algorithm not in ALGORITHMS:
            raise ValueError('unknown two-level algorithm %r; choose from %s'
                             % (algorithm, ', '.join(ALGORITHMS)))
        if algorithm == 'rsag' and not uniform:
            raise ValueError("the 'rsag' two-level allreduce needs the same number of ranks "
                             'on every host, got %s' % sorted(set(sizes)))
        self.algorithm = algorithm
        # rsag: local rank j of every host; leader: the local ranks 0 (others get
        # a communicator they never use, COMM_NULL being awkward to Free)
        color = self.local_rank if algorithm == 'rsag' else int(self.local_rank != 0)
        self.cross = comm.Split(color, key=comm.Get_rank())
        self.hosts = self.cross.Get_size() if self.local_rank == 0 else None
        self._ops = {}

    def allreduce(self, buf, wire='float32', wire_method=None):
        """Sum float32 ``buf`` over every rank in place; ``wire`` between hosts.

        Raises :class:`WireOverflow` on every rank when a 16-bit sum held inf
        or nan (the buffer then holds them too)."""
        if self.algorithm == 'rsag':
            self._rsag(buf, wire, wire_method)
        else:
            self._leader(buf, wire, wire_method)
        if wire != 'float32' and not np.isfinite(buf).all():
            # the same values on every rank, so every rank raises
            raise WireOverflow('the two-level sum over a %s wire holds inf or nan (a sum '
                               'beyond the 16-bit range between hosts)' % wire)
        return buf

    def _cross_sum(self, part, wire, wire_method):
        """Sum ``part`` among this rank's peers on the other hosts, in place."""
        if self.cross.Get_size() == 1:
            return
        if wire == 'float32':
            self.cross.Allreduce(self._MPI.IN_PLACE, part, op=self._MPI.SUM)
            return
        from .mpi_wire import DEFAULT_WIRE_METHOD, WireTransfer
        t = WireTransfer(part, wire)
        t.exchange(self.cross, wire_method or DEFAULT_WIRE_METHOD, self._ops)
        try:
            t.finish()
        except WireOverflow:
            pass      # the caller's check after the last phase raises on every rank

    def _rsag(self, buf, wire, wire_method):
        R = self.local_size
        if R == 1 or (wire != 'float32' and (wire_method or 'asa') != 'asa'):
            return self._rsag_blocking(buf, wire, wire_method)
        pieces = max(1, min(buf.nbytes // self.piece_bytes if self.piece_bytes else 1,
                            MAX_PIECES))
        parts = [_Part(p, R, self.local_rank) for p in _split(buf, pieces)]
        stages = [self._scatter]
        if self.cross.Get_size() > 1:
            stages += [self._cross] if wire == 'float32' else [
                lambda part: self._wire_alltoall(part, wire),
                lambda part: self._wire_allgather(part, wire)]
        _run_stages(parts, stages + [self._gather])

    def _rsag_blocking(self, buf, wire, wire_method):
        MPI, R = self._MPI, self.local_size
        counts = chunk_counts(buf.size, R)
        displs = _displs(counts)
        j = self.local_rank
        shard = buf[displs[j]:displs[j] + counts[j]].copy() if R > 1 else buf
        if R > 1:
            self.local.Reduce_scatter(buf, shard, recvcounts=counts, op=MPI.SUM)
        self._cross_sum(shard, wire, wire_method)
        if R > 1:
            self.local.Allgatherv(shard, [buf, (counts, displs), MPI.FLOAT])

    # The stages of a piece (nonblocking: each returns its request; _run_stages
    # issues them piece by piece, a stage once the piece's previous one is done)
    def _scatter(self, part):
        return self.local.Ireduce_scatter(part.buf, part.shard, part.counts, op=self._MPI.SUM)

    def _cross(self, part):
        return self.cross.Iallreduce(self._MPI.IN_PLACE, part.shard, op=self._MPI.SUM)

    def _wire_alltoall(self, part, wire):
        """alltoall-sum-allgather (mpi_wire's asa) of the shard between hosts, part 1:
        every host's 16-bit shard, cut in H chunks, chunk h to host h."""
        MPI, H, h = self._MPI, self.cross.Get_size(), self.cross.Get_rank()
        part.wire, part.w = wire, encode(part.shard, wire)
        part.wcounts = chunk_counts(part.shard.size, H)
        mine = part.wcounts[h]
        part.recv = np.empty(H * mine, np.uint16)
        return self.cross.Ialltoallv(
            [part.w, (part.wcounts, _displs(part.wcounts)), MPI.UINT16_T],
            [part.recv, ([mine] * H, [mine * i for i in range(H)]), MPI.UINT16_T])

    def _wire_allgather(self, part, wire):
        """Part 2: sum this host's chunk in float32, cast once, gather every chunk."""
        MPI, H = self._MPI, self.cross.Get_size()
        total = sum_encoded(part.recv.reshape(H, -1), wire)
        part.sum16 = encode(total, wire)
        return self.cross.Iallgatherv(
            [part.sum16, MPI.UINT16_T],
            [part.w, (part.wcounts, _displs(part.wcounts)), MPI.UINT16_T])

    def _gather(self, part):
        if part.w is not None:
            decode(part.w, part.wire, part.shard)
        return self.local.Iallgatherv(part.shard, [part.buf, (part.counts, part.displs),
                                                   self._MPI.FLOAT])

    def _leader(self, buf, wire, wire_method):
        MPI = self._MPI
        if self.local_size > 1:
            self.local.Reduce(MPI.IN_PLACE if self.local_rank == 0 else buf,
                              buf if self.local_rank == 0 else None, op=MPI.SUM, root=0)
        if self.local_rank == 0:
            self._cross_sum(buf, wire, wire_method)
        if self.local_size > 1:
            self.local.Bcast(buf, root=0)

    def describe(self):
        """E.g. ``two-level rsag, 2 ranks on this host``."""
        return 'two-level %s, %d ranks on this host' % (self.algorithm, self.local_size)

    def free(self):
        """Free the sub-communicators and the wire's reductions."""
        from .mpi_wire import free_ops
        free_ops(self._ops)
        for c in (self.local, self.cross):
            c.Free()
        self.local = self.cross = None
