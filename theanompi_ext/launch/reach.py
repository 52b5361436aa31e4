"""Which host a job could not start on, when mpiexec could not start its proxies.

Hydra's own words for it are ``Launch proxy failed.`` and a stack of its
function names, without the host (measured, MPICH 5.0.2: its launcher's
message is often lost as mpiexec exits within 15 ms). So after such a
failure the launcher asks each host of the hostfile itself, with the agent
hydra used (``ssh``, or :data:`AGENT_VAR`'s program: the emulated hosts'
wrapper), in parallel and bounded; a proxy that started but could not call
back (``unable to connect from "HOST" to "ADDRESS"``) names its host too.
"""
import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor

#: The program hydra starts its proxies with (``-launcher-exec``); default ssh.
AGENT_VAR = 'THEANOMPI_EXT_LAUNCH_AGENT'
#: Seconds one host gets to answer ``AGENT HOST true``.
PROBE_TIMEOUT_S = 10.0
#: Hydra's lines when a proxy could not be started, or could not call back.
LAUNCH_FAILED = re.compile(rb'Launch proxy failed|unable to connect from "([^"]+)" to "([^"]+)"'
                           rb'(?: \(([^)]*)\))?')


def hostfile_hosts(path):
    """The host names of a hostfile, MPICH's (``host:n``) or Open MPI's
    (``host slots=n``), in order, once each; comments and blank lines skipped."""
    hosts = []
    with open(path) as fh:
        for line in fh:
            words = line.split('#', 1)[0].split()
            if not words:
                continue
            name = words[0].split(':', 1)[0]
            if name not in hosts:
                hosts.append(name)
    return hosts


def probe(host, agent=None, timeout=PROBE_TIMEOUT_S):
    """None when ``AGENT HOST true`` succeeds, else why not (the agent's last words)."""
    agent = agent or os.environ.get(AGENT_VAR) or 'ssh'
    cmd = [agent] + (['-o', 'BatchMode=yes', '-o', 'ConnectTimeout=%d' % timeout]
                     if os.path.basename(agent) == 'ssh' else []) + [host, 'true']
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                             stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return '`%s %s true` did not answer within %g s' % (agent, host, timeout)
    except OSError as exc:
        return 'cannot run the launcher agent %s: %s' % (agent, exc.strerror or exc)
    if res.returncode == 0:
        return None
    words = (res.stderr.strip() or res.stdout.strip()).splitlines()
    return '`%s %s true` failed with status %d%s' % (
        os.path.basename(agent), host, res.returncode, ': ' + words[-1] if words else '')


def unreachable(hosts, agent=None):
    """``[(host, why)]`` of the ``hosts`` that the launcher agent cannot reach."""
    with ThreadPoolExecutor(max_workers=min(16, max(1, len(hosts)))) as pool:
        whys = list(pool.map(lambda h: probe(h, agent), hosts))
    return [(h, w) for h, w in zip(hosts, whys) if w]


class LaunchWatch(object):
    """Fed the job's output lines: whether mpiexec said it could not start a proxy,
    and which host could not call back, if one said so."""

    def __init__(self):
        self.failed = False
        self.no_callback = None      # (host, address, why)

    def feed(self, line):
        """Look at one line (bytes) of mpiexec's output."""
        m = LAUNCH_FAILED.search(line)
        if m:
            self.failed = True
            if m.group(1) and self.no_callback is None:
                self.no_callback = tuple((g or b'').decode('utf-8', 'replace')
                                         for g in m.group(1, 2, 3))


def explain_launch(watch, hostfile, agent=None):
    """The message naming the host(s) mpiexec could not start on, or None."""
    if watch.no_callback:
        host, address, why = watch.no_callback
        return ('host %s could not reach the launcher\'s host at %s%s: choose the interface '
                'the hosts share (train --iface, docs/multinode.md) or open the firewall'
                % (host, address, ' (%s)' % why if why else ''))
    if not watch.failed:
        return None
    hosts = hostfile_hosts(hostfile) if hostfile and os.path.exists(hostfile) else []
    bad = unreachable(hosts, agent) if hosts else []
    if bad:
        return 'cannot start the job on %s' % '; '.join('host %s (%s)' % b for b in bad)
    return ('mpiexec could not start its proxies on every host%s, and each answers '
            '`ssh HOST true`: see mpiexec\'s lines above' % (
                ' (%s)' % ', '.join(hosts) if hosts else ''))
