"""The host-staged exchange of device buckets (exchange/staged.py), on a stand-in
device array and a real one-rank communicator: copies, sums and the wire."""
import numpy as np
import pytest

from theanompi_ext.collective import wire as W
from theanompi_ext.collective.local import LocalCommunicator
from theanompi_ext.exchange.staged import HostStagedExchanger
from theanompi_ext.buckets.plan import plan_buckets


class DeviceVector(object):
    """What the exchanger uses of a pygpu array: slices that ``read`` into and
    ``write`` from a host array (views of one buffer)."""

    def __init__(self, values, lo=0, hi=None):
        self.values, self.lo = values, lo
        self.hi = len(values) if hi is None else hi

    def __getitem__(self, s):
        start, stop, _ = s.indices(self.hi - self.lo)
        return DeviceVector(self.values, self.lo + start, self.lo + stop)

    def read(self, host):
        host[...] = self.values[self.lo:self.hi]

    def write(self, host):
        self.values[self.lo:self.hi] = host


class OneRankWire(LocalCommunicator):
    """One rank whose buckets really travel: a 16-bit wire rounds them (the
    host wire's casts, tested against references in test_wire.py); records
    what each start was asked."""

    def __init__(self):
        LocalCommunicator.__init__(self)
        self.seen = []

    def start_allreduce(self, buf, name=None, wire='float32'):
        self.seen.append((name, wire, buf.size))
        if wire != 'float32':
            buf[...] = W.decode(W.encode(buf, wire), wire)
        return LocalCommunicator.start_allreduce(self, buf, name, wire)


@pytest.mark.parametrize('wire', ['float32', 'float16', 'bfloat16'])
def test_buckets_travel_as_the_wire_and_come_back_to_their_slices(wire):
    """Every bucket is started with the wire asked for (the device step used
    to drop it); its sum comes back into its own slice; the entries past the
    exchanged ones (the BN-local tail) are untouched; one copy each way per
    bucket."""
    sizes = [300, 20, 5000, 40, 7]
    plan = plan_buckets(sizes, 4, 0.01, 0.002)
    assert len(plan) > 1
    n_exch = sum(sizes[:4])
    g = (np.random.RandomState(2).standard_normal(sum(sizes)) * 3).astype(np.float32)
    dev = DeviceVector(g.copy())
    comm = OneRankWire()
    ex = HostStagedExchanger(comm, plan, n_exch, wire)
    assert ex.wire == wire
    ex.reduce(dev)
    assert comm.seen == [('bucket%d' % b.index, wire, b.stop - b.start) for b in plan]
    want = g[:n_exch] if wire == 'float32' else W.decode(W.encode(g[:n_exch], wire), wire)
    np.testing.assert_array_equal(dev.values[:n_exch], want)
    np.testing.assert_array_equal(dev.values[n_exch:], g[n_exch:])
    if wire != 'float32':
        assert not np.array_equal(dev.values[:n_exch], g[:n_exch])     # the wire did round
    names = sorted(c[0] for c in ex.copies)
    assert names == sorted(['d2h bucket%d' % b.index for b in plan] +
                           ['h2d bucket%d' % b.index for b in plan])


def test_a_wire_the_communicator_cannot_send_is_refused_by_name():
    class Float32Only(LocalCommunicator):
        wire_dtypes = ('float32',)
    with pytest.raises(ValueError, match='float16'):
        HostStagedExchanger(Float32Only(), [], 0, 'float16')
