"""Emulated hosts (launch/emulated_hosts.py): 2 hosts x 2 ranks on one machine.

Ranks are placed per host (hostname, shared-memory communicator, local rank),
the data of an allreduce crosses the link between hosts, ``train --hostfile``
across the hosts gives the parameters of 4 ranks on one host, and nothing is
left afterwards: after a normal exit, an exception, or the owner SIGKILLed.
Root only (network namespaces).
"""
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from support.hosts import TCP_BULK, python_on
from support.installs import another_install
from support.paths import ROOT, root_on_path
from support.procs import alive
from theanompi_ext.launch.emulated_hosts import (DEFAULT_QUEUE, PREFIX, EmulatedHosts,
                                                 cleanup_stale, hosts_problem)
from theanompi_ext.launch.emulated_network import NetworkSetupError, namespaces
from theanompi_ext.launch.mpiexec import find_mpiexec

pytestmark = pytest.mark.root

ALLREDUCE_BYTES = 4 << 20
REPEATS = 2
RATE, RATE_BYTES_S = '40mbit', 40e6 / 8

PROBE = r'''
import json, os, socket, sys, time
import numpy as np
from mpi4py import MPI
w = MPI.COMM_WORLD
node = w.Split_type(MPI.COMM_TYPE_SHARED)
a = np.full(int(sys.argv[1]) // 4, w.rank + 1, np.float32)
b = np.empty_like(a)
w.Barrier()
t0 = time.perf_counter()
for _ in range(int(sys.argv[2])):
    w.Allreduce(a, b)
secs = time.perf_counter() - t0
with open(os.path.join(sys.argv[3], 'rank%d.json' % w.rank), 'w') as f:
    json.dump(dict(rank=w.rank, size=w.size, host=socket.gethostname(), node=node.size,
                   local=os.environ.get('MPI_LOCALRANKID'), sum=float(b[0]), secs=secs), f)
'''


@pytest.fixture(autouse=True)
def _can_make_hosts():
    why = hosts_problem()
    if why:
        pytest.skip(why)


def ours():
    """The namespaces any EmulatedHosts made that still exist."""
    return [ns for ns in namespaces() if ns.startswith(PREFIX)]


def test_ranks_placed_per_host_and_data_crosses_the_link(tmp_path):
    probe = tmp_path / 'probe.py'
    probe.write_text(PROBE)
    with EmulatedHosts(hosts=2, ranks_per_host=2, rate=RATE) as eh:
        assert open(eh.hostfile).read() == 'tmxh0:2\ntmxh1:2\n'
        before = eh.link_bytes(0)
        res = subprocess.run([eh.mpiexec, '-n', '4', '-f', eh.hostfile, sys.executable,
                              str(probe), str(ALLREDUCE_BYTES), str(REPEATS), str(tmp_path)],
                             capture_output=True, text=True, timeout=120)
        after = eh.link_bytes(0)
        assert res.returncode == 0, res.stdout + res.stderr
        # the launcher's probe passes straight through the wrapper
        version = subprocess.run([eh.mpiexec, '--version'], capture_output=True, text=True,
                                 timeout=30)
        assert 'HYDRA' in version.stdout
    ranks = [json.loads((tmp_path / ('rank%d.json' % r)).read_text()) for r in range(4)]
    assert [r['size'] for r in ranks] == [4] * 4
    assert [(r['host'], r['local'], r['node']) for r in ranks] == [
        ('tmxh0', '0', 2), ('tmxh0', '1', 2), ('tmxh1', '0', 2), ('tmxh1', '1', 2)]
    assert all(r['sum'] == 10.0 for r in ranks)
    # host 0 must learn host 1's half of every sum and hand its own over: at least
    # the buffer's size each way per allreduce (measured: about 1.0x each way)
    into, out_of = after[0] - before[0], after[1] - before[1]
    assert min(into, out_of) >= REPEATS * ALLREDUCE_BYTES, (into, out_of)
    # ... through the tbf: no faster than the rate allows (a burst of 256 kB aside)
    bound = REPEATS * ALLREDUCE_BYTES / RATE_BYTES_S
    assert min(r['secs'] for r in ranks) >= 0.9 * bound, (ranks, bound)


PLACE = r'''
import json, os, socket, sys
from mpi4py import MPI
from theanompi_ext.collective.world import local_rank
w = MPI.COMM_WORLD
with open(os.path.join(sys.argv[1], 'rank%d.json' % w.rank), 'w') as f:
    json.dump([socket.gethostname(), local_rank(w)], f)
'''


