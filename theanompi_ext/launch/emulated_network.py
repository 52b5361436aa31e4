"""An emulated network between the ranks of one machine, and mpiexec jobs run on it.

A *network setting* is what ``--network`` takes, parsed into a
:class:`Network`:

``shm``          the ranks on this machine, MPI over shared memory (nothing
                 is emulated; the job runs as it is).
``hosts:HxR:RATE[:QUEUE][:loss=P][:per-frame]`` e.g. ``hosts:2x2:200mbit``:
                 H emulated hosts of R ranks (:mod:`.emulated_hosts`: shared
                 memory within a host, TCP between hosts, each host's link
                 shaped to RATE, with a queue of QUEUE, a tc time such as
                 50ms: its default is lossless; losing P of the packets each
                 way, a fraction or N%, each packet a frame with
                 ``per-frame``: :mod:`.link_loss`); the ``rate`` field holds
                 ``HxR:RATE[:...]`` (:func:`hosts_layout`, :func:`hosts_links`).
``tbf:RATE``     e.g. ``tbf:200mbit``: the ranks run inside a fresh network
                 namespace whose loopback is rate-limited by the ``tbf``
                 queueing discipline (:class:`RateLimitedNamespace`), and
                 MPI (MPICH or Open MPI) is forced onto TCP (:data:`TCP_ENV`), emulating a
                 network that moves bytes without the CPU. Needs root and
                 ``ip``/``tc`` (iproute2, :func:`netns_problem` says what is
                 missing).

By hand, a ``tbf`` job is::

    ip netns add NAME
    ip netns exec NAME ip link set lo up
    ip netns exec NAME tc qdisc add dev lo root tbf rate RATE burst 256kb latency 50ms
    ip netns exec NAME env MPIR_CVAR_NOLOCAL=1 MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp mpiexec ...
    (Open MPI: env OMPI_MCA_pml=ob1 OMPI_MCA_btl=tcp,self OMPI_MCA_btl_tcp_if_include=lo)
    ip netns del NAME

:func:`run_on_network` is that sequence, written once for every benchmark:
it runs an mpiexec command line on a setting and returns the exit status.
The ranks live in a process group of their own; any exception while they
run (Ctrl-C, or SIGTERM/SIGHUP turned into ``SystemExit`` as ``bench``
does, see :func:`theanompi_ext.bench.cli.exit_on_stop_signals`) stops
every rank first, then the namespace is deleted on the way out.

:func:`tbf_link` turns a ``tbf`` setting into the link it emulates
(bytes per second, burst bytes), for models of the network.
"""
import os
import re
import shutil
import subprocess
from collections import namedtuple

from .mpiexec import popen_job, wait_job

# MPI over TCP even between ranks of one machine (it would use shared memory
# otherwise, and the shaped loopback would carry nothing): MPICH's variables,
# then Open MPI's (its TCP transport leaves out the loopback unless told; each
# MPI ignores the other's).
TCP_ENV = {'MPIR_CVAR_NOLOCAL': '1', 'MPIR_CVAR_CH4_NETMOD': 'ofi', 'FI_PROVIDER': 'tcp',
           'OMPI_MCA_pml': 'ob1', 'OMPI_MCA_btl': 'tcp,self', 'OMPI_MCA_btl_tcp_if_include': 'lo'}
# The tbf shaping besides the rate (tc units). ``latency`` is how long a packet may
# wait in tbf's queue, i.e. its size (rate x latency + burst): the loopback mode's
# 50 ms; emulated hosts choose their own (emulated_hosts.DEFAULT_QUEUE).
DEFAULT_BURST = '256kb'
DEFAULT_LATENCY = '50ms'
TC_TIME = {'s': 1.0, 'sec': 1.0, 'ms': 1e-3, 'msec': 1e-3, 'us': 1e-6, 'usec': 1e-6}
# tc's units: rates in 1000s (bits, or bytes with 'bps'), sizes in 1024s.
TC_RATE = {'bit': 1.0, 'kbit': 1e3, 'mbit': 1e6, 'gbit': 1e9,
           'bps': 8.0, 'kbps': 8e3, 'mbps': 8e6, 'gbps': 8e9}
TC_SIZE = {'b': 1, 'kb': 1024, 'mb': 1024 ** 2}
NAMESPACE_PREFIX = 'tmxbench'
RATE_RE = r'\d+(\.\d+)?([kmg]?bit|[kmg]?bps)'


class Network(namedtuple('Network', 'kind rate')):
    """A parsed network setting: ``kind`` 'shm' (``rate`` None), 'tbf' (``rate``
    in tc units, e.g. '200mbit') or 'hosts' (``rate`` '2x2:200mbit'). Equal to
    the plain tuple ``(kind, rate)``."""
    __slots__ = ()


