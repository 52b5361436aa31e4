"""The kn-sum of device gradient buckets through host buffers (host-staged MPI).

For device gradients where NCCL is not there (OpenCL, a GPU without NCCL):
when a bucket's gradients are final, its slice of the flat device gradient
is copied into the matching slice of one host buffer and handed to the
communicator's MPI thread; while that thread moves it, the training thread
runs the next backward chunk and copies the next buckets. :meth:`finish`
waits for each bucket in turn and writes its sum back into the device
slice, before the update. Each copy is recorded (``copies``) for the
timeline's ``copy`` lane.
"""
import time

import numpy as np

from ..collective.base import wait_all
from .knsum import KnSumExchanger


class HostStagedExchanger(KnSumExchanger):
    """:class:`~theanompi_ext.exchange.knsum.KnSumExchanger` for a flat device
    gradient (a pygpu array). The BN-local tail is not touched here: the
    device update scales it (``update/device.py``)."""

    path = 'host-staged MPI'

    def __init__(self, comm, buckets, n_exchanged_entries, wire='float32'):
        KnSumExchanger.__init__(self, comm, buckets, n_exchanged_entries, wire)
        self.host = np.zeros(n_exchanged_entries, np.float32)
        self._copies = []
        self.copies = []     # the last finished step's (name, t0, t1, nbytes)

    def _copy(self, name, fn, nbytes):
        t0 = time.perf_counter()
        fn()
        self._copies.append((name, t0, time.perf_counter(), nbytes))

    def _start(self, b, grads):
        """Copy bucket ``b`` to the host and start its allreduce there."""
        host = self.host[b.start:b.stop]
        self._copy('d2h bucket%d' % b.index, lambda: grads[b.start:b.stop].read(host),
                   host.nbytes)
        return self.comm.start_allreduce(host, name='bucket%d' % b.index, **self._wire_kw)

    def finish(self, grads):
        """Wait for each started bucket and write its sum back to the device."""
        started = self._take()

        def write_back(i):
            b = self.buckets[started[i][0]]
            host = self.host[b.start:b.stop]
            self._copy('h2d bucket%d' % b.index, lambda: grads[b.start:b.stop].write(host),
                       host.nbytes)
        try:
            wait_all([h for _, h in started], write_back)
        finally:
            self.copies, self._copies = self._copies, []
        return self.last_handles