def test_devices_place_each_rank_on_its_entrys_host(tmp_path):
    """Theano-MPI's DEVICES with a host that comes back after another (node0, node1,
    node0): rank r runs on the r-th entry's host, with both MPIs. Open MPI merged the
    host's entries and filled it first (rank 1 on tmxh0, measured); with one --host
    entry per rank and --map-by seq it places rank by rank, local ranks counted per
    host. Hydra starts a proxy per run of entries: each run is a node to MPI, so
    rank 2's local rank is 0 there (the session launcher warns)."""
    from theanompi_ext.engine.devices import parse_devices
    from theanompi_ext.launch.devices import host_args, remote_hosts, split_hosts
    from theanompi_ext.launch.mpiexec import child_env, mpiexec_command
    probe = tmp_path / 'place.py'
    probe.write_text(PLACE)
    hosts = remote_hosts(parse_devices(['tmxh0:cpu0', 'tmxh1:cpu0', 'tmxh0:cpu1']))
    assert hosts == [('tmxh0', 1), ('tmxh1', 1), ('tmxh0', 1)] and split_hosts(hosts) == ['tmxh0']
    with EmulatedHosts(hosts=2, ranks_per_host=2) as eh:
        cmd = mpiexec_command(3, [sys.executable, str(probe), str(tmp_path)], mpiexec=eh.mpiexec,
                              extra=host_args(hosts, eh.mpiexec), hosts=['tmxh0', 'tmxh1'])
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                             env=eh.env(root_on_path(child_env())))
    assert res.returncode == 0, res.stdout + res.stderr
    got = [tuple(json.loads((tmp_path / ('rank%d.json' % r)).read_text())) for r in range(3)]
    assert got == [('tmxh0', 0), ('tmxh1', 0), ('tmxh0', 0 if not eh.openmpi else 1)], got