class NetworkSetupError(RuntimeError):
    """The emulated network cannot be set up here (and why)."""


def parse_network(text):
    """'shm' -> ('shm', None); 'tbf:200mbit' -> ('tbf', '200mbit');
    'hosts:2x2:200mbit' -> ('hosts', '2x2:200mbit'), 'hosts:2x2:200mbit:50ms' -> ('hosts',
    '2x2:200mbit:50ms'); ValueError otherwise."""
    if text == 'shm':
        return Network('shm', None)
    kind, _, rate = text.partition(':')
    if kind == 'tbf' and re.fullmatch(RATE_RE, rate or ''):
        return Network('tbf', rate)
    if kind == 'hosts' and re.fullmatch(r'[1-9]\d*x[1-9]\d*:' + RATE_RE + r'(:[^:]+)*',
                                        rate or ''):
        net = Network('hosts', rate)
        hosts_links(net)                # each field after RATE checked, by name
        return net
    raise ValueError("unknown network %r: use 'shm', 'tbf:RATE' (e.g. tbf:200mbit) or "
                     "'hosts:HxR:RATE[:QUEUE][:loss=P][:per-frame]' (e.g. hosts:2x2:200mbit, "
                     "hosts:2x2:200mbit:50ms, hosts:2x2:200mbit:loss=1%%:per-frame)" % text)


def hosts_layout(net):
    """``(hosts, ranks per host, rate)`` of a 'hosts' setting (``('hosts', '2x2:200mbit')``
    -> ``(2, 2, '200mbit')``; a queue, if given, is :func:`hosts_queue`'s)."""
    layout, rate = net[1].split(':')[:2]
    h, _, r = layout.partition('x')
    return int(h), int(r), rate


def hosts_queue(net):
    """The link queue of a 'hosts' setting (``'50ms'`` of ``hosts:2x2:200mbit:50ms``),
    or None: the emulated hosts' default."""
    return hosts_links(net)['queue']


def hosts_links(net):
    """``{'queue': tc time or None, 'loss': fraction, 'per_frame': bool}`` of a
    'hosts' setting's fields after RATE, in any order: a tc time is the queue
    (``50ms``), ``loss=P`` the fraction of packets lost each way (``loss=1%``,
    ``loss=0.01``), ``per-frame`` a packet per frame. Anything else, or a field
    given twice, is a ValueError naming it and the setting."""
    from .link_loss import parse_loss
    what = 'network %r' % format_network(net)
    links, seen = {'queue': None, 'loss': 0.0, 'per_frame': False}, set()
    for field in net[1].split(':')[2:]:
        if field == 'per-frame':
            key, value = 'per_frame', True
        elif field.startswith('loss='):
            key, value = 'loss', parse_loss(field[5:], 'the loss of %s' % what)
        elif re.fullmatch(r'[0-9.]+[a-z]*', field):
            tc_time(field, 'the queue of %s' % what)     # its own words when not a time
            key, value = 'queue', field
        else:
            raise ValueError('%s: %r is neither a queue (a tc time such as 50ms), nor loss=P '
                             '(a fraction or N%%), nor per-frame' % (what, field))
        if key in seen:
            raise ValueError('%s: its %s is given twice' % (what, key.replace('_', '-')))
        seen.add(key)
        links[key] = value
    return links


def format_network(net):
    """The inverse of :func:`parse_network` (any ``(kind, rate)`` pair)."""
    return net[0] if net[1] is None else '%s:%s' % tuple(net)


def tbf_link(rate, burst=None):
    """``(bytes/s, burst bytes)`` of a ``tbf`` setting in tc's units ('200mbit', '256kb');
    ``burst`` defaults to :data:`DEFAULT_BURST`, what :class:`RateLimitedNamespace` sets."""
    burst = burst or DEFAULT_BURST
    m = re.fullmatch(r'([0-9.]+)([kmg]?bit|[kmg]?bps)', rate)
    b = re.fullmatch(r'([0-9.]+)([km]?b)', burst)
    if not m or not b:
        raise ValueError('tbf rate %r / burst %r: not in tc units' % (rate, burst))
    return float(m.group(1)) * TC_RATE[m.group(2)] / 8, float(b.group(1)) * TC_SIZE[b.group(2)]


