"""``bench compare`` on emulated hosts and its statistics, and the emulated hosts'
settings refused by name (no root, no MPI: fast)."""
import re
import subprocess
import sys

import pytest

from support.paths import ROOT
from theanompi_ext.bench import compare, compare_stats, compare_verdicts
from theanompi_ext.errors import EXIT_BAD_INPUT
from theanompi_ext.launch.emulated_hosts import DEFAULT_QUEUE, EmulatedHosts
from theanompi_ext.launch.emulated_network import (format_network, hosts_layout, hosts_links,
                                                   hosts_queue, parse_network, tc_time)


def test_hosts_network_setting_parses():
    net = parse_network('hosts:2x2:200mbit')
    assert net == ('hosts', '2x2:200mbit') and format_network(net) == 'hosts:2x2:200mbit'
    assert hosts_layout(net) == (2, 2, '200mbit')
    assert hosts_layout(parse_network('hosts:4x1:1gbit')) == (4, 1, '1gbit')
    for bad in ('hosts:2x2', 'hosts:0x2:200mbit', 'hosts:2:200mbit', 'hosts:2x2:fast'):
        with pytest.raises(ValueError):
            parse_network(bad)


def test_hosts_network_setting_with_a_queue():
    net = parse_network('hosts:2x2:200mbit:50ms')
    assert format_network(net) == 'hosts:2x2:200mbit:50ms'
    assert hosts_layout(net) == (2, 2, '200mbit') and hosts_queue(net) == '50ms'
    assert hosts_queue(parse_network('hosts:2x2:200mbit')) is None
    for bad in ('hosts:2x2:200mbit:0ms', 'hosts:2x2:200mbit:50'):
        with pytest.raises(ValueError, match='queue of network'):
            parse_network(bad)
    with pytest.raises(ValueError, match="'fast' is neither a queue"):
        parse_network('hosts:2x2:200mbit:fast')


def test_hosts_network_setting_with_loss_and_frames():
    """--network takes what `bench hosts --loss --per-frame` takes, in any order
    after RATE (emulated_hosts.run_on_hosts passes them to EmulatedHosts)."""
    plain = {'queue': None, 'loss': 0.0, 'per_frame': False}
    assert hosts_links(parse_network('hosts:2x2:200mbit')) == plain
    for text, links in [
            ('hosts:2x2:200mbit:loss=1%', dict(plain, loss=0.01)),
            ('hosts:2x2:200mbit:loss=0.05:per-frame', dict(plain, loss=0.05, per_frame=True)),
            ('hosts:4x1:1gbit:per-frame:50ms', dict(plain, queue='50ms', per_frame=True)),
            ('hosts:2x2:200mbit:1s:loss=2.5%', dict(plain, queue='1s', loss=0.025))]:
        net = parse_network(text)
        assert hosts_links(net) == pytest.approx(links) and format_network(net) == text
        assert hosts_layout(net)[2] in ('200mbit', '1gbit')
        assert hosts_queue(net) == links['queue']
    for bad, words in [
            ('hosts:2x2:200mbit:loss=2', "write 2% for 2 percent"),
            ('hosts:2x2:200mbit:loss=100%', 'below 1'),
            ('hosts:2x2:200mbit:loss=', 'not a fraction'),
            ('hosts:2x2:200mbit:loss=1%:loss=2%', 'its loss is given twice'),
            ('hosts:2x2:200mbit:50ms:1s', 'its queue is given twice'),
            ('hosts:2x2:200mbit:per-frame:per-frame', 'its per-frame is given twice'),
            ('hosts:2x2:200mbit:perframe', "'perframe' is neither a queue"),
            ('hosts:2x2:200mbit::50ms', 'unknown network')]:
        with pytest.raises(ValueError, match=re.escape(words)):
            parse_network(bad)


def test_a_hosts_setting_makes_the_hosts_it_names(monkeypatch):
    """run_on_hosts (every benchmark's --network hosts:...) builds EmulatedHosts with
    the setting's layout, rate, queue, loss and frames, and runs the job on them."""
    from theanompi_ext.launch import emulated_hosts, mpiexec
    made, ran = [], []

    class Hosts(object):
        hostfile, mpiexec = '/tmp/hosts', 'mpiexec-on-hosts'

        def __init__(self, *args, **kw):
            made.append((args, kw))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def env(self, env):
            return dict(env, ON_HOSTS='1')

    monkeypatch.setattr(emulated_hosts, 'EmulatedHosts', Hosts)
    monkeypatch.setattr(mpiexec, 'popen_job', lambda cmd, env: ran.append((cmd, env)) or 'job')
    monkeypatch.setattr(mpiexec, 'wait_job', lambda job, timeout: 0 if job == 'job' else 1)
    for text, kw in [
            ('hosts:2x2:200mbit', dict(queue=DEFAULT_QUEUE, loss=None, per_frame=False)),
            ('hosts:4x1:1gbit:loss=1%:per-frame:50ms', dict(queue='50ms', loss=0.01,
                                                            per_frame=True))]:
        del made[:], ran[:]
        assert emulated_hosts.run_on_hosts(['python', 'x.py'], parse_network(text),
                                           {'A': 'b'}) == 0
        h, r, rate = hosts_layout(parse_network(text))
        assert made == [((h, r, rate), kw)]
        (cmd, env), = ran
        assert cmd[0] == 'mpiexec-on-hosts' and cmd[-2:] == ['python', 'x.py']
        assert env == {'A': 'b', 'ON_HOSTS': '1'}


