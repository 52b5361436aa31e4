"""Several emulated hosts on one machine, and mpiexec jobs placed on them (root only).

Each host is a network namespace with its own address (``eth0``,
10.77.0.N/24) and, for what runs there, its own hostname (``unshare -u``).
The hosts hang off a bridge in a *hub* namespace (one veth pair per host);
the hub is where the real mpiexec runs, the way a login node would. Every
link and device lives inside namespaces of ours, so nothing is added to the
machine's own network, and deleting the namespaces deletes everything.

``with EmulatedHosts(hosts=2, ranks_per_host=2, rate='200mbit') as eh:`` makes
them and writes, into a temporary folder:

``hostfile``   ``tmxh0:2`` ... (hydra's ``-f`` format; ``tmxh0 slots=2`` for Open MPI);
``mpiexec``    a script that runs the venv's mpiexec in the hub with
               ``-launcher ssh -launcher-exec WRAPPER -iface br0`` and MPICH
               forced onto TCP between hosts (:data:`HOSTS_ENV`; its default
               transport, UCX, moves data through shared memory even across
               namespaces); ``--version`` and ``-info`` pass straight through;
``launch``     WRAPPER: called as ``ssh [-x ...] HOST CMD...``, it drops the
               ssh options and runs CMD in HOST's namespace with HOST as its
               hostname.

With ``mpiexec=`` an Open MPI mpiexec (or one found first, as the launcher
finds it), the mpiexec script runs it in the hub with ``--prtemca
plm_ssh_agent WRAPPER`` (Open MPI 5's PRRTE; ``plm_rsh_agent`` in 4.x) and
its out-of-band and TCP traffic kept on the hosts' subnet.

``eh.env()`` sets ``THEANOMPI_EXT_MPIEXEC`` to that mpiexec (and
``THEANOMPI_EXT_LAUNCH_AGENT`` to WRAPPER, for ``launch/reach.py``), so
``theanompi-ext train --workers 4 --hostfile eh.hostfile`` runs across the
hosts unchanged. ``eh.cut(h)``/``eh.restore(h)`` take host ``h``'s link down
and up during a run, ``eh.set_rate(h, rate)`` slows it down (or up) during a
run, ``eh.set_loss(h, '2%')`` makes it lose packets at random (a BPF filter,
link_loss.py), ``eh.cut_hub()``/``eh.restore_hub()`` cut the launcher off the
hosts; ``rate`` (tbf), ``delay`` (netem) and ``loss`` shape every link, and
``queue`` sets how long a packet may wait at a shaped link (tbf's queue: deep
enough by default that the project's collectives lose nothing there).
Shared memory still works within a host (the ranks of one host share /dev/shm).

Cleanup: leaving the block kills every process in our namespaces and deletes
them; a reaper child does the same if this process dies without leaving the
block (SIGKILL); :func:`cleanup_stale` (called on entering) removes what a
dead process left. Namespaces are named ``tmxhosts<pid>-hub``/``-h<i>``.

For a user: ``python -m theanompi_ext.launch.emulated_hosts --hosts 2 --ranks 2
[--rate 200mbit] [--delay 5ms] [--queue 50ms] [--loss 1%] [--per-frame] --
theanompi-ext train --workers 4 --hostfile '$TMX_HOSTFILE' ...`` (the hostfile's
path is also in ``$TMX_HOSTFILE``).
"""
import argparse
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile

from .. import output_faults, stop_signals
from .awake import wait_awake
from .emulated_network import (DEFAULT_BURST, NetworkSetupError, hosts_layout, hosts_links,
                               delete_namespace, namespaces, netns_problem, tbf_link, tc_time)
from ..files.stale import pid_alive
from .hostlists import format_hostfile
from .link_loss import loss_commands, parse_loss
from .mpiexec import MPIEXEC_VAR, find_mpiexec, is_openmpi
from .reach import AGENT_VAR

