"""Which host a job could not start on, when mpiexec could not start its proxies.

Hydra's own words for it are ``Launch proxy failed.`` and a stack of its
function names, without the host (measured, MPICH 5.0.2: its launcher's
message is often lost as mpiexec exits within 15 ms). So after such a
failure the launcher asks each host of the hostfile itself, with the agent
hydra used (``ssh``, or :data:`AGENT_VAR`'s program: the emulated hosts'
wrapper), in parallel and bounded; a proxy that started but could not call
back (``unable to connect from "HOST" to "ADDRESS"``) names its host too,
as does Open MPI's banner for a daemon (``prted``) that did not report back
(``Remote host: HOST``, with the daemon's exit status).

Before a launch, :func:`check_hosts` asks the same of every other host, so
that every launch path (``train``, ``check-equivalence``, ``trials``, a
Theano-MPI session's ``DEVICES``) ends with status 2 naming the host instead
of starting mpiexec at all: :class:`Unreachable`.
"""
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from ..errors import EXIT_BAD_INPUT, BadInput
from .hostlists import check_line_ends, hostfile_hosts

#: The program hydra starts its proxies with (``-launcher-exec``); default ssh.
AGENT_VAR = 'THEANOMPI_EXT_LAUNCH_AGENT'
#: Seconds one host gets to answer ``AGENT HOST true``.
PROBE_TIMEOUT_S = 10.0
#: Overrides :data:`PROBE_TIMEOUT_S` (seconds).
TIMEOUT_VAR = 'THEANOMPI_EXT_REACH_TIMEOUT_S'
#: Set inside a batch scheduler's allocation: MPI then starts its proxies with the
#: scheduler's own launcher (srun, blaunch, qrsh, pbs_tmrsh), not ssh, so ssh
#: proves nothing and is not asked (unless :data:`AGENT_VAR` names the agent).
SCHEDULER_VARS = ('SLURM_JOB_ID', 'LSB_JOBID', 'PBS_JOBID', 'PE_HOSTFILE', 'FLUX_JOB_ID')
#: Hydra's lines when a proxy could not be started, or could not call back.
LAUNCH_FAILED = re.compile(rb'Launch proxy failed|unable to connect from "([^"]+)" to "([^"]+)"'
                           rb'(?: \(([^)]*)\))?')
#: Open MPI's (PRRTE's) banner when a daemon it spawned did not call back, and
#: the banner's lines that say where and how (measured, Open MPI 5.0.x).
DAEMON_FAILED = b'A daemon failed to report back after being spawned'
DAEMON_HOST = re.compile(rb'^\s*Remote host:\s*(\S+)')
DAEMON_STATUS = re.compile(rb'^\s*Daemon exit status:\s*(-?\d+)')
#: PRRTE's other banner for a daemon lost during the run, and its line naming the
#: host (measured, Open MPI 5.0.11: tmxh1's prted SIGKILLed, 3 runs in 5 this one,
#: prterun then exiting 0)::
#:
#:     PRTE has lost communication with a remote daemon.
#:       HNP daemon   : [prterun-vm-9295@0,0] on node vm
#:       Remote daemon: [prterun-vm-9295@0,2] on node tmxh1
DAEMON_LOST = b'PRTE has lost communication with a remote daemon'
DAEMON_NODE = re.compile(rb'^\s*Remote daemon\s*:\s*\S+ on node (\S+)')
#: A shell's status for a command it did not find.
NOT_FOUND_STATUS = 127
#: A shell's words for a program it could not find (bash, dash): the program's path
#: (hydra starts its proxy on each host by the launcher's own path, without the host).
MISSING_PROGRAM = re.compile(rb'(/[^\s:]+): (?:No such file or directory|command not found'
                             rb'|not found)\s*$')
#: Why the ranks of different hosts may not reach each other once started, and what
#: to look at (the launcher's line: ``launch/postmortem.py``; ``train/restarts.py``).
REACH_EACH_OTHER = ('the ranks of different hosts must reach each other over TCP, on any port '
                    '(a firewall between the hosts, or an interface they do not share: --iface; '
                    'docs/multinode.md)')


