"""Theano-MPI's ``DEVICES`` syntax: the ranks' devices and, across nodes, their hosts.

One node: ``cuda0,cuda1`` (or a list ``['cuda0', 'cuda1']``; OpenCL's
``opencl0:0`` is a device, not a host ``opencl0``). Several
nodes (Theano-MPI's session files, a bash array): ``("node0:cuda0"
"node1:cuda0,cuda1")``, which reaches us as the list ``['node0:cuda0',
'node1:cuda0,cuda1']``: rank r takes the r-th device in that order.
"""
import re
import socket

LOCAL_NAMES = ('localhost', '127.0.0.1')

_OPENCL = re.compile(r'^opencl\d+:', re.IGNORECASE)


def parse_devices(value):
    """``[(host or None, device), ...]`` in rank order, from a string or a list.

    Raises ValueError naming the entry when a host or device is empty.
    """
    items = [value] if isinstance(value, str) else list(value)
    out = []
    for item in items:
        text = str(item).strip()
        # HOST:DEVICES, where DEVICES may itself hold 'openclP:D'.
        host, sep, devs = text.partition(':')
        if not sep or _OPENCL.match(text):
            host, sep, devs = None, '', text
        host = host.strip() if sep else None
        if sep and not host:
            raise ValueError('DEVICES entry %r: empty host before ":"' % item)
        names = [d.strip() for d in devs.split(',')]
        if not any(names) or not all(names):
            raise ValueError('DEVICES entry %r: expected DEVICE[,DEVICE...] or '
                             'HOST:DEVICE[,DEVICE...]' % item)
        out.extend((host, d) for d in names)
    if not out:
        raise ValueError('DEVICES is empty')
    return out


def remote_hosts(pairs):
    """``[(host, ranks), ...]`` in rank order when any host is not this machine, else None."""
    here = {socket.gethostname(), socket.gethostname().split('.')[0]} | set(LOCAL_NAMES)
    hosts = []
    for host, _ in pairs:
        name = host or 'localhost'
        if hosts and hosts[-1][0] == name:
            hosts[-1][1] += 1
        else:
            hosts.append([name, 1])
    if all(h in here for h, _ in hosts):
        return None
    return [(h, n) for h, n in hosts]


def host_args(hosts, mpiexec):
    """mpiexec arguments placing ``[(host, ranks), ...]`` in order (MPICH or Open MPI)."""
    from .mpiexec import _is_openmpi
    spec = ','.join('%s:%d' % (h, n) for h, n in hosts)
    return ['--host', spec] if _is_openmpi(mpiexec) else ['-hosts', spec]
