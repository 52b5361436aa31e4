"""Which network interface and transport the ranks' MPI will use, and why
(``theanompi-ext info``'s ``interface`` and ``transport`` lines).

Nothing is probed: the answer is read from the environment a launch passes
on (``train --iface`` sets :data:`~.mpiexec.IFACE_VAR`) and from what each
MPI does by default, so it holds for the hosts of a hostfile that share
this environment (hydra gives its environment to every host; Open MPI the
forwarded variables, ``launch/mpiexec.forwarded_env_args``).
"""
import os
import socket

from .mpiexec import IFACE_VAR

#: The variables that choose the interface, in the order they win, and who reads them.
IFACE_SOURCES = ((IFACE_VAR, 'train --iface or the environment: hydra -iface, Open MPI '
                             'btl/oob_tcp_if_include'),
                 ('HYDRA_IFACE', "hydra's own variable"),
                 ('OMPI_MCA_btl_tcp_if_include', "Open MPI's own variable"))
#: The variables that choose the transport, per MPI.
TRANSPORT_VARS = {'mpich': ('MPIR_CVAR_CH4_NETMOD', 'FI_PROVIDER', 'FI_TCP_IFACE', 'UCX_TLS',
                            'UCX_NET_DEVICES'),
                  'openmpi': ('OMPI_MCA_pml', 'OMPI_MCA_btl', 'OMPI_MCA_mtl', 'UCX_TLS',
                              'UCX_NET_DEVICES')}


def interfaces(root='/sys/class/net'):
    """The network interfaces of this host, loopback aside."""
    try:
        return sorted(n for n in os.listdir(root) if n != 'lo')
    except OSError:
        return []


def _own_address():
    name = socket.gethostname()
    try:
        return name, socket.gethostbyname(name)
    except OSError:
        return name, None


def interface_row(environ=None):
    """``('interface', what and why)``."""
    env = os.environ if environ is None else environ
    for var, who in IFACE_SOURCES:
        if env.get(var):
            return 'interface', '%s (from %s: %s)' % (env[var], var, who)
    name, address = _own_address()
    if address is None or address.startswith('127.'):
        hint = ('%s resolves to %s: hosts could not call this one back; give train --iface '
                'the interface the hosts share' % (name, address or 'nothing'))
    else:
        hint = "%s resolves to %s" % (name, address)
    return 'interface', ("the MPI library's choice (hydra: the address the host's name "
                         "resolves to; Open MPI: every interface that is up); %s; "
                         "interfaces here: %s" % (hint, ', '.join(interfaces()) or 'none'))


def transport_row(openmpi, environ=None):
    """``('transport', what and why)`` for MPICH (``openmpi`` False) or Open MPI."""
    env = os.environ if environ is None else environ
    names = TRANSPORT_VARS['openmpi' if openmpi else 'mpich']
    chosen = ['%s=%s' % (n, env[n]) for n in names if env.get(n)]
    if chosen:
        return 'transport', 'from the environment: %s' % ', '.join(chosen)
    default = ("Open MPI's default: ucx where it finds a fast network, else TCP and "
               "shared memory (ob1)" if openmpi else
               "MPICH's default netmod (the mpich wheel's: UCX, shared memory within a "
               "host); MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp forces TCP between hosts")
    return 'transport', default


def network_rows(openmpi, environ=None):
    """The ``interface`` and ``transport`` lines of ``theanompi-ext info``."""
    return [interface_row(environ), transport_row(openmpi, environ)]