PREFIX = 'tmxhosts'
SUBNET = '10.77.0.'
HUB_ADDRESS = SUBNET + '254'
BRIDGE = 'br0'
HOST_DEV = 'eth0'
#: What hydra's proxies get besides the launcher: TCP (libfabric) between hosts,
#: on each host's link rather than its loopback.
HOSTS_ENV = {'MPIR_CVAR_CH4_NETMOD': 'ofi', 'FI_PROVIDER': 'tcp', 'FI_TCP_IFACE': HOST_DEV}
#: How long a packet may wait in a shaped link's queue (tbf's ``latency``: the queue
#: holds rate x this + the burst). At 200 Mbit/s 1 s holds 25 MB, more than the TCP
#: windows of the flows that meet there (4 MB each at most, tcp_wmem), so the
#: links are lossless, as the simulator's are; 50 ms (1.25 MB) dropped 31-87
#: packets per 2 x 2 run of 4-16 MB allreduces, 500 ms and 1 s none
#: (docs/exchange-across-hosts.md, "The links' queue"). ``queue=`` chooses another.
DEFAULT_QUEUE = '1s'
#: mpiexec options that only ask a question (no launch): passed through untouched.
QUERY_OPTIONS = ('--version', '-version', '-info', '--info', '-h', '-help', '--help')


def check_shaping(rate=None, delay=None, queue=DEFAULT_QUEUE, flag='', loss=None):
    """ValueError, before anything is made, when ``rate``, ``delay`` or ``queue`` is
    not in tc's units, or ``loss`` not a fraction below 1; the times and the loss
    named ``flag`` + their name ('--queue' from a command line, 'queue' from Python)
    rather than in tc's words later."""
    if rate is not None:
        tbf_link(rate)
    if delay is not None:
        tc_time(delay, flag + 'delay')
    tc_time(queue, flag + 'queue')
    parse_loss(loss, flag + 'loss')


def hosts_problem():
    """Why emulated hosts cannot be made here, or None."""
    problem = netns_problem()
    if problem:
        return problem.replace('the tbf network mode', 'emulated hosts')
    if shutil.which('unshare') is None:
        return 'unshare not found: install util-linux'
    return None


def host_name(i):
    """The hostname (and hostfile name) of emulated host ``i``."""
    return 'tmxh%d' % i


def _owner(ns):
    m = re.match(r'%s(\d+)-' % PREFIX, ns)
    return int(m.group(1)) if m else None


def host_address(i):
    """The address of emulated host ``i`` (the same in every set: each set has its
    own namespaces)."""
    return SUBNET + str(i + 1)


def run_on_hosts(argv, net, env, timeout=None):
    """Run ``argv`` on every slot of fresh emulated hosts; returns the exit status.

    ``net``: a parsed ``hosts:HxR:RATE[:QUEUE]`` setting
    (:func:`~.emulated_network.hosts_layout`); ``env``: the ranks' environment
    (the hosts' mpiexec variables added); after ``timeout`` seconds every rank
    is stopped (:data:`~theanompi_ext.errors.EXIT_TIMED_OUT`). The hosts are
    removed before it returns, whatever happened.
    """
    from .mpiexec import mpiexec_command, popen_job, wait_job
    hosts, per_host, rate = hosts_layout(net)
    links = hosts_links(net)
    with EmulatedHosts(hosts, per_host, rate, queue=links['queue'] or DEFAULT_QUEUE,
                       loss=links['loss'] or None, per_frame=links['per_frame']) as eh:
        cmd = mpiexec_command(hosts * per_host, argv, hostfile=eh.hostfile,
                              mpiexec=eh.mpiexec)
        return wait_job(popen_job(cmd, eh.env(env)), timeout)


def tcp_counters(text):
    """``{name: value}`` of the ``Tcp:`` and ``TcpExt:`` tables of /proc/net/snmp and
    /proc/net/netstat (``text``: both files; each table a line of names, then
    a line of values)."""
    out, heads = {}, {}
    for line in text.splitlines():
        key, _, rest = line.partition(':')
        if key not in ('Tcp', 'TcpExt'):
            continue
        if key not in heads:
            heads[key] = rest.split()
        else:
            out.update((n, int(v)) for n, v in zip(heads.pop(key), rest.split()))
    return out


def remove_namespaces(names):
    """Kill every process inside each namespace in ``names``, then delete it (its
    links go with it)."""
    for ns in names:
        out = subprocess.run(['ip', 'netns', 'pids', ns], capture_output=True,
                             text=True).stdout
        for pid in out.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
    for ns in names:
        delete_namespace(ns)


def owned_namespaces(pid):
    """The namespaces that process ``pid``'s :class:`EmulatedHosts` made."""
    return [ns for ns in namespaces() if _owner(ns) == pid]


