"""Sums of float32 buckets that travel over MPI as 16-bit values (see :mod:`.wire`).

Two methods, both MPI's own collectives (no hand-made point-to-point ring):

``asa`` (default; Theano-MPI's alltoall-sum-allgather)
    The bucket is cast to 16 bits and cut into k chunks (sizes differ by at
    most one); ``Alltoallv`` gives rank r chunk r of every rank, which it
    sums in float32 and casts to 16 bits once; ``Allgatherv`` hands every
    rank every summed chunk, which it casts back into the bucket. Each
    rank sends and receives 2 (k-1)/k of the 16-bit bucket, as a ring
    allreduce would; the result is the same on every rank.
``op``
    ``Allreduce`` of the 16-bit values with a user-defined reduction
    (``MPI.Op.Create``) that decodes both operands, adds them in float32
    and encodes the sum. MPI stores partial sums in the buffer's type, so
    a sum is re-rounded to 16 bits after every combination (up to k-1
    times), and the reduction runs Python inside MPI (it needs the GIL).

Measured (docs/performance.md, "16-bit wire"), ``asa`` is the default.

Memory: the 16-bit copy of the bucket (2 bytes per element) plus one
float32 and one 16-bit chunk (1/k of the bucket); ``asa`` receives the
alltoall into the bucket's own memory, whose float32 values are already
encoded in the 16-bit copy.
"""
import numpy as np

from ..errors import WireOverflow
from .world import import_mpi
from .wire import (check_wire_dtype, chunk_counts, decode, encode, nonfinite_count,
                   sum_encoded, describe_overflow)

WIRE_METHODS = ('asa', 'op')
DEFAULT_WIRE_METHOD = 'asa'


def _MPI():
    return import_mpi()


def check_wire_method(method):
    """``method`` if it is one of :data:`WIRE_METHODS`, else ValueError naming it."""
    if method not in WIRE_METHODS:
        raise ValueError('unknown wire method %r; choose from %s'
                         % (method, ', '.join(WIRE_METHODS)))
    return method


def wire_allreduce(comm, buf, wire, method=DEFAULT_WIRE_METHOD, name=None, ops=None):
    """Sum float32 ``buf`` over ``comm`` in place, ``wire`` on the wire.

    Raises :class:`WireOverflow` (on every rank: the result is the same on
    all) when the exchanged sum holds inf or nan. ``ops``: a dict caching
    the ``op`` method's reductions (freed by :func:`free_ops`).
    """
    check_wire_method(method)
    transfer = WireTransfer(buf, wire, name)
    transfer.exchange(comm, method, ops)
    return transfer.finish()


class WireTransfer(object):
    """One bucket's 16-bit exchange in three parts, for three threads.

    The overlapped exchanger runs them where the GIL costs least: the
    constructor (cast to 16 bits, count this rank's non-finite values) on
    the thread that starts the bucket, between backward chunks, where it
    holds the GIL anyway; :meth:`exchange` (the collectives, and the
    ``asa`` float32 sum between them) on the communication thread, whose
    every return to Python waits for a compiled chunk to give the GIL up;
    :meth:`finish` (the overflow check, the cast back) on the waiting
    thread. Run in a row they are :func:`wire_allreduce`.
    """

    def __init__(self, buf, wire, name=None):
        check_wire_dtype(wire)
        self.buf, self.wire, self.name = buf, wire, name
        self.w = encode(buf, wire)
        self.bad_local = nonfinite_count(self.w, wire)
        self.largest = float(np.max(np.abs(buf))) if self.bad_local and buf.size else 0.0
        self.finished = False

    def exchange(self, comm, method=DEFAULT_WIRE_METHOD, ops=None):
        """The collectives: afterwards ``self.w`` holds the 16-bit sum."""
        if check_wire_method(method) == 'asa':
            _alltoall_sum_allgather(comm, self.buf, self.w, self.wire)
        else:
            MPI = _MPI()
            op = _op(ops if ops is not None else {}, self.wire)
            comm.Allreduce(MPI.IN_PLACE, [self.w, MPI.UINT16_T], op=op)

    def finish(self):
        """Cast the sum back into the bucket (once); :class:`WireOverflow` if it
        holds inf or nan. Returns the bucket."""
        if not self.finished:
            self.finished = True
            bad = nonfinite_count(self.w, self.wire)
            decode(self.w, self.wire, self.buf)
            if bad:
                raise WireOverflow(describe_overflow(self.name, self.wire, bad,
                                                     self.bad_local, self.largest))
        return self.buf


def _alltoall_sum_allgather(comm, buf, w, wire):
    MPI = _MPI()
    k, rank = comm.Get_size(), comm.Get_rank()
    counts = chunk_counts(buf.size, k)
    displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int).tolist()
    mine = counts[rank]
    # Rank r sends chunk j to rank j and receives k copies of its chunk,
    # into the bucket's own (already encoded) memory.
    spare = buf.view(np.uint16)
    recv = spare[:k * mine] if k * mine <= spare.size else np.empty(k * mine, np.uint16)
    comm.Alltoallv([w, (counts, displs), MPI.UINT16_T],
                   [recv, ([mine] * k, [mine * j for j in range(k)]), MPI.UINT16_T])
    total = sum_encoded(recv.reshape(k, mine), wire)
    comm.Allgatherv([encode(total, wire), MPI.UINT16_T], [w, (counts, displs), MPI.UINT16_T])


def _op(ops, wire):
    if wire not in ops:
        MPI = _MPI()

        def add(inbuf, inoutbuf, datatype):
            a = np.frombuffer(inbuf, np.uint16)
            b = np.frombuffer(inoutbuf, np.uint16)
            encode(decode(a, wire) + decode(b, wire), wire, b)

        ops[wire] = MPI.Op.Create(add, commute=True)
    return ops[wire]


def free_ops(ops):
    """Free the reductions cached by :func:`wire_allreduce`'s ``op`` method."""
    for op in ops.values():
        op.Free()
    ops.clear()
