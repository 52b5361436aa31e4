"""What ``theanompi-ext info`` says of the network: the interface and transport the
ranks' MPI will use, and the topology ``--topology auto`` picks, each with why.

The interface and transport come from the rule a launch follows
(:mod:`.network_default`, through ``launch/mpiexec.network_choices``), for
the hosts of ``info --hostfile`` (none: every rank on this host) and the
``--iface``/``--transport`` given to ``info`` or set in the environment.
The topology is ``collective/two_level.two_level_pays`` of the hostfile's
slots, filled in order as both MPIs place ranks.
"""
import os
import socket

from .hostlists import read_hostfile


def interfaces(root='/sys/class/net'):
    """The network interfaces of this host, loopback aside."""
    try:
        return sorted(n for n in os.listdir(root) if n != 'lo')
    except OSError:
        return []


def _loopback_warning():
    # hydra's default is the address this host's name resolves to: loopback
    # there means other hosts could not call back
    name = socket.gethostname()
    try:
        address = socket.gethostbyname(name)
    except OSError:
        address = None
    if address is None or address.startswith('127.'):
        return ('; %s resolves to %s: if the rule cannot choose, give --iface the interface '
                'the hosts share' % (name, address or 'nothing'))
    return ''


def interface_row(choice, far):
    """``('interface', what and why)`` for the interface :class:`~.network_default.Choice`;
    ``far``: whether the job has other hosts."""
    text = '%s: %s' % (choice.value, choice.why) if choice.value else choice.why
    if far and not choice.value:
        text += _loopback_warning()
    return 'interface', '%s; interfaces here: %s' % (text, ', '.join(interfaces()) or 'none')


def transport_row(choice):
    """``('transport', what and why)`` for the transport :class:`~.network_default.Choice`."""
    return 'transport', '%s: %s' % (choice.value, choice.why) if choice.value else choice.why


def topology_row(slots):
    """``('topology', what auto picks and why)`` for ``[(host, slots)]`` (empty: this host)."""
    from ..collective.two_level import two_level_pays
    per_host = [n for _, n in slots] or [None]
    if not slots or len(slots) == 1:
        return 'topology', 'auto picks flat: every rank on one host'
    hosts = ', '.join('%s:%d' % s for s in slots)
    if two_level_pays(per_host):
        return 'topology', ('auto picks two-level: %d hosts (%s), and a host with more than '
                            'one rank' % (len(slots), hosts))
    return 'topology', ('auto picks flat: %d hosts (%s), each with one rank: no sum within '
                        'a host to do first' % (len(slots), hosts))


def network_rows(mpiexec, hostfile=None, environ=None):
    """The ``interface``, ``transport`` and ``topology`` lines of ``theanompi-ext info``
    for a job on the hosts of ``hostfile`` started by ``mpiexec``."""
    from .mpiexec import network_choices
    slots = read_hostfile(hostfile) if hostfile else []
    iface, transport = network_choices(mpiexec, [h for h, _ in slots], environ)
    return [interface_row(iface, iface.source != 'this host'), transport_row(transport), topology_row(slots)]