def cleanup_stale():
    """Remove the namespaces (and their links and processes) of dead owners;
    returns their names."""
    stale = [ns for ns in namespaces() if _owner(ns) is not None and not pid_alive(_owner(ns))]
    remove_namespaces(stale)
    return stale


def _ip(*argv):
    res = subprocess.run(('ip',) + argv, capture_output=True, text=True)
    if res.returncode != 0:
        raise NetworkSetupError('`ip %s` failed: %s' % (' '.join(argv), res.stderr.strip()))
    return res.stdout


def _forget_neighbours(ns, address=None):
    """Flush namespace ``ns``'s neighbour entries (for ``address`` only, if given)."""
    _ip('-n', ns, 'neigh', 'flush', *(['to', address] if address else ['all']))


LAUNCH_SCRIPT = r'''#!/bin/sh
# hydra's ssh launcher for emulated hosts: ssh [OPTIONS] HOST COMMAND...
while [ $# -gt 0 ]; do
  case "$1" in
    -o|-p|-l|-i|-F) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
host=$1; shift
case "$host" in
%(cases)s
  *) echo "ssh: Could not resolve hostname $host: Name or service not known (emulated hosts)" >&2; exit 255 ;;
esac
# like ssh: the words are joined and run by a shell, on the host, as the host; and
# nothing of the caller's but the three streams reaches the host (hydra leaves its
# sockets open: inherited, mpiexec's end of a proxy's connection would outlive
# mpiexec and keep that proxy waiting)
# (Open MPI's daemon command is shell code, VAR=...; export VAR; prted ...: not exec'd)
case "$*" in *\;*|*=*) run="$*" ;; *) run="exec $*" ;; esac
# a folder this host does not share: an empty tmpfs over it, or the host's own copy
# bound over it, in a mount namespace of the host's own (a host without the shared
# filesystem, or with another install)
mnt=""
[ -n "$pre" ] && mnt="-m --propagation private"
exec ip netns exec "$ns" unshare -u $mnt bash -c "${pre}for fd in \$(ls /proc/\$\$/fd); do [ \$fd -gt 2 ] && eval \"exec \$fd>&-\" 2>/dev/null; done; hostname $host && $run"
'''

MPIEXEC_SCRIPT = r'''#!/bin/sh
# the venv's mpiexec, run in the hub of the emulated hosts, launching through them
case "$1" in %(queries)s) exec %(real)s "$@" ;; esac
exec ip netns exec %(hub)s %(real)s -launcher ssh -launcher-exec %(launch)s -iface %(bridge)s %(genv)s "$@"
'''

OPENMPI_SCRIPT = r'''#!/bin/sh
# Open MPI's mpiexec, run in the hub of the emulated hosts, starting its daemons through
# them (PRRTE's ssh agent) and keeping its traffic on the hosts' network
case "$1" in %(queries)s) exec %(real)s "$@" ;; esac
exec ip netns exec %(hub)s %(real)s --prtemca plm_ssh_agent %(launch)s --prtemca oob_tcp_if_include %(subnet)s --mca btl_tcp_if_include %(subnet)s "$@"
'''

REAPER = ('import shutil, sys; sys.stdin.read(); '
          'from theanompi_ext.launch.emulated_hosts import owned_namespaces, '
          'remove_namespaces; remove_namespaces(owned_namespaces(int(sys.argv[1]))); '
          'shutil.rmtree(sys.argv[2], ignore_errors=True)')