def test_tc_times_and_the_emulated_hosts_settings_refused_by_name():
    assert [tc_time(t, 'x') for t in ('50ms', '1s', '1.5s', '250us', '2sec')] == \
        pytest.approx([0.05, 1.0, 1.5, 250e-6, 2.0])
    for bad in ('0ms', '50', '-1s', '50 parsecs', '1.2.3s'):
        with pytest.raises(ValueError, match="--queue '"):
            tc_time(bad, '--queue')
    # before anything is made, so without root too
    with pytest.raises(ValueError, match="queue 'fast'"):
        EmulatedHosts(2, 2, '200mbit', queue='fast')
    with pytest.raises(ValueError, match="delay '5 ms'"):
        EmulatedHosts(2, 2, '200mbit', delay='5 ms')
    assert tc_time(DEFAULT_QUEUE, 'q') >= 0.5        # lossless at 2 x 2 here from 0.5 s


@pytest.mark.parametrize('argv', [
    ['-m', 'theanompi_ext.launch.emulated_hosts', '--queue', 'fast', '--', 'true'],
    ['-m', 'theanompi_ext.cli', 'bench', 'hosts', '--queue', 'fast'],
    ['-m', 'theanompi_ext.cli', 'bench', 'hosts', '--delay', '5'],
])
def test_a_bad_queue_or_delay_on_the_command_line(argv):
    res = subprocess.run([sys.executable] + argv, capture_output=True, text=True, timeout=60,
                         cwd=ROOT)
    assert res.returncode == EXIT_BAD_INPUT, res.stdout + res.stderr
    flag = argv[argv.index('--queue') if '--queue' in argv else argv.index('--delay')]
    assert "%s '" % flag in res.stderr and 'tc units' in res.stderr, res.stderr


def test_ddp_rendezvous_on_the_first_host():
    env = compare.ddp_rendezvous(parse_network('hosts:2x2:200mbit'))
    assert env['MASTER_ADDR'] == '10.77.0.1' and env['GLOO_SOCKET_IFNAME'] == 'eth0'
    assert compare.ddp_rendezvous(parse_network('tbf:200mbit')) == {}


def _job(compute, step, serial, allreduce=None):
    """A 2-rank job result whose ranks took the same times."""
    job = dict(compute=[compute, compute], overlap=[step, step], serial=[serial, serial],
               full=[step, step])
    job['allreduce'] = [allreduce or compute, allreduce or compute]
    return job


def test_launch_fractions_by_hand_and_the_minimum_cost():
    # launch 1: cost 0.2 of compute, 0.15 saved: 0.75; launch 2: 0.2, 0.05 saved: 0.25
    a = _job([1.0, 1.0, 1.0], [1.05, 1.05, 1.05], [1.2, 1.2, 1.2])
    b = _job([1.0, 1.0, 1.0], [1.15, 1.15, 1.15], [1.2, 1.2, 1.2])
    # launch 3: the exchange costs 3% of compute (< MIN_COST): no fraction
    c = _job([1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [1.03, 1.03, 1.03])
    got = compare_stats.launch_fractions([a, b, c], 'overlap', 'serial')
    assert got[:2] == [pytest.approx(0.75), pytest.approx(0.25)] and got[2] is None
    assert compare_stats.MIN_COST == 0.05
    assert compare_stats.cost_measurable(0.06, 0.01)
    assert not compare_stats.cost_measurable(0.04, 0.0)       # under 5% of compute
    assert not compare_stats.cost_measurable(0.3, 0.2)        # under twice its error


def test_rows_carry_launches_bound_and_load():
    cpu = {'compute': [0.5, 0.7], 'overlap': [1.2, 1.4], 'serial': [0.9, 0.9]}
    ours = [dict(_job([1.0, 1.0], [1.05, 1.05], [1.2, 1.2], [0.2, 0.2]),
                 compute_chunked=[[1.0], [1.0]], grad_bytes=8, params=2, buckets=1,
                 chunks=2, ranks=2, cpu_per_wall=cpu)] * 2
    ddp = [dict(_job([0.5, 0.5], [0.6, 0.6], [0.7, 0.7], [0.25, 0.25]), grad_bytes=8,
                params=2, torch='x')]
    rows = compare_stats.summarize('m', 'hosts:2x2:200mbit', dict(batch=8, threads=1),
                                   ours, {25.0: ddp})
    by = {r['system']: r for r in rows}
    ov, dd = by['theanompi_ext/ar-overlap'], by['pytorch/ddp-gloo']
    assert ov['hidden_fraction_launches'] == [pytest.approx(0.75)] * 2
    assert dd['hidden_fraction_launches'] == [pytest.approx(0.5)]
    # the step against max(compute, allreduce): 1.05 / 1.0 and 0.6 / 0.5
    assert ov['bound_excess'] == pytest.approx(0.05)
    assert dd['bound_excess'] == pytest.approx(0.2)
    for r in rows:
        r.update(load_before=3.5, load_after=4.25, launches=2, reps=2, steps=1)
    text = compare_verdicts.format_table(rows)
    assert 'load average 3.50 before, 4.25 after' in text
    assert '0.75 +- 0.00 0.75 0.75' in text and '+20.0%' in text
    # CPU per wall: the median over jobs and ranks (DDP's older jobs have none)
    assert ov['cpu_per_wall'] == dict(compute=pytest.approx(0.6), step=pytest.approx(1.3),
                                      serial=pytest.approx(0.9))
    assert dd['cpu_per_wall'] == {} and '1.30 (0.60)' in text


def test_cpu_per_wall_of_each_rank():
    from theanompi_ext.bench.compare_rank import cpu_per_wall
    got = cpu_per_wall([{'a': [1.0, 2.0]}, {'a': [3.0, 2.0]}])
    assert got == {'a': [0.5, 1.5]}
