"""``bench hosts``: its bounds and tables by hand, and one short run on emulated hosts (root)."""
import re
import subprocess
import sys

import pytest

from support.hosts import skip_without_hosts
from support.paths import ROOT
from theanompi_ext.bench.hosts import bounds, format_table, predictions


def test_bounds_by_hand():
    # 4 MiB over 25 MB/s: 2 hosts send it once (0.1678 s), a ring of 4 ranks 1.5 times
    two, ring = bounds(4 << 20, 2, 2, 25e6)
    assert two == pytest.approx(4194304 / 25e6) and ring == pytest.approx(1.5 * 4194304 / 25e6)
    assert bounds(4 << 20, 2, 2, 25e6, 'bfloat16')[0] == pytest.approx(two / 2)
    assert bounds(1 << 20, 4, 1, 25e6)[0] == pytest.approx(1.5 * 1048576 / 25e6)


def _result():
    row = dict(bytes=4 << 20, intra=0.004, flat=0.185, rsag=0.180, leader=0.190, started=0.176)
    return dict(hosts=2, ranks_per_host=2, rate='200mbit', delay=None, rate_Bps=25e6,
                mpi='MPICH', reps=3, methods=['flat', 'rsag', 'leader', 'started'],
                wire_dtype='float32', alpha_s=2e-5, rows=[row])


def test_predictions_and_table():
    res = _result()
    pred = predictions(res, res['rows'][0])
    link = 4194304 / (25e6 * 1448 / 1514.0)           # the bytes at TCP's payload rate
    # rsag, one piece: two reduce-scatters within the host (0.002 s each) + the link
    assert pred['rsag'] == pytest.approx(0.004 + 2 * 2e-5 + link)
    assert pred['flat'] == pred['rsag']
    # 4 pieces: one piece's reduce-scatter and allgather left outside the link
    assert pred['started'] == pytest.approx(0.001 + 2 * 2e-5 + link)
    assert pred['leader'] == pytest.approx(0.008 + 2 * 2e-5 + link)
    text = format_table(res)
    assert '4 MB' in text and 'within 1.10 x bound from 1 MB: met' in text
    assert 'lost each way' not in text
    assert '200mbit links, 50ms queue, 0.5% lost each way (MPICH)' in format_table(
        dict(res, loss=0.005))
    assert 'sim/meas' in text and '(within 10%: all)' in text


def test_predictions_with_the_hosts_cpu_by_hand():
    """The run's calibration: 2 cores on the machine, so each of 2 emulated hosts has
    one for its 2 ranks; 1 ns per byte to sum, to copy and for TCP."""
    res = _result()
    res['cpu'] = dict(cores=2, sum_s_per_byte=1e-9, copy_s_per_byte=1e-9, tcp_s_per_byte=1e-9)
    n = 4 << 20
    link = 2 * 2e-5 + n / (25e6 * 1448 / 1514.0)
    # each rank sums (copies) N/2 within the host, both on one core: 4.19 ms, slower
    # than the 2 ms measured; each sums half its N/2 shard between the hosts: 2.10 ms
    host = 2 * 0.5 * n * 1e-9
    sums = 2 * 0.25 * n * 1e-9
    pred = predictions(res, res['rows'][0])
    assert pred['rsag'] == pytest.approx(host + link + sums + host)
    assert pred['flat'] == pred['rsag']
    # 4 pieces of 1 MiB: one piece's phases and sums outside the link
    assert pred['started'] == pytest.approx((2 * host + sums) / 4 + link)
    # leader: the local ranks 0 alone sum half of N between the hosts, on one core
    assert pred['leader'] == pytest.approx(0.008 + link + 0.5 * n * 1e-9)
    bare = predictions(res, res['rows'][0], cpu=None)
    assert bare['rsag'] == pytest.approx(0.004 + link)
    text = format_table(res)
    assert 'host CPU (measured here, this process alone): 1 cores per host' in text
    line = [x for x in text.splitlines() if ' rsag ' in x and '4 MB' in x][-1]
    assert line.split()[4] == '%.1f' % (1e3 * (2 * host + sums - 0.004))   # cpu ms


def test_local_cpu_costs_are_small_and_positive():
    from theanompi_ext.bench.hosts import local_cpu_costs
    c = local_cpu_costs(1 << 20, reps=2)
    # any machine sums, copies and moves a byte through loopback TCP in 0.001-100 ns
    for k in ('sum_s_per_byte', 'copy_s_per_byte', 'tcp_s_per_byte'):
        assert 1e-12 < c[k] < 1e-7, (k, c[k])


@pytest.mark.root
def test_a_short_run_on_emulated_hosts():
    skip_without_hosts()
    res = subprocess.run([sys.executable, '-m', 'theanompi_ext.cli', 'bench', 'hosts',
                          '--sizes', '256K', '--reps', '1', '--rate', '1gbit', '--loss', '1%'],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    assert 'allreduce on 2 emulated hosts x 2 ranks, 1gbit links, 1s queue, 1% lost each ' \
        'way' in res.stdout
    assert '256 KB' in res.stdout and 'sim/meas' in res.stdout
    assert 'host CPU (measured here, this process alone): 1 cores per host' in res.stdout
    # the links' counters, read from each host's namespace after the run
    assert 'links during the run' in res.stdout and 'tmxh1: ' in res.stdout
    # thousands of frames crossed each link: 1% of them lost (none is about e**-20)
    for host in ('tmxh0', 'tmxh1'):
        lost = re.search(host + r': \d+ tbf drops, (\d+) lost', res.stdout)
        assert lost and int(lost.group(1)) > 0, res.stdout


def test_timeouts_in_the_prediction_table():
    from theanompi_ext.launch.emulated_hosts import tcp_counters
    res = _result()
    row = res['rows'][0]
    link = 4194304 / (25e6 * 1448 / 1514.0)
    sim = 0.001 + 2 * 2e-5 + link                      # 'started', as above
    # three blocks of 'started': one took a retransmission timeout (200 ms more)
    row.update(started=sim, started_all=[sim, sim + 0.2, sim], started_timeouts=[0, 1, 0])
    for m in ('flat', 'rsag', 'leader'):
        row[m + '_all'], row[m + '_timeouts'] = [row[m]] * 3, [0] * 3
    text = format_table(res)
    line = [x for x in text.splitlines() if 'started' in x and '4 MB' in x][-1]
    assert line.split()[-2:] == ['1', '1.000']        # one RTO; sim + RTO = each block
    assert 'with the RTOs: all' in text
    snmp = ('Tcp: RtoMin RetransSegs\nTcp: 200 7\n'
            'TcpExt: TCPTimeouts TCPLossProbes\nTcpExt: 3 5\n')
    assert tcp_counters(snmp) == dict(RtoMin=200, RetransSegs=7, TCPTimeouts=3,
                                      TCPLossProbes=5)