class EmulatedHosts(object):
    """``hosts`` emulated hosts of ``ranks_per_host`` slots each (see the module).

    ``rate``: tc units ('200mbit'), each host's link in both directions (tbf);
    ``delay``: tc time ('5ms'), added once to every packet between two hosts
    (netem, applied where it leaves a host); ``queue``: tc time, how long a packet
    may wait at a shaped link before tbf drops it (default :data:`DEFAULT_QUEUE`:
    lossless; '50ms' a shallow, switch-like queue that TCP overflows). Raises
    :class:`~theanompi_ext.launch.emulated_network.NetworkSetupError` on entering
    when they cannot be made (not root, no iproute2, no netem in the kernel).
    ``unshared``: ``{host (name or index): [folder, ...]}``, folders that host does
    not share with the others: its processes see an empty folder there (a tmpfs in
    a mount namespace of its own), as a host without the shared filesystem would;
    or ``{host: {folder: copy}}``: they see the folder ``copy`` there (bound over
    it), as on a host with its own, other install (``copy`` None: empty).
    ``loss``: a fraction (0.02) or percentage ('2%') of the packets each host's link
    loses in each direction, at random (link_loss.py: a BPF filter, so no netem is
    needed); a packet between two hosts crosses two links. A packet is what the
    kernel passes along the link: TCP's segmentation-offload packets of up to
    ~64 KB (some 40 frames, lost together) unless ``per_frame``: every device of
    the set then carries one frame per packet (``gso_max_segs 1``, from the
    start, so every connection is made so), and the loss is per frame, as on a
    wire; it costs the machine's CPU about 10 times more per byte
    (docs/multinode.md).
    """

    def __init__(self, hosts=2, ranks_per_host=2, rate=None, delay=None, mpiexec=None,
                 unshared=None, queue=DEFAULT_QUEUE, loss=None, per_frame=False):
        if int(hosts) < 1 or int(hosts) > 250 or int(ranks_per_host) < 1:
            raise ValueError('hosts must be 1..250 and ranks_per_host >= 1')
        check_shaping(rate, delay, queue, loss=loss)
        self.n, self.ranks_per_host = int(hosts), int(ranks_per_host)
        self.rate, self.delay, self.queue = rate, delay, queue
        self.loss, self.per_frame = parse_loss(loss), bool(per_frame)
        self.hosts = [host_name(i) for i in range(self.n)]
        self.unshared = {}
        for host, folders in (unshared or {}).items():
            i = host if isinstance(host, int) else self.hosts.index(host)
            copies = folders if isinstance(folders, dict) else dict.fromkeys(folders)
            self.unshared[i] = {os.path.abspath(d): c and os.path.abspath(c)
                                for d, c in copies.items()}
        self.hub = '%s%d-hub' % (PREFIX, os.getpid())
        self.folder = self.hostfile = self.mpiexec = self._reaper = None
        self._rates = {}                # host index -> its link's rate now
        self._losses = {}               # (namespace, device) -> its loss now (absent: none yet)
        self.real_mpiexec, self.openmpi = mpiexec, False

    def namespace(self, host):
        """The namespace of ``host`` (a name or an index)."""
        i = host if isinstance(host, int) else self.hosts.index(host)
        return '%s%d-h%d' % (PREFIX, os.getpid(), i)

    def address(self, host):
        """The address of ``host`` (name or index) on the emulated network."""
        return host_address(host if isinstance(host, int) else self.hosts.index(host))

    def __enter__(self):
        problem = hosts_problem()
        if problem:
            raise NetworkSetupError(problem)
        cleanup_stale()
        if owned_namespaces(os.getpid()):
            # the names are per process: a second set would take the first one's
            raise NetworkSetupError('this process has emulated hosts already: one set '
                                    'per process at a time')
        self.folder = tempfile.mkdtemp(prefix=PREFIX + '-')
        try:
            self._start_reaper()
            self._make_network()
            self._write_scripts()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _start_reaper(self):
        # stdin closes when this process dies, however; the reaper then removes
        # what is left (nothing after a normal exit)
        self._reaper = subprocess.Popen([sys.executable, '-c', REAPER, str(os.getpid()),
                                         self.folder],
                                        stdin=subprocess.PIPE, start_new_session=True,
                                        env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                                            [_package_parent()] +
                                            os.environ.get('PYTHONPATH', '').split(os.pathsep))))

    def _make_network(self):
        _ip('netns', 'add', self.hub)
        _ip('-n', self.hub, 'link', 'set', 'lo', 'up')
        _ip('-n', self.hub, 'link', 'add', BRIDGE, 'type', 'bridge')
        _ip('-n', self.hub, 'addr', 'add', HUB_ADDRESS + '/24', 'dev', BRIDGE)
        _ip('-n', self.hub, 'link', 'set', BRIDGE, 'up')
        for i, host in enumerate(self.hosts):
            ns, dev = self.namespace(i), self.link(i)
            _ip('netns', 'add', ns)
            _ip('-n', ns, 'link', 'set', 'lo', 'up')
            _ip('-n', self.hub, 'link', 'add', dev, 'type', 'veth', 'peer', 'name', HOST_DEV,
                'netns', ns)
            _ip('-n', self.hub, 'link', 'set', dev, 'master', BRIDGE)
            _ip('-n', ns, 'addr', 'add', self.address(i) + '/24', 'dev', HOST_DEV)
            self._one_frame_per_packet(self.hub, dev)
            self._one_frame_per_packet(ns, HOST_DEV)
            self._shape(self.hub, dev, delay=None)      # into the host
            self._shape(ns, HOST_DEV, delay=self.delay)  # out of the host
            self._rates[i] = self.rate
            if self.loss:
                self.set_loss(i, self.loss)
            _ip('-n', self.hub, 'link', 'set', dev, 'up')
            _ip('-n', ns, 'link', 'set', HOST_DEV, 'up')
        self._one_frame_per_packet(self.hub, BRIDGE)      # what the hub itself sends

    def _one_frame_per_packet(self, ns, dev):
        # TCP reads the device's limit when it connects: set before any connection
        if self.per_frame:
            _ip('-n', ns, 'link', 'set', 'dev', dev, 'gso_max_segs', '1')

    def _tbf(self, rate):
        return ['tbf', 'rate', str(rate), 'burst', DEFAULT_BURST, 'latency', str(self.queue)]

    def _shape(self, ns, dev, delay):
        tc = ['netns', 'exec', ns, 'tc', 'qdisc', 'add', 'dev', dev]
        tbf = self._tbf(self.rate)
        try:
            if delay and self.rate:
                _ip(*tc + ['root', 'handle', '1:', 'netem', 'delay', str(delay)])
                _ip(*tc + ['parent', '1:', 'handle', '2:'] + tbf)
            elif delay:
                _ip(*tc + ['root', 'netem', 'delay', str(delay)])
            elif self.rate:
                _ip(*tc + ['root'] + tbf)
        except NetworkSetupError as exc:
            if 'unknown' in str(exc) and delay:
                raise NetworkSetupError('--delay needs the netem queueing discipline, which '
                                        'this kernel lacks (sch_netem): %s' % exc)
            raise

    def _write_scripts(self):
        q = shlex.quote
        cases = '\n'.join('  %s) ns=%s; pre=%s ;;' % (
            h, self.namespace(i), q(''.join(
                'mount %s %s || exit 255; ' % ('--bind ' + q(c) if c else
                                               '-t tmpfs tmx-unshared', q(d))
                for d, c in sorted(self.unshared.get(i, {}).items()))))
            for i, h in enumerate(self.hosts))
        launch = self._script('launch', LAUNCH_SCRIPT % {'cases': cases})
        genv = ' '.join('-genv %s %s' % (k, q(v)) for k, v in sorted(HOSTS_ENV.items()))
        real = self.real_mpiexec or find_mpiexec()
        self.openmpi = is_openmpi(real)
        if os.path.basename(os.path.dirname(real)).startswith(PREFIX + '-'):
            raise NetworkSetupError('%s=%s is an emulated-hosts mpiexec already: unset it'
                                    % (MPIEXEC_VAR, real))
        self.mpiexec = self._script('mpiexec', (OPENMPI_SCRIPT if self.openmpi else
                                                MPIEXEC_SCRIPT) % {
            'queries': '|'.join(QUERY_OPTIONS), 'real': q(real), 'hub': q(self.hub),
            'launch': q(launch), 'bridge': BRIDGE, 'genv': genv, 'subnet': SUBNET + '0/24'})
        self.hostfile = os.path.join(self.folder, 'hostfile')
        with open(self.hostfile, 'w') as fh:
            fh.write(format_hostfile([(h, self.ranks_per_host) for h in self.hosts],
                                     'openmpi' if self.openmpi else 'mpich'))

    def _script(self, name, text):
        path = os.path.join(self.folder, name)
        with open(path, 'w') as fh:
            fh.write(text)
        os.chmod(path, 0o755)
        return path

    def link(self, host):
        """The hub's end of ``host``'s link (a device in the hub namespace)."""
        i = host if isinstance(host, int) else self.hosts.index(host)
        return 'h%d' % i

    def env(self, base=None):
        """``base`` (default: this environment) with ``THEANOMPI_EXT_MPIEXEC`` set to
        the emulated hosts' mpiexec and ``TMX_HOSTFILE`` to the hostfile."""
        env = dict(os.environ if base is None else base)
        env[MPIEXEC_VAR], env['TMX_HOSTFILE'] = self.mpiexec, self.hostfile
        env[AGENT_VAR] = os.path.join(self.folder, 'launch')   # what hydra starts proxies with
        return env

    def cut(self, host):
        """Take ``host``'s link down (packets to and from it are dropped)."""
        _ip('-n', self.hub, 'link', 'set', self.link(host), 'down')

    def restore(self, host):
        """Bring ``host``'s link back up after :meth:`cut`, and forget the addresses
        that could not be resolved meanwhile: a FAILED neighbour entry answers the
        next connection at once with "No route to host" (measured: the first
        connect from a host whose processes were killed during the cut)."""
        _ip('-n', self.hub, 'link', 'set', self.link(host), 'up')
        _forget_neighbours(self.namespace(host))
        _forget_neighbours(self.hub, self.address(host))

    def cut_hub(self):
        """Cut the launcher's host (the hub) off the hosts, which still reach each
        other through its bridge: the hub's address is taken away, so what it sent
        and what is sent to it is dropped, as over a cut link (a login node lost)."""
        _ip('-n', self.hub, 'addr', 'del', HUB_ADDRESS + '/24', 'dev', BRIDGE)

    def restore_hub(self):
        """Give the hub its address back after :meth:`cut_hub` (and forget the hosts'
        failed resolutions of it, as :meth:`restore`)."""
        _ip('-n', self.hub, 'addr', 'add', HUB_ADDRESS + '/24', 'dev', BRIDGE)
        for host in self.hosts:
            _forget_neighbours(self.namespace(host), HUB_ADDRESS)

    def set_rate(self, host, rate):
        """Shape ``host``'s link to ``rate`` (tc units, both directions) from now on,
        also during a run: a link that degrades, or recovers; None: not shaped. A
        ``delay`` stays as it was."""
        check_shaping(rate, None, self.queue)
        i = host if isinstance(host, int) else self.hosts.index(host)
        # the delay (netem) is the host side's root, with tbf as its child
        for ns, dev, delayed in ((self.hub, self.link(i), False),
                                 (self.namespace(i), HOST_DEV, bool(self.delay))):
            where = ['parent', '1:', 'handle', '2:'] if delayed else ['root']
            tc = ['netns', 'exec', ns, 'tc', 'qdisc']
            if rate is not None:
                _ip(*tc + ['replace', 'dev', dev] + where + self._tbf(rate))
            elif self._rates[i] is not None:
                _ip(*tc + ['del', 'dev', dev] + where)
        self._rates[i] = rate

    def set_loss(self, host, loss):
        """Make ``host``'s link lose ``loss`` (a fraction or 'N%') of its packets in
        each direction from now on, at random, also during a run; 0 or None: none
        (packets or frames: ``per_frame``, see the class)."""
        fraction = parse_loss(loss)
        i = host if isinstance(host, int) else self.hosts.index(host)
        # each end on its own: a failure at one leaves the other's state known
        for end in ((self.hub, self.link(i)), (self.namespace(i), HOST_DEV)):
            for argv in loss_commands(end[1], fraction, self._losses.get(end)):
                try:
                    _ip('netns', 'exec', end[0], 'tc', *argv)
                except NetworkSetupError as exc:
                    raise NetworkSetupError(
                        'a lossy link needs the clsact queueing discipline and the bpf '
                        'classifier (sch_ingress, cls_bpf) in the kernel: %s' % exc)
                if argv[0] == 'qdisc':
                    self._losses[end] = 0.0
            self._losses[end] = fraction

    def link_bytes(self, host):
        """Bytes carried so far by ``host``'s link: ``(into the host, out of it)``."""
        out = _ip('netns', 'exec', self.hub, 'cat',
                  '/sys/class/net/%s/statistics/tx_bytes' % self.link(host),
                  '/sys/class/net/%s/statistics/rx_bytes' % self.link(host))
        into, out_of = (int(x) for x in out.split())
        return into, out_of

    def link_events(self, host):
        """What ``host``'s link and TCP stack counted so far: ``{'drops': packets
        its queue (tbf) dropped, 'lost': packets its loss (:meth:`set_loss`) dropped
        (each both directions), 'retrans': TCP segments retransmitted on the host,
        'timeouts': retransmission timeouts, 'probes': tail loss probes}``."""
        drops = lost = 0
        for ns, dev in ((self.hub, self.link(host)), (self.namespace(host), HOST_DEV)):
            stats = _ip('netns', 'exec', ns, 'tc', '-s', 'qdisc', 'show', 'dev', dev)
            for kind, dropped in re.findall(r'^qdisc (\S+) .*\n.*?dropped (\d+)', stats,
                                            re.M):
                if kind == 'clsact':
                    lost += int(dropped)
                else:
                    drops += int(dropped)
        text = _ip('netns', 'exec', self.namespace(host), 'cat', '/proc/net/snmp',
                   '/proc/net/netstat')
        counters = tcp_counters(text)
        return dict(drops=drops, lost=lost, retrans=counters.get('RetransSegs', 0),
                    timeouts=counters.get('TCPTimeouts', 0),
                    probes=counters.get('TCPLossProbes', 0))

    def __exit__(self, *exc):
        remove_namespaces(owned_namespaces(os.getpid()))
        if self._reaper is not None:
            self._reaper.stdin.close()
            try:
                self._reaper.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._reaper.kill()
                self._reaper.wait()
            self._reaper = None
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None
        return False


