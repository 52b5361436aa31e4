"""``--iface`` and ``--transport``: the options of every command that launches MPI
jobs (and of ``info``, which says what they would choose).

They set :data:`~.network_default.IFACE_VAR` and
:data:`~.network_default.TRANSPORT_VAR` in this process, so every mpiexec
it starts (``launch/mpiexec.mpiexec_command``) follows them, restarts too.
"""
import os

from .network_default import IFACE_VAR, TRANSPORT_VAR, TRANSPORTS


def add_network_arguments(group):
    """Add ``--iface`` and ``--transport`` to ``group`` (an argparse parser or group)."""
    group.add_argument('--iface', default=None, metavar='IFACE',
                       help="network interface for MPI's traffic between hosts, e.g. ib0 or "
                            "eth1: hydra's -iface, Open MPI's btl/oob_tcp_if_include "
                            "(default: $%s, else the interface by which this host reaches "
                            "the hostfile's first other host; docs/multinode.md)" % IFACE_VAR)
    group.add_argument('--transport', default=None, choices=TRANSPORTS,
                       help="MPI's transport between hosts: default (the MPI library's "
                            "own: UCX/libfabric, InfiniBand where there is one) or tcp "
                            "(TCP between hosts, shared memory within; default: $%s, else "
                            "default)" % TRANSPORT_VAR)
    return group


def use_network(args):
    """``--iface``/``--transport`` of ``args``: the jobs this process launches follow them."""
    if getattr(args, 'iface', None):
        os.environ[IFACE_VAR] = args.iface
    if getattr(args, 'transport', None):
        os.environ[TRANSPORT_VAR] = args.transport