def tc_time(text, what):
    """Seconds of a time in tc's units ('50ms', '1s', '250us'), above zero; a
    ValueError naming ``what`` (e.g. '--queue') otherwise."""
    m = re.fullmatch(r'([0-9]*\.?[0-9]+)(%s)' % '|'.join(TC_TIME), str(text).strip())
    if not m or float(m.group(1)) <= 0:
        raise ValueError('%s %r: not a time in tc units above zero (e.g. 50ms, 1s, 250us)'
                         % (what, text))
    return float(m.group(1)) * TC_TIME[m.group(2)]


def netns_problem():
    """Why a rate-limited namespace cannot be made here, or None."""
    if not hasattr(os, 'geteuid') or os.geteuid() != 0:
        return 'the tbf network mode needs root (it creates a network namespace)'
    missing = [t for t in ('ip', 'tc') if shutil.which(t) is None]
    if missing:
        return ('%s not found: install iproute2 (apt-get install iproute2)'
                % ' and '.join(missing))
    return None


def namespace_name(pid=None):
    """The name of the namespace process ``pid`` (default: this one) makes."""
    return '%s%d' % (NAMESPACE_PREFIX, os.getpid() if pid is None else pid)


def namespaces():
    """Names of the network namespaces that exist now (``ip netns list``)."""
    out = subprocess.run(['ip', 'netns', 'list'], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def delete_namespace(name):
    """``ip netns del NAME``, quietly (nothing happens when there is none)."""
    subprocess.run(['ip', 'netns', 'del', name], capture_output=True)


class RateLimitedNamespace(object):
    """A fresh network namespace whose loopback is limited to ``rate`` by tbf.

    ``with RateLimitedNamespace('200mbit') as ns: run(ns.wrap(cmd))``; the
    namespace (named by :func:`namespace_name`) is deleted on leaving the
    block, whatever happened in it. Raises :class:`NetworkSetupError` on
    entering when it cannot be made.
    """

    def __init__(self, rate, burst=DEFAULT_BURST, latency=DEFAULT_LATENCY):
        self.rate, self.burst, self.latency = rate, burst, latency
        self.name = namespace_name()

    def __enter__(self):
        problem = netns_problem()
        if problem:
            raise NetworkSetupError(problem)
        self._ip('netns', 'add', self.name)
        try:
            self._ip('netns', 'exec', self.name, 'ip', 'link', 'set', 'lo', 'up')
            self._ip('netns', 'exec', self.name, 'tc', 'qdisc', 'add', 'dev', 'lo', 'root',
                     'tbf', 'rate', self.rate, 'burst', self.burst, 'latency', self.latency)
        except NetworkSetupError:
            self.__exit__(None, None, None)
            raise
        return self

    def wrap(self, cmd):
        """``cmd`` run inside the namespace (the environment passes through)."""
        return ['ip', 'netns', 'exec', self.name] + list(cmd)

    def __exit__(self, *exc):
        delete_namespace(self.name)
        return False

    @staticmethod
    def _ip(*argv):
        res = subprocess.run(('ip',) + argv, capture_output=True, text=True)
        if res.returncode != 0:
            raise NetworkSetupError('`ip %s` failed: %s' % (' '.join(argv),
                                                            res.stderr.strip()))


def run_on_network(cmd, net, env, timeout=None):
    """Run the mpiexec command line ``cmd`` with its ranks on network ``net``; return
    its exit status (:data:`~theanompi_ext.errors.EXIT_TIMED_OUT` after ``timeout`` s).

    ``net``: a parsed setting (:func:`parse_network`); ``env``: the ranks'
    environment (not changed; on ``tbf`` :data:`TCP_ENV` is added where
    ``env`` does not set those variables). The ranks run in a process group
    of their own, killed if this process dies; any exception while waiting
    stops every rank before it propagates, and then the namespace goes.
    Raises :class:`NetworkSetupError` when the namespace cannot be made.
    """
    kind, rate = net
    env = dict(env)
    if kind == 'hosts':
        raise ValueError('a hosts setting runs through emulated_hosts.run_on_hosts')
    if kind == 'shm':
        return wait_job(popen_job(cmd, env), timeout)
    for key, value in TCP_ENV.items():
        env.setdefault(key, value)
    with RateLimitedNamespace(rate) as ns:
        return wait_job(popen_job(ns.wrap(cmd), env), timeout)


__all__ = ['DEFAULT_BURST', 'DEFAULT_LATENCY', 'Network', 'NetworkSetupError', 'TCP_ENV',
           'RateLimitedNamespace', 'delete_namespace', 'format_network', 'hosts_layout',
           'hosts_links', 'hosts_queue', 'namespace_name', 'namespaces', 'netns_problem',
           'parse_network', 'run_on_network', 'tbf_link', 'tc_time']
