"""Timelines of ranks on several machines, on rank 0's clock (exchange/clock_sync.py).

With a stand-in communicator whose ranks' clocks and delays are set by hand
(the estimate's arithmetic and its bound), and on 3 real MPI ranks whose
``perf_counter`` is skewed as another machine's would be (days apart): the
gathered trace puts every rank's first step where it truly began, within the
error the trace states, and the job's exposed communication is the wait after
the last rank's backward pass (5 ms), not the skewed machine's own (15 ms).
"""
import json

import pytest

from support.procs import run_mpi
from theanompi_ext.exchange import clock_sync
from theanompi_ext.exchange.timeline import job_exposed_comm


class Played(object):
    """Rank ``rank`` of a job whose collectives are played from a script: true time
    advances by ``delays`` (bcast arrival, then the allgather's return to rank 0)
    each round; every rank's clock is the true time plus its skew."""

    def __init__(self, rank, skews, kernels, delays):
        self.rank, self.size = rank, len(skews)
        self.skews, self.kernels, self.delays = skews, kernels, list(delays)
        self.now, self.round, self.best = 1000.0, None, None

    def clock(self):
        return self.now + self.skews[self.rank]

    def allgather(self, obj, label=None):
        if label is None:                   # the kernels
            return list(self.kernels)
        # every rank read its clock on the bcast's arrival (true time self.now)
        stamps = [self.now + s for s in self.skews]
        self.now += self.round[1]           # back to rank 0
        return stamps

    def bcast(self, obj, root=0, label=None):
        if label == 'clock offsets':
            return self.best
        self.round = self.delays.pop(0)
        t0 = self.now + self.skews[0]
        self.now += self.round[0]
        return t0


def played(rank, skews, kernels, delays):
    """Run the estimate on every rank of a played job; ``[(offset, error)]``."""
    # rank 0 first: it finds the best round, which the others then receive
    zero = Played(0, skews, kernels, delays)
    orig = zero.bcast

    def keep(obj, root=0, label=None):
        if label == 'clock offsets':
            zero.best = obj
        return orig(obj, root, label)
    zero.bcast = keep
    out = [clock_sync.offsets_to_rank0(zero, rounds=len(delays), clock=zero.clock,
                                       kernel=lambda: kernels[0])]
    for r in range(1, len(skews)):
        other = Played(r, skews, kernels, delays)
        other.best = zero.best
        out.append(clock_sync.offsets_to_rank0(other, rounds=len(delays), clock=other.clock,
                                               kernel=lambda r=r: kernels[r]))
    return out


def test_the_estimate_by_hand():
    """Machine B's clock is 5000 s ahead. Round 1: 3 ms out, 1 ms back (round trip 4
    ms); round 2: 1 ms out, 1 ms back (2 ms, kept). Rank 1 read its clock 1 ms
    after rank 0's t0, so the kept estimate is t0 + 1 ms - (t0 + 1 ms + 5000 s)
    = -5000 s exactly (symmetric delays), error 1 ms; rank 2 shares rank 1's
    machine and takes rank 1's offset, rank 0's machine none (the error, the
    trace's, is the same on every rank)."""
    skews = [0.0, 5000.0, 5000.0]
    got = played(0, skews, ['A', 'B', 'B'], [(0.003, 0.001), (0.001, 0.001)])
    assert got[0] == (0.0, pytest.approx(0.001))
    for off, err in got[1:]:
        assert off == pytest.approx(-5000.0, abs=1e-9) and err == pytest.approx(0.001)


def test_asymmetric_delays_stay_within_the_error():
    """Out 3 ms, back 1 ms only: the midpoint is 1 ms off, the stated error 2 ms."""
    (_, _), (off, err) = played(0, [0.0, -7.5], ['A', 'B'], [(0.003, 0.001)])
    assert err == pytest.approx(0.002)
    assert abs(off - 7.5) <= err and off == pytest.approx(7.5 - 0.001)


def test_one_machine_needs_nothing():
    """Ranks of one kernel share its clock: no rounds, offset and error 0."""
    got = played(0, [0.0, 0.0], ['A', 'A'], [])
    assert got == [(0.0, 0.0), (0.0, 0.0)]


def test_the_kernel_is_the_boot_id():
    with open(clock_sync.BOOT_ID) as f:
        assert clock_sync.kernel_id() == f.read().strip()


def test_job_exposed_comm_is_meant_for_one_clock():
    """Why the offsets matter. Rank 0 ends its backward pass at 100.050, rank 1 at
    100.020; both transfers end at 100.060: the job waited 10 ms. With rank 1's
    machine 3 days ahead its stamps dominate both maxima, and the job seems to
    have waited rank 1's own 40 ms."""
    marks = [[(0, 100.050, 100.060)], [(0, 259300.020, 259300.060)]]
    assert job_exposed_comm(marks) == [pytest.approx(0.040)]
    marks[1] = [(it, b - 259200.0, c - 259200.0) for it, b, c in marks[1]]
    assert job_exposed_comm(marks) == [pytest.approx(0.010)]


def test_three_ranks_two_machines_days_apart():
    """Rank 0 on machine A, ranks 1 and 2 on machine B whose clock is 3 days ahead."""
    skews, kernels = [0.0, 259200.0, 259200.0], ['A', 'B', 'B']
    res = run_mpi(3, 'run_clock_sync.py', json.dumps(skews), json.dumps(kernels))
    assert res.returncode == 0, res.stdout + res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    other, starts = out['other'], out['step0_us']
    err_us = other['clock_error_us']
    assert 0 < err_us < 100000, other      # half a round trip of 3 local ranks
    offs = other['clock_offset_us']
    assert offs['0'] == 0.0 and offs['1'] == offs['2']
    assert abs(offs['1'] + 259200e6) <= err_us, offs
    # the ranks began step 0 together (after a barrier): within the error and the
    # barrier's spread, not 3 days apart
    spread = max(starts.values()) - min(starts.values())
    assert spread <= err_us + 50000, (starts, err_us)
    # each step: the job waited 5 ms after rank 0's backward pass (its last); with
    # rank 2's stamps 3 days ahead it would be rank 2's own 15 ms
    assert other['exposed_comm_us']['2'] == [15000.0, 15000.0]
    for v in other['job_exposed_comm_us']:
        assert abs(v - 5000.0) <= 2 * err_us + 2000, other['job_exposed_comm_us']


def test_one_machine_stays_exact():
    """The same ranks with one kernel: offsets 0 and error 0, as before."""
    res = run_mpi(2, 'run_clock_sync.py', json.dumps([0.0, 0.0]), json.dumps(['A', 'A']))
    assert res.returncode == 0, res.stdout + res.stderr
    other = json.loads(res.stdout.strip().splitlines()[-1])['other']
    assert other['clock_offset_us'] == {'0': 0.0, '1': 0.0} and other['clock_error_us'] == 0.0
    assert other['job_exposed_comm_us'] == [pytest.approx(5000.0, abs=2000.0)] * 2
