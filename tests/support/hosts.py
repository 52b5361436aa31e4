"""The emulated hosts' processes (launch/emulated_hosts.py): what runs in each
network namespace, and a wait until nothing does; a script run on a host, and
TCP flows between hosts (root tests only)."""
import subprocess
import sys
import time

import pytest

from theanompi_ext.launch.emulated_hosts import EmulatedHosts, hosts_problem


def skip_without_hosts():
    """Skip the test, with the reason, where emulated hosts cannot be made."""
    why = hosts_problem()
    if why:
        pytest.skip(why)


def emulated_hosts(**kwargs):
    """Yields ``EmulatedHosts(**kwargs)`` entered, for a fixture (one set per test
    module: their start-up is expensive); skips where they cannot be made."""
    skip_without_hosts()
    with EmulatedHosts(**kwargs) as hosts:
        yield hosts


def python_on(eh, host, script, *argv):
    """The command line that runs Python ``script`` with ``argv`` on ``host`` of ``eh``."""
    return ['ip', 'netns', 'exec', eh.namespace(host), sys.executable, '-c', script] + \
        [str(a) for a in argv]


#: ``recv ADDR FLOWS NBYTES`` listens on ADDR, says 'ready', then prints the bytes
#: its FLOWS connections brought; ``send ADDR FLOWS NBYTES`` sends NBYTES on each.
TCP_BULK = r'''
import socket, sys, threading
role, addr, flows, nbytes = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if role == 'recv':
    srv = socket.socket()
    srv.bind((addr, 5001))
    srv.listen(flows)
    print('ready', flush=True)
    got = [0] * flows
    def drain(i, c):
        while True:
            b = c.recv(1 << 20)
            if not b:
                return
            got[i] += len(b)
    ts = [threading.Thread(target=drain, args=(i, srv.accept()[0])) for i in range(flows)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    print(sum(got))
else:
    def send(_):
        s = socket.create_connection((addr, 5001))
        s.sendall(bytes(nbytes))
        s.close()
    ts = [threading.Thread(target=send, args=(i,)) for i in range(flows)]
    [t.start() for t in ts]
    [t.join() for t in ts]
'''


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
