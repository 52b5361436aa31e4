"""The rule that picks the network interface and transport of a job's MPI traffic.

Pure functions of the environment and of the hosts' routes
(:mod:`.host_routes`), so that the launch (``launch/mpiexec.mpiexec_command``)
and ``theanompi-ext info`` say the same thing.

Interface, first that applies:

1. the user's: ``--iface`` (:data:`IFACE_VAR`), ``HYDRA_IFACE``,
   ``OMPI_MCA_btl_tcp_if_include``;
2. every rank on this host (no hostfile, or one naming only this host):
   none; MPI keeps its traffic in shared memory;
3. the device by which this host routes to the first other host of the
   hostfile: the other hosts reach this one on the network they share, not
   on whatever address this host's name resolves to (which may be
   loopback or a management network);
4. otherwise (that host does not resolve here, no ``ip``): the MPI library's
   own choice.

Transport (``--transport``, :data:`TRANSPORT_VAR`): the MPI library's own
(``default``: UCX or libfabric pick InfiniBand where there is one, TCP
otherwise) unless the user's environment names one or ``tcp`` is asked for:
MPICH's libfabric TCP netmod, Open MPI's ob1 with the TCP, self and
shared-memory BTLs.
"""
import collections

#: The interface the user asked for (``--iface``).
IFACE_VAR = 'THEANOMPI_EXT_IFACE'
#: The transport the user asked for (``--transport``): one of :data:`TRANSPORTS`.
TRANSPORT_VAR = 'THEANOMPI_EXT_TRANSPORT'
TRANSPORTS = ('default', 'tcp')
#: The variables that choose the interface, in the order they win, and who reads them.
IFACE_SOURCES = ((IFACE_VAR, '--iface or the environment'),
                 ('HYDRA_IFACE', "hydra's own variable"),
                 ('OMPI_MCA_btl_tcp_if_include', "Open MPI's own variable"))
#: The variables by which a user chooses the transport, per MPI.
TRANSPORT_VARS = {'mpich': ('MPIR_CVAR_CH4_NETMOD', 'FI_PROVIDER', 'FI_TCP_IFACE', 'UCX_TLS',
                            'UCX_NET_DEVICES'),
                  'openmpi': ('OMPI_MCA_pml', 'OMPI_MCA_btl', 'OMPI_MCA_mtl', 'UCX_TLS',
                              'UCX_NET_DEVICES')}
#: What ``--transport tcp`` sets, per MPI (Open MPI 5 knows ``vader`` as ``sm``'s alias).
TCP_SETTINGS = {'mpich': (('MPIR_CVAR_CH4_NETMOD', 'ofi'), ('FI_PROVIDER', 'tcp')),
                'openmpi': (('pml', 'ob1'), ('btl', 'tcp,self,vader'))}


class Choice(collections.namedtuple('Choice', 'value source why')):
    """``value``: what is passed to mpiexec (None: nothing, MPI decides);
    ``source``: the variable it came from, ``'route'``, ``'this host'`` (one host),
    ``'environment'`` or None (the MPI library's choice); ``why``: in words."""


def check_transport(value):
    """``value`` if it is one of :data:`TRANSPORTS`, else ValueError naming them."""
    if value not in TRANSPORTS:
        raise ValueError('unknown transport %r; choose from %s' % (value, ', '.join(TRANSPORTS)))
    return value


def choose_interface(environ, host_routes):
    """The interface :class:`Choice` for hosts whose routes (in hostfile order,
    :class:`~.host_routes.Route`) are ``host_routes`` (empty: no hostfile)."""
    for var, who in IFACE_SOURCES:
        if environ.get(var):
            return Choice(environ[var], var, 'set by %s (%s)' % (var, who))
    far = [r for r in host_routes if not r.local]
    if not far:
        return Choice(None, 'this host', 'none needed: every rank on this host (%s), shared '
                      'memory' % ('no hostfile' if not host_routes else 'the hostfile names '
                                  'only it'))
    first = far[0]
    if first.device is None:
        return Choice(None, None, "the MPI library's choice: %s" % first.why)
    return Choice(first.device, 'route', 'this host reaches %s (%s), the first other host of '
                  'the hostfile, by %s' % (first.host, first.address, first.device))


def choose_transport(environ, openmpi):
    """The transport :class:`Choice` under Open MPI (``openmpi``) or MPICH."""
    names = TRANSPORT_VARS['openmpi' if openmpi else 'mpich']
    chosen = ['%s=%s' % (n, environ[n]) for n in names if environ.get(n)]
    if chosen:
        return Choice(None, 'environment', 'set by the environment: %s' % ', '.join(chosen))
    option = check_transport(environ.get(TRANSPORT_VAR) or 'default')
    if option == 'tcp':
        words = ' '.join('%s=%s' % kv for kv in TCP_SETTINGS['openmpi' if openmpi else 'mpich'])
        return Choice('tcp', TRANSPORT_VAR, 'TCP between hosts, shared memory within '
                      '(--transport tcp: %s)' % words)
    return Choice(None, None, (
        "Open MPI's default (ucx where it finds a fast network, else ob1: TCP between hosts, "
        "shared memory within); --transport tcp forces TCP" if openmpi else
        "MPICH's default netmod (the mpich wheel's: UCX, which picks InfiniBand where there "
        "is one; shared memory within a host); --transport tcp forces TCP"))


def network_args(iface, transport, openmpi):
    """mpiexec's arguments for the :class:`Choice` s ``iface`` and ``transport``;
    what the user set through MPI's own variables reaches it by itself."""
    args = []
    if iface.value and iface.source in (IFACE_VAR, 'route'):
        args += (['--mca', 'btl_tcp_if_include', iface.value, '--mca', 'oob_tcp_if_include',
                  iface.value] if openmpi else ['-iface', iface.value])
    if transport.value == 'tcp':
        for name, value in TCP_SETTINGS['openmpi' if openmpi else 'mpich']:
            args += ['--mca', name, value] if openmpi else ['-genv', name, value]
        if not openmpi and iface.value and iface.source in (IFACE_VAR, 'route'):
            args += ['-genv', 'FI_TCP_IFACE', iface.value]
    return args