def test_the_command_line(tmp_path):
    """``python -m ...emulated_hosts -- CMD``: CMD sees the hostfile and the mpiexec."""
    script = ('cat "$TMX_HOSTFILE"; "$THEANOMPI_EXT_MPIEXEC" -n 2 -f "$TMX_HOSTFILE" '
              'hostname | sort')
    tool = subprocess.Popen([sys.executable, '-m', 'theanompi_ext.launch.emulated_hosts',
                             '--hosts', '2', '--ranks', '1', '--', 'sh', '-c', script],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    out, err = tool.communicate(timeout=60)
    assert tool.returncode == 0, out + err
    assert out.split() == ['tmxh0:1', 'tmxh1:1', 'tmxh0', 'tmxh1']
    # its own namespaces gone (other processes' may exist meanwhile)
    assert 'tmxh0=10.77.0.1' in err and not [
        ns for ns in ours() if ns.startswith('%s%d-' % (PREFIX, tool.pid))]


CHOICE = ('import sys\n'
          'from theanompi_ext.launch.network_choice import network_rows\n'
          'from theanompi_ext.launch.mpiexec import network_args\n'
          'rows = dict(network_rows(sys.argv[1], sys.argv[2]))\n'
          'print(rows["interface"]); print(rows["topology"])\n'
          'print(network_args(sys.argv[1], ["10.77.0.1", "10.77.0.2"]))\n')


def test_cut_and_restore_a_link(tmp_path):
    """A cut link drops the packets between hosts; restored, they flow again. And the
    default interface rule (launch/network_default.py) on a real route: from host 0 and
    from the hub, a hostfile of the hosts' addresses picks the device they are reached by."""
    hostfile = tmp_path / 'hosts'
    hostfile.write_text('10.77.0.1:2\n10.77.0.2:2\n')
    connect = ('import socket, sys\n'
               'try:\n'
               '    socket.create_connection((sys.argv[1], 9), timeout=1.0)\n'
               'except ConnectionRefusedError: print("reached")\n'
               'except OSError as e: print("unreached", e)\n')
    with EmulatedHosts(hosts=2, ranks_per_host=1) as eh:
        def probe():
            return subprocess.run(['ip', 'netns', 'exec', eh.namespace(0), sys.executable,
                                   '-c', connect, eh.address(1)], capture_output=True,
                                  text=True, timeout=30).stdout.strip()
        assert probe() == 'reached'              # a refused port: the host answered

        def choice(ns):
            env = dict(os.environ, PYTHONPATH=ROOT, THEANOMPI_EXT_IFACE='', HYDRA_IFACE='')
            res = subprocess.run(['ip', 'netns', 'exec', ns, sys.executable, '-c', CHOICE,
                                  eh.real_mpiexec or find_mpiexec(), str(hostfile)],
                                 capture_output=True, text=True, timeout=60, env=env)
            assert res.returncode == 0, res.stderr
            return res.stdout.splitlines()
        # host 0 is 10.77.0.1 itself (a local address: this host), reaches 10.77.0.2 by eth0
        iface, topology, args = choice(eh.namespace(0))
        assert iface.startswith('eth0: this host reaches 10.77.0.2 (10.77.0.2), the first '
                                'other host of the hostfile, by eth0'), iface
        assert topology.startswith('auto picks two-level: 2 hosts'), topology
        assert args == "['-iface', 'eth0']", args
        # the hub (a login node) reaches both over its bridge
        assert choice(eh.hub)[0].startswith('br0: this host reaches 10.77.0.1')
        eh.cut('tmxh1')
        assert probe().startswith('unreached')
        eh.restore('tmxh1')
        time.sleep(0.2)
        assert probe() == 'reached'

        # a link slowed and then unshaped mid-run: tbf on both of its ends, then none
        def qdiscs():
            return [subprocess.run(['ip', 'netns', 'exec', ns, 'tc', 'qdisc', 'show', 'dev',
                                    dev], capture_output=True, text=True).stdout
                    for ns, dev in ((eh.hub, eh.link(1)), (eh.namespace(1), 'eth0'))]
        assert not any('tbf' in q for q in qdiscs())
        eh.set_rate('tmxh1', '1mbit')
        assert all(re.search(r'tbf .*rate 1Mbit', q) for q in qdiscs()), qdiscs()
        eh.set_rate(1, '2mbit')
        assert all(re.search(r'tbf .*rate 2Mbit', q) for q in qdiscs()), qdiscs()
        with pytest.raises(ValueError):
            eh.set_rate('tmxh1', 'fast')
        eh.set_rate('tmxh1', None)
        assert not any('tbf' in q for q in qdiscs()), qdiscs()
        assert probe() == 'reached'


TRAIN = ['train', '--workers', '4', '--model', 'digits_cnn', '--epochs', '1', '--warmup',
         'none', '--batch-per-worker', '16', '--base-lr', '0.05', '--ref-batch', '64',
         '--max-steps', '4']


def _train(out, env, *extra):
    # 4 ranks on this machine's 2 cores: ranks that wait yield the core to the
    # ones still starting (the same setting on both runs; MPICH's and Open MPI's)
    env = dict(env, MPIR_CVAR_ENABLE_HEAVY_YIELD='1', OMPI_MCA_mpi_yield_when_idle='1')
    res = subprocess.run([sys.executable, '-m', 'theanompi_ext.cli'] + TRAIN +
                         ['--out', str(out)] + list(extra), capture_output=True, text=True,
                         timeout=400, cwd=ROOT, env=env)
    assert res.returncode == 0, res.stdout + res.stderr[-4000:]
    return np.load(os.path.join(str(out), 'params.npz')), res.stdout


def test_train_across_hosts_equals_one_host(tmp_path):
    """2 hosts x 2 ranks (200 Mbit/s between them) with the two-level exchange say
    where each rank runs and train to the same bits as 4 ranks on one host with MPI's
    flat allreduce: the ranks' order and the sums are the same, only where they run
    differs. Bitwise, not to a float32 tolerance: two-level sums ((x0 + x1) + (x2 +
    x3)), the order of MPICH's recursive halving on 4 ranks (measured equal; a
    different flat algorithm could differ by (k-1) 2**-24 sum|x| per sum)."""
    one, _ = _train(tmp_path / 'one', dict(os.environ), '--topology', 'flat')
    with EmulatedHosts(hosts=2, ranks_per_host=2, rate='200mbit') as eh:
        across, text = _train(tmp_path / 'across', eh.env(), '--hostfile', eh.hostfile,
                              '--topology', 'two-level')
    # the first lines say where each rank runs (rank 0 gathers them), before the plan
    lines = text.splitlines()
    assert lines[:4] == ['rank %d of 4: host tmxh%d, local rank %d, device cpu'
                         % (r, r // 2, r % 2) for r in range(4)], text[:2000]
    assert lines[4].startswith('plan:')
    assert sorted(one.files) == sorted(across.files)
    for name in one.files:
        assert np.array_equal(one[name], across[name]), name


def test_out_folder_a_host_does_not_see(tmp_path):
    """The far host does not share the folder of ``--out`` (an empty folder there,
    as on a host without the shared filesystem): every rank stops before training,
    status 2, the message names the rank and host that cannot see it, and the
    folder (on the hosts that share it) keeps only the launcher's lock."""
    shared = tmp_path / 'shared'
    shared.mkdir()
    out = shared / 'run'
    with EmulatedHosts(hosts=2, ranks_per_host=1, unshared={1: [str(shared)]}) as eh:
        res = subprocess.run([sys.executable, '-m', 'theanompi_ext.cli'] + TRAIN +
                             ['--workers', '2', '--out', str(out), '--hostfile', eh.hostfile],
                             capture_output=True, text=True, timeout=300, cwd=ROOT,
                             env=eh.env())
    assert res.returncode == 2, res.stdout + res.stderr[-4000:]
    assert re.search(r'--out %s is not seen by rank 1 on host tmxh1 \(cannot read %s'
                     % (re.escape(str(out)), re.escape(str(out))), res.stderr), \
        res.stderr[-3000:]
    assert 'rank 0 on host' not in res.stderr.split('is not seen by')[-1].split('\n')[0]
    assert not (out / 'params.npz').exists() and not (out / 'summary.json').exists()


def _train_across(eh, tmp_path, *extra, timeout=200):
    """``train`` of 2 ranks on the hosts of ``eh`` (into tmp_path/run): the result."""
    return subprocess.run([sys.executable, '-m', 'theanompi_ext.cli'] + TRAIN +
                          ['--workers', '2', '--out', str(tmp_path / 'run'),
                           '--hostfile', eh.hostfile] + list(extra),
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=eh.env())


def test_far_host_with_another_install(tmp_path):
    """The far host has its own copy of the package, one line apart (a stale or
    edited install): refused before anything is trained, status 2, both copies
    named with their hosts; nothing left on either host."""
    from theanompi_ext.launch.same_software import source_digest
    pkg, copy = another_install(tmp_path)
    with EmulatedHosts(hosts=2, ranks_per_host=1, unshared={1: {pkg: copy}}) as eh:
        res = _train_across(eh, tmp_path)
        left = _left_running(eh)
    assert res.returncode == 2, res.stdout + res.stderr[-4000:]
    assert ('SoftwareMismatch: the ranks do not all run the same software: theanompi_ext '
            '0.1.0, source %s (rank 0 on tmxh0 from %s) vs 0.1.0, source %s (rank 1 on '
            'tmxh1 from %s)' % (source_digest(pkg)[:12], pkg, source_digest(copy)[:12], pkg)
            in res.stderr), res.stderr[-3000:]
    assert not (tmp_path / 'run' / 'params.npz').exists()
    assert not left, left


def test_rank_that_dies_before_mpi_starts_ends_the_job(tmp_path):
    """The far host lacks the package (its folder empty there): its rank dies before
    MPI starts, where hydra leaves the other rank waiting in MPI's start forever.
    The launcher's start watch ends the job after --start-timeout-s (status 4,
    said why), and nothing is left on either host."""
    pkg = os.path.join(ROOT, 'theanompi_ext')
    with EmulatedHosts(hosts=2, ranks_per_host=1, unshared={1: [pkg]}) as eh:
        t0 = time.monotonic()
        res = _train_across(eh, tmp_path, '--start-timeout-s', '10')
        took = time.monotonic() - t0
        left = _left_running(eh)
    assert res.returncode == 4, res.stdout + res.stderr[-4000:]
    assert 'the job did not start within 10 s (start_timeout_s): not every rank joined' \
        in res.stderr, res.stderr[-3000:]
    assert "No module named 'theanompi_ext" in res.stderr     # the rank's own words, passed on
    assert took < 60, took
    assert not left, left


def test_far_host_without_the_mpi(tmp_path):
    """The far host lacks the folder of the MPI's programs (empty there): hydra's proxy
    or Open MPI's daemon is not found on it, and the launcher names the host and the
    missing program (status 2), where MPI's own lines name neither (MPICH) or the host
    alone (Open MPI); nothing is left on either host."""
    folder = os.path.dirname(find_mpiexec())
    if not folder.startswith((sys.prefix, ROOT)):
        pytest.skip('the MPI is the system\'s (%s): hiding its folder on a host would hide '
                    'the shell too' % folder)
    with EmulatedHosts(hosts=2, ranks_per_host=1, unshared={1: [folder]}) as eh:
        res = _train_across(eh, tmp_path)
        left = _left_running(eh)
    last = res.stderr.replace('\0', '').strip().splitlines()[-1]
    assert res.returncode == 2, res.stdout + res.stderr[-4000:]
    assert last.endswith('no rank was started (exit status 2)'), last
    # Open MPI's banner names the host; hydra's lines do not, the shell's the program
    expected = ("theanompi-ext: host tmxh1 could not start Open MPI's daemon (prted; exit "
                "status 127, not found): install the same Open MPI on every host"
                if eh.openmpi else "theanompi-ext: host tmxh1 has no %s (the MPI launcher's "
                "program" % os.path.join(folder, 'hydra_pmi_proxy'))
    assert last.startswith(expected), last
    assert not left, left


def _left_running(eh, limit=10.0):
    """What still runs in the namespaces of ``eh`` after ``limit`` seconds ({} if nothing)."""
    spaces = [eh.hub] + [eh.namespace(h) for h in eh.hosts]
    deadline = time.monotonic() + limit
    while True:
        left = {ns: subprocess.run(['ip', 'netns', 'pids', ns], capture_output=True,
                                   text=True).stdout.split() for ns in spaces}
        left = {ns: p for ns, p in left.items() if p}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def test_check_equivalence_across_hosts(tmp_path):
    """``check-equivalence --hostfile``: 2 ranks on 2 hosts against one process; its
    run folder is made in the current folder (which every host must see)."""
    hostfile = tmp_path / 'hosts'
    hostfile.write_text('tmxh0:1\ntmxh1:1\n')
    with EmulatedHosts(hosts=2, ranks_per_host=1) as eh:
        env = eh.env(root_on_path())
        res = subprocess.run([sys.executable, '-m', 'theanompi_ext.cli', 'check-equivalence',
                              '--workers', '2', '--steps', '3', '--hostfile', str(hostfile)],
                             capture_output=True, text=True, timeout=400, cwd=str(tmp_path),
                             env=env)
    assert res.returncode == 0, res.stdout + res.stderr[-4000:]
    assert 'check-equivalence: PASS' in res.stdout
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith('tmx-equiv-')]


def test_nothing_left_after_exit_or_exception():
    before = ours()
    with EmulatedHosts(hosts=2, ranks_per_host=1) as eh:
        folder, made = eh.folder, ours()
        reaper = eh._reaper.pid
        assert len(made) == 3 and os.path.exists(eh.mpiexec)
        with pytest.raises(NetworkSetupError, match='emulated hosts already'):
            EmulatedHosts(hosts=2).__enter__()       # one set per process, the first intact
        assert ours() == made
    assert ours() == before and not os.path.exists(folder) and not alive(reaper)
    with pytest.raises(RuntimeError):
        with EmulatedHosts(hosts=2, ranks_per_host=1) as eh:
            folder = eh.folder
            sleeper = subprocess.Popen(['ip', 'netns', 'exec', eh.namespace(1), 'sleep', '60'])
            raise RuntimeError('inside')
    sleeper.wait(timeout=10)                      # killed by the cleanup, not left running
    assert sleeper.returncode == -signal.SIGKILL
    assert ours() == before and not os.path.exists(folder)


OWNER = r'''
import subprocess, sys, time
from theanompi_ext.launch.emulated_hosts import EmulatedHosts
eh = EmulatedHosts(hosts=2, ranks_per_host=1).__enter__()
job = subprocess.Popen([eh.mpiexec, '-n', '2', '-f', eh.hostfile, 'sleep', '60'])
print(eh.folder, flush=True)
time.sleep(60)
'''


def test_nothing_left_when_the_owner_is_killed():
    """SIGKILL leaves no time to clean up: the reaper does it (the job's ranks,
    the namespaces, their links), and cleanup_stale finds nothing more."""
    owner = subprocess.Popen([sys.executable, '-c', OWNER], stdout=subprocess.PIPE, text=True,
                             cwd=ROOT, start_new_session=True)
    folder = owner.stdout.readline().strip()
    mine = '%s%d-' % (PREFIX, owner.pid)
    deadline = time.time() + 30
    while time.time() < deadline and len(_sleeps(_pids_in(mine))) < 2:  # both ranks run
        time.sleep(0.1)
    ranks = _pids_in(mine)
    assert len(_sleeps(ranks)) == 2, ranks
    owner.kill()
    owner.wait()
    deadline = time.time() + 20
    while time.time() < deadline and ([ns for ns in ours() if ns.startswith(mine)] or
                                      any(alive(p) for p in ranks)):
        time.sleep(0.1)
    assert not [ns for ns in ours() if ns.startswith(mine)]
    assert not [p for p in ranks if alive(p)]
    assert cleanup_stale() == []
    deadline = time.time() + 10
    while time.time() < deadline and os.path.exists(folder):
        time.sleep(0.1)
    assert not os.path.exists(folder)


def _sleeps(pids):
    names = []
    for p in pids:
        try:
            with open('/proc/%d/comm' % p) as f:
                names.append(f.read().strip())
        except OSError:
            pass
    return [n for n in names if n == 'sleep']


def _pids_in(prefix):
    pids = []
    for ns in namespaces():
        if ns.startswith(prefix):
            out = subprocess.run(['ip', 'netns', 'pids', ns], capture_output=True,
                                 text=True).stdout
            pids += [int(p) for p in out.split()]
    return pids


def test_delay_or_why_not(tmp_path):
    """``delay`` adds its time to a round trip between hosts, or, where the kernel
    has no netem (this machine's), refuses with that reason and leaves nothing."""
    rtt = ('import socket, sys, time\n'
           't = time.perf_counter()\n'
           'try: socket.create_connection((sys.argv[1], 9), timeout=2.0)\n'
           'except ConnectionRefusedError: pass\n'
           'print(time.perf_counter() - t)\n')
    try:
        with EmulatedHosts(hosts=2, ranks_per_host=1, delay='50ms') as eh:
            out = subprocess.run(['ip', 'netns', 'exec', eh.namespace(0), sys.executable, '-c',
                                  rtt, eh.address(1)], capture_output=True, text=True,
                                 timeout=30).stdout
            assert float(out) >= 0.09          # SYN out of host 0, RST out of host 1
    except NetworkSetupError as exc:
        assert 'netem' in str(exc)
    assert not ours()


@pytest.mark.parametrize('queue', [None, '5ms'])
def test_the_links_queue(queue):
    """Two TCP flows of 8 MB each way between 2 hosts at 200 Mbit/s, as an allreduce's:
    with the default queue (lossless: it holds more than the flows' windows) tbf drops
    nothing; with a 5 ms queue (387 kB with the burst) TCP overflows it (measured: 50
    ms dropped 0-49 packets a run, 1 s none). Every byte arrives either way, and the
    queue is the one tc was given."""
    flows, nbytes = '2', str(8 << 20)
    kw = {} if queue is None else dict(queue=queue)
    with EmulatedHosts(hosts=2, ranks_per_host=1, rate='200mbit', **kw) as eh:
        for ns, dev in ((eh.namespace(0), 'eth0'), (eh.hub, eh.link(1))):
            shown = subprocess.run(['ip', 'netns', 'exec', ns, 'tc', 'qdisc', 'show', 'dev',
                                    dev], capture_output=True, text=True).stdout
            assert 'lat %s' % (queue or DEFAULT_QUEUE) in shown, shown
        recv = [subprocess.Popen(python_on(eh, h, TCP_BULK, 'recv', eh.address(h), flows,
                                           nbytes), stdout=subprocess.PIPE, text=True)
                for h in (0, 1)]
        assert [r.stdout.readline().strip() for r in recv] == ['ready', 'ready']
        send = [subprocess.Popen(python_on(eh, h, TCP_BULK, 'send', eh.address(1 - h), flows,
                                           nbytes)) for h in (0, 1)]
        assert [s.wait(timeout=60) for s in send] == [0, 0]
        assert [int(r.communicate(timeout=60)[0]) for r in recv] == [2 * (8 << 20)] * 2
        drops = eh.link_events(0)['drops'] + eh.link_events(1)['drops']
    if queue is None:
        assert drops == 0
    else:
        assert drops > 0
