"""The order in which the ranks of this host ended, as the launcher saw it.

Hydra names one PID in its report of a rank that died, but when it has
killed the other ranks itself it may name one of those (measured: 1 run in
2 named the wrong rank). The first rank to exit is the one that died.
"""
import os
import select
import socket
import threading
import time

from .rank_notes import read_rank_notes


class ExitOrder(threading.Thread):
    """Watches this host's ranks and records the order in which they exit.

    Each local rank's PID comes from its note; ``os.pidfd_open`` + ``poll``
    wakes on each exit without polling. ``first()`` is the rank that exited
    strictly first, or None (no pidfd support, other hosts, or a tie);
    ``wall`` when each exited, by the wall clock (``launch/proxy_lost.py``
    sets it beside the other hosts' notes).
    """

    def __init__(self, folder, size, interval=0.05):
        super(ExitOrder, self).__init__(name='exit-order', daemon=True)
        self.folder, self.size, self.interval = folder, size, interval
        self.exits = []               # [(when, ns since the epoch; rank)], in order
        self._halt = threading.Event()

    def run(self):
        if not hasattr(os, 'pidfd_open') or not self.size:
            return
        host, fds, poller = socket.gethostname(), {}, select.poll()
        try:
            while not self._halt.is_set() and not (len(fds) == self.size
                                                    and len(self.exits) == self.size):
                if len(fds) < self.size:     # ranks write their notes at start-up
                    for rank, (pid, h, _) in read_rank_notes(self.folder).items():
                        if rank not in fds.values() and h == host:
                            try:
                                fd = os.pidfd_open(pid)
                            except OSError:
                                continue
                            fds[fd] = rank
                            poller.register(fd, select.POLLIN)
                for fd, _ in poller.poll(int(self.interval * 1000)):
                    self.exits.append((time.time_ns(), fds[fd]))
                    poller.unregister(fd)
        finally:
            for fd in fds:
                os.close(fd)

    def stop(self):
        """End the watch (the job is over)."""
        self._halt.set()
        if self.is_alive():
            self.join(1.0)

    @property
    def wall(self):
        """``{rank: when it exited, ns since the epoch}``."""
        return {rank: when for when, rank in self.exits}

    def first(self):
        """The rank that exited strictly before every other, or None."""
        if not self.exits or (len(self.exits) > 1 and self.exits[1][0] == self.exits[0][0]):
            return None
        return self.exits[0][1]
