"""The emulated hosts' processes (launch/emulated_hosts.py): what runs in each
network namespace, and a wait until nothing does (root tests only)."""
import subprocess
import time

import pytest

from theanompi_ext.launch.emulated_hosts import EmulatedHosts, hosts_problem


def emulated_hosts(**kwargs):
    """Yields ``EmulatedHosts(**kwargs)`` entered, for a fixture (one set per test
    module: their start-up is expensive); skips where they cannot be made."""
    why = hosts_problem()
    if why:
        pytest.skip(why)
    with EmulatedHosts(**kwargs) as hosts:
        yield hosts


def ns_pids(ns):
    """PIDs of the processes in network namespace ``ns`` (``ip netns pids``)."""
    out = subprocess.run(['ip', 'netns', 'pids', ns], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def cmdline(pid):
    """The command line of ``pid`` as bytes, b'' once it has gone."""
    try:
        with open('/proc/%d/cmdline' % pid, 'rb') as f:
            return f.read()
    except OSError:
        return b''


def everything_gone(eh, since, limit=30.0):
    """Seconds from ``since`` until no process is left in any namespace of ``eh``
    (the hub's mpiexec, each host's proxy or daemon and ranks); fails naming what
    is left after ``limit``."""
    spaces = [eh.hub] + [eh.namespace(h) for h in eh.hosts]
    deadline = time.monotonic() + limit
    while any(ns_pids(ns) for ns in spaces):
        if time.monotonic() > deadline:
            left = {ns: [(p, cmdline(p)[:80]) for p in ns_pids(ns)] for ns in spaces}
            pytest.fail('left running: %r' % left)
        time.sleep(0.02)
    return time.monotonic() - since
