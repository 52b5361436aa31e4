"""Which hosts of a job are this one, and by which interface this host reaches the others.

Asked of the kernel: ``ip -o route get ADDRESS`` names the device a packet
to ADDRESS leaves by, or says ``local`` for an address of this host (so a
hostfile that names this host by any of its addresses counts as this host,
as hydra counts it). A name that does not resolve here, or a machine
without ``ip``, gives a :class:`Route` with ``why`` and no device: the
caller then keeps the MPI library's own choice.
"""
import collections
import shutil
import socket
import subprocess

#: Names that always mean this host.
LOCAL_NAMES = ('localhost', 'localhost.localdomain', '127.0.0.1', '::1')
#: Seconds ``ip route get`` may take.
ROUTE_TIMEOUT_S = 5.0


class Route(collections.namedtuple('Route', 'host address device local why')):
    """``host`` as named; its ``address``; the ``device`` this host reaches it by
    (None where unknown); ``local``: it is this host; ``why``: why no device."""


def own_names():
    """This host's names: its hostname, the hostname's first label, :data:`LOCAL_NAMES`."""
    name = socket.gethostname()
    return {name, name.split('.')[0]} | set(LOCAL_NAMES)


def resolve(host):
    """The first address ``host`` resolves to here, or None."""
    try:
        return socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)[0][4][0]
    except (OSError, UnicodeError, IndexError):
        return None


def parse_route(text):
    """``(device, local)`` from one line of ``ip -o route get``; device None if absent."""
    words = text.split()
    device = words[words.index('dev') + 1] if 'dev' in words[:-1] else None
    return device, bool(words) and words[0] == 'local'


def route_to(host, run=subprocess.run):
    """The :class:`Route` of ``host`` (``run``: subprocess.run, replaced in tests)."""
    if host in own_names():
        return Route(host, None, 'lo', True, None)
    address = resolve(host)
    if address is None:
        return Route(host, None, None, False, '%s does not resolve here' % host)
    if shutil.which('ip') is None and run is subprocess.run:
        return Route(host, address, None, False, "`ip` not found (iproute2): the route "
                                                 "to %s is unknown" % host)
    try:
        res = run(['ip', '-o', 'route', 'get', address], capture_output=True, text=True,
                  timeout=ROUTE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Route(host, address, None, False, '`ip route get %s` failed: %s' % (address, exc))
    device, local = parse_route(res.stdout) if res.returncode == 0 else (None, False)
    if device is None:
        return Route(host, address, None, False, 'no route to %s (%s)%s' % (
            host, address, ': ' + res.stderr.strip() if res.stderr.strip() else ''))
    return Route(host, address, device, local or device == 'lo', None)


def routes(hosts, run=subprocess.run):
    """:func:`route_to` of each of ``hosts``, in order."""
    return [route_to(h, run) for h in hosts]