def probe(host, agent=None, timeout=PROBE_TIMEOUT_S, command=('true',)):
    """None when ``AGENT HOST COMMAND`` (default ``true``) succeeds, else why not (the
    agent's last words)."""
    agent = agent or os.environ.get(AGENT_VAR) or 'ssh'
    cmd = [agent] + (['-o', 'BatchMode=yes', '-o', 'ConnectTimeout=%d' % max(1, timeout)]
                     if os.path.basename(agent) == 'ssh' else []) + [host] + list(command)
    shown = '%s %s %s' % (os.path.basename(agent), host, ' '.join(command))
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                             stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return '`%s` did not answer within %g s' % (shown, timeout)
    except OSError as exc:
        return 'cannot run the launcher agent %s: %s' % (agent, exc.strerror or exc)
    if res.returncode == 0:
        return None
    words = (res.stderr.strip() or res.stdout.strip()).splitlines()
    return '`%s` failed with status %d%s' % (shown, res.returncode,
                                             ': ' + words[-1] if words else '')


def unreachable(hosts, agent=None, timeout=PROBE_TIMEOUT_S, command=('true',)):
    """``[(host, why)]`` of the ``hosts`` where ``AGENT HOST COMMAND`` fails (default:
    that the launcher agent cannot reach), all asked at once."""
    with ThreadPoolExecutor(max_workers=min(16, max(1, len(hosts)))) as pool:
        whys = list(pool.map(lambda h: probe(h, agent, timeout, command), hosts))
    return [(h, w) for h, w in zip(hosts, whys) if w]


def cannot_start(bad):
    """The words for ``[(host, why)]`` that could not be reached."""
    return 'cannot start the job on %s' % '; '.join('host %s (%s)' % b for b in bad)


def not_started(what):
    """The launcher's line for a job that started no rank because of ``what``."""
    return '%s; no rank was started (exit status %d)' % (what, EXIT_BAD_INPUT)


class Unreachable(BadInput):
    """A host of the job cannot be reached (status 2); the message names it."""


def check_hosts(hosts, agent=None, environ=None):
    """Before a launch: raise :class:`Unreachable` naming each of ``hosts`` (names)
    that is not this one and that the launcher agent cannot reach; all are asked
    at once, each within :data:`PROBE_TIMEOUT_S` (or ``$THEANOMPI_EXT_REACH_TIMEOUT_S``)."""
    from .host_routes import route_to
    env = os.environ if environ is None else environ
    agent = agent or env.get(AGENT_VAR)
    if not agent and any(env.get(v) for v in SCHEDULER_VARS):
        return
    others = [h for h in dict.fromkeys(hosts) if not route_to(h).local]
    if not others:
        return
    timeout = float(env.get(TIMEOUT_VAR) or PROBE_TIMEOUT_S)
    bad = unreachable(others, agent, timeout)
    if bad:
        raise Unreachable(not_started(cannot_start(bad)))


def check_hostfile(hostfile, agent=None, environ=None):
    """:func:`check_hosts` of the hosts of ``hostfile`` (nothing without one), after
    reading it (``hostlists.HostfileError``, a :class:`BadInput`, for a file that
    is not there or not a hostfile, or has line ends the mpiexec cannot parse:
    before MPI says it its own way)."""
    if hostfile:
        hosts = hostfile_hosts(hostfile)
        from .mpiexec import find_mpiexec, is_openmpi
        if is_openmpi(find_mpiexec()):
            check_line_ends(hostfile)
        check_hosts(hosts, agent, environ)


class LaunchWatch(object):
    """Fed the job's output lines: whether mpiexec said it could not start a proxy,
    and which host could not call back, if one said so."""

    def __init__(self):
        self.failed = False
        self.no_callback = None      # (host, address, why)
        self.no_report = None        # Open MPI: [host, daemon status or None]
        self.lost = False            # Open MPI: a daemon lost during the run, said
        self.lost_host = None        # ... and the host its banner named
        self.missing = None          # a program's path a shell did not find

    @property
    def daemon_ended(self):
        """Open MPI: ``[host, its status or None]`` of a daemon that ended, from either
        of PRRTE's banners (:data:`DAEMON_FAILED`, :data:`DAEMON_LOST`), or None."""
        if self.no_report and self.no_report[0]:
            return self.no_report
        return [self.lost_host, None] if self.lost_host else None

    def feed(self, line):
        """Look at one line (bytes) of mpiexec's output."""
        if DAEMON_LOST in line:
            self.lost = True
            return
        node = DAEMON_NODE.match(line) if self.lost and self.lost_host is None else None
        if node:
            self.lost_host = node.group(1).decode('utf-8', 'replace')
        if DAEMON_FAILED in line:
            self.failed = True
            if self.no_report is None:
                self.no_report = [None, None]
            return
        if self.no_report is not None:
            # the first banner's lines name its host and status; later ones are kept out
            host, status = DAEMON_HOST.match(line), DAEMON_STATUS.match(line)
            if host and self.no_report[0] is None:
                self.no_report[0] = host.group(1).decode('utf-8', 'replace')
            elif status and self.no_report[1] is None:
                self.no_report[1] = int(status.group(1))
        missing = MISSING_PROGRAM.search(line)
        if missing and self.missing is None:
            self.missing = missing.group(1).decode('utf-8', 'replace')
        m = LAUNCH_FAILED.search(line)
        if m:
            self.failed = True
            if m.group(1) and self.no_callback is None:
                self.no_callback = tuple((g or b'').decode('utf-8', 'replace')
                                         for g in m.group(1, 2, 3))