def _package_parent():
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None):
    """The CLI: run a command with emulated hosts set up around it; returns its status."""
    output_faults.reopen_missing()     # the command inherits /dev/null, not a closed fd
    p = argparse.ArgumentParser(
        prog='python -m theanompi_ext.launch.emulated_hosts',
        description='Run COMMAND with THEANOMPI_EXT_MPIEXEC set to an mpiexec that places '
                    'ranks on emulated hosts (network namespaces; root only) and the '
                    "hostfile's path in $TMX_HOSTFILE; everything is removed afterwards.",
        epilog="e.g. ... --hosts 2 --ranks 2 --rate 200mbit -- sh -c 'theanompi-ext train "
               "--workers 4 --hostfile $TMX_HOSTFILE --model digits_cnn'")
    p.add_argument('--hosts', type=int, default=2)
    p.add_argument('--ranks', type=int, default=2, help='ranks (slots) per host')
    p.add_argument('--rate', default=None, help='each link, tc units (e.g. 200mbit)')
    p.add_argument('--delay', default=None, help='between hosts, tc units (e.g. 5ms; netem)')
    p.add_argument('--queue', default=DEFAULT_QUEUE,
                   help='how long a packet may wait at a shaped link, tc units (default '
                        '%(default)s: lossless; 50ms: a shallow queue that drops)')
    p.add_argument('--loss', default=None,
                   help='packets each link loses in each direction, at random: a fraction '
                        '(0.02) or a percentage (2%%); default none')
    p.add_argument('--per-frame', action='store_true',
                   help='one frame per packet on every link (no segmentation offload), so '
                        '--loss is per frame, as on a wire; costs CPU')
    p.add_argument('command', nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ['--'] else args.command
    if not cmd:
        p.error('no command given (after --)')
    try:
        check_shaping(args.rate, args.delay, args.queue, flag='--', loss=args.loss)
        hosts = EmulatedHosts(args.hosts, args.ranks, args.rate, args.delay, queue=args.queue,
                              loss=args.loss, per_frame=args.per_frame)
    except ValueError as exc:
        p.error(str(exc))
    try:
        with hosts as eh:
            print('emulated hosts: %s; hostfile %s; mpiexec %s' % (
                ', '.join('%s=%s' % (h, eh.address(h)) for h in eh.hosts), eh.hostfile,
                eh.mpiexec), file=sys.stderr, flush=True)
            proc = subprocess.Popen(cmd, env=eh.env())
            # SIGTERM/SIGHUP go on to the command (Ctrl-C reaches it by itself), unless
            # ignored here (nohup); the hosts are removed once it has ended
            stop_signals.catch({sig: lambda signum, _frame: proc.send_signal(signum)
                                for sig in (signal.SIGTERM, signal.SIGHUP)})
            while True:
                try:
                    return wait_awake(proc)      # the handlers run whichever thread took the signal
                except KeyboardInterrupt:
                    continue
    except NetworkSetupError as exc:
        print('emulated hosts: %s' % exc, file=sys.stderr)
        return 2


__all__ = ['DEFAULT_QUEUE', 'EmulatedHosts', 'HOST_DEV', 'HOSTS_ENV', 'check_shaping',
           'cleanup_stale', 'host_address', 'host_name', 'hosts_problem', 'owned_namespaces',
           'remove_namespaces', 'run_on_hosts', 'tcp_counters']

if __name__ == '__main__':
    sys.exit(main())
