"""Placing the ranks of Theano-MPI's ``DEVICES`` on their hosts with mpiexec.

``DEVICES`` is parsed by :func:`theanompi_ext.engine.devices.parse_devices`
into ``[(host or None, device), ...]`` in rank order; here those hosts
become mpiexec's host arguments when any is not this machine.
"""
import socket

LOCAL_NAMES = ('localhost', '127.0.0.1')


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
    from .mpiexec import is_openmpi
    spec = ','.join('%s:%d' % (h, n) for h, n in hosts)
    return ['--host', spec] if is_openmpi(mpiexec) else ['-hosts', spec]