def proxy_program(mpiexec):
    """The program hydra's ``mpiexec`` starts on each host by its own path
    (``hydra_pmi_proxy`` beside it), if it is there; None otherwise (another MPI).
    Beside ``mpiexec``, beside the file it links to, or (a wrapper script that
    runs this environment's MPI) beside this Python."""
    for folder in (os.path.dirname(mpiexec), os.path.dirname(os.path.realpath(mpiexec)),
                   os.path.dirname(sys.executable)):
        path = os.path.join(folder, 'hydra_pmi_proxy')
        if os.access(path, os.X_OK):
            return path
    return None


def explain_launch(watch, hostfile, agent=None, expected=None):
    """The message naming the host(s) mpiexec could not start on, or None.

    ``expected``: the program mpiexec starts on each host (:func:`proxy_program`),
    asked for when no shell's line named the missing one: hydra may end the
    launch before the far shell's words arrive (measured: 3 failures in 12)."""
    if watch.no_callback:
        host, address, why = watch.no_callback
        return ('host %s could not reach the launcher\'s host at %s%s: choose the interface '
                'the hosts share (train --iface, docs/multinode.md) or open the firewall'
                % (host, address, ' (%s)' % why if why else ''))
    if watch.no_report and watch.no_report[0]:
        return daemon_did_not_report(*watch.no_report)
    if not watch.failed:
        return None
    hosts = hostfile_hosts(hostfile) if hostfile and os.path.exists(hostfile) else []
    bad = unreachable(hosts, agent) if hosts else []
    if bad:
        return cannot_start(bad)
    program = watch.missing or expected
    if hosts and program:
        lacking = [h for h, _ in unreachable(hosts, agent, command=('test', '-x', program))]
        if lacking:
            return ('%s %s no %s (the MPI launcher\'s program, started there by the '
                    'launcher\'s own path): install the same MPI on every host on the same '
                    'path, or share the folder (docs/multinode.md)' % (
                        'host' if len(lacking) == 1 else 'hosts', ', '.join(lacking)
                        + (' has' if len(lacking) == 1 else ' have'), program))
    return ('mpiexec could not start its proxies on every host%s, and each answers '
            '`%s HOST true`: see mpiexec\'s lines above' % (
                ' (%s)' % ', '.join(hosts) if hosts else '',
                os.path.basename(agent or os.environ.get(AGENT_VAR) or 'ssh')))


def with_daemon_lost(message, no_report):
    """``message`` (the launcher's line on a job whose ranks had started) told with
    the Open MPI daemon that ended during the run: ``no_report`` is
    :attr:`LaunchWatch.daemon_ended`: the spawn banner, which PRRTE also prints
    when a daemon it started (its agent's child) ends mid-run, or its banner of
    a daemon it lost communication with; prterun may then exit 0 (measured,
    Open MPI 5.0.11: every process of an emulated host SIGKILLed, or its daemon
    alone; `Daemon exit status: 0`). Unchanged without a host."""
    if not no_report or not no_report[0]:
        return message
    host, status = no_report
    head = 'theanompi-ext: '
    rest = message[len(head):] if message.startswith(head) else message
    return ('%shost %s: Open MPI\'s daemon (prted) ended during the run%s: the host, the '
            'daemon or the launcher\'s connection to it was lost; %s'
            % (head, host, '' if status is None else ' (its exit status %d)' % status, rest))


def daemon_did_not_report(host, status):
    """The words for Open MPI's daemon on ``host`` that did not call back (``status``:
    its exit status, None when the banner had none)."""
    if status == NOT_FOUND_STATUS:
        return ('host %s could not start Open MPI\'s daemon (prted; exit status %d, not '
                'found): install the same Open MPI on every host, on the same path or on '
                'the PATH of a non-interactive shell there (docs/multinode.md)' % (host, status))
    return ('host %s: Open MPI\'s daemon (prted) did not report back to the launcher%s: '
            'it could not reach the launcher\'s host (choose the interface the hosts share: '
            'train --iface, docs/multinode.md; or open the firewall), or could not start '
            'there (the same Open MPI on every host)'
            % (host, '' if status is None else ' (its exit status %d)' % status))
