"""Placing the ranks of Theano-MPI's ``DEVICES`` on their hosts with mpiexec.

``DEVICES`` is parsed by :func:`theanompi_ext.engine.devices.parse_devices`
into ``[(host or None, device), ...]`` in rank order; here those hosts
become mpiexec's host arguments when any is not this machine. Rank r runs
on the host of the r-th entry, also when a host comes back later in the
list (``node0:cuda0 node1:cuda0 node0:cuda1``): hydra starts a process
manager per run of entries, in order; Open MPI, which would merge the
host's entries and fill it first (rank 1 on node0), maps rank by rank
(``--map-by seq``).
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
    if is_openmpi(mpiexec):
        # one --host entry per rank, taken in order (OVERSUBSCRIBE: more ranks than
        # cores; without it Open MPI 5.0.11 printed PMIx errors and started nothing)
        return ['--host', ','.join(h for h, n in hosts for _ in range(n)),
                '--map-by', 'seq:OVERSUBSCRIBE']
    return ['-hosts', ','.join('%s:%d' % (h, n) for h, n in hosts)]


def split_hosts(hosts):
    """The hosts of ``[(host, ranks), ...]`` that come back after another host: MPICH
    starts a process manager per run, and MPI takes each run for a node of its own
    (no shared memory between them, local ranks counted per run)."""
    seen, split = set(), []
    for host, _ in hosts:
        if host in seen and host not in split:
            split.append(host)
        seen.add(host)
    return split
