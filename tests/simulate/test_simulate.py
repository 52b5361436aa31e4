"""The scaling simulator: cost formulas, pipeline arithmetic, presets, CLI."""
import argparse
import json
import math
import re

import pytest

from theanompi_ext.simulate import cli as sim_cli
from theanompi_ext.simulate.model import (Layer, Workload, load_workload, make_messages,
                                          scaling, step_time)
from theanompi_ext.simulate.network import (Network, chain_reduce, rhd_allreduce,
                                            ring_allreduce)
from theanompi_ext.simulate.presets import (alexnet_layers, get_preset, resnet50_layers,
                                            vgg16_layers)

approx = pytest.approx


# ---------------------------------------------------------------- formulas

def test_ring_formula():
    # 2(p-1) alpha + 2(p-1)/p N/bw with p=4, N=1 MB, 1 GB/s, 10 us
    assert ring_allreduce(1e6, 4, 1e-5, 1e9) == approx(6e-5 + 1.5e-3)
    assert ring_allreduce(1e6, 1, 1e-5, 1e9) == 0.0


def test_rhd_power_of_two_and_binary_blocks():
    a, bw, n = 1e-5, 1e9, 1e6
    assert rhd_allreduce(n, 8, a, bw) == approx(6 * a + 2 * 7 / 8 * n / bw)
    # 3 = 2 + 1: halving among 2, the lone rank folds in and gets it back
    assert rhd_allreduce(n, 3, a, bw) == approx(2 * a + n / bw + 2 * (a + n / bw))
    # 6 = 4 + 2: the 2-block hands over N/2-byte segments
    assert rhd_allreduce(n, 6, a, bw) == approx(4 * a + 1.5 * n / bw + 2 * (a + n / 2 / bw))


def test_hierarchical_is_reduce_inter_bcast():
    net = Network(algorithm='hierarchical', alpha=2e-5, bandwidth=1e9,
                  intra_alpha=1e-6, intra_bandwidth=1e10, gpus_per_node=8)
    n = 4e6
    intra = 7 * 1e-6 + n / 1e10
    assert chain_reduce(n, 8, 1e-6, 1e10) == approx(intra)
    assert net.allreduce(n, 8) == approx(2 * intra)                   # one server
    assert net.allreduce(n, 16) == approx(2 * intra + 2 * 2e-5 + n / 1e9)
    assert net.allreduce(n, 64) == approx(2 * intra + rhd_allreduce(n, 8, 2e-5, 1e9))
    assert net.allreduce(n, 1) == 0.0


def test_two_level_by_hand():
    """2 hosts x 2 ranks, N = 4 MB, 25 MB/s between hosts (200 Mbit/s), 1 GB/s within:
    reduce-scatter 1 a_i + N/2/1e9; two shard allreduces of N/2 at 12.5 MB/s each,
    2 a + N/2/12.5e6 (rhd on 2 hosts); allgather as the reduce-scatter."""
    from theanompi_ext.simulate.network import two_level_allreduce, tcp_payload_share
    n, a, ai = 4e6, 1e-4, 5e-6
    intra = ai + 2e6 / 1e9                      # 0.002005 s
    inter = 2 * a + 2e6 / 12.5e6                # 0.1602 s: N/bw, each host's bytes once
    want = 2 * intra + inter                    # 0.16421 s
    assert want == approx(0.16421)
    assert two_level_allreduce(n, 2, 2, a, 25e6, ai, 1e9) == approx(want)
    # four pieces whose phases overlap: one piece's reduce-scatter and allgather left
    assert two_level_allreduce(n, 2, 2, a, 25e6, ai, 1e9, pieces=4) == approx(
        2 * (ai + 0.5e6 / 1e9) + inter)
    net = Network(algorithm='two-level', alpha=a, bandwidth=25e6, intra_alpha=ai,
                  intra_bandwidth=1e9, gpus_per_node=2)
    assert net.allreduce(n, 4) == approx(want)
    assert net.allreduce(n, 2) == approx(2 * intra)          # one host: nothing crosses
    # 4 hosts x 1 rank: plain rhd among the hosts, 2 log2(4) a + 1.5 N/bw
    assert two_level_allreduce(n, 4, 1, a, 25e6, ai, 1e9) == approx(4 * a + 1.5 * n / 25e6)
    assert tcp_payload_share(1500) == approx(1448 / 1514.0)


def test_flat_algorithms_pick_the_link():
    net = Network(algorithm='ring', alpha=1e-5, bandwidth=1e9,
                  intra_alpha=1e-6, intra_bandwidth=1e10, gpus_per_node=4)
    assert net.allreduce(1e6, 4) == approx(ring_allreduce(1e6, 4, 1e-6, 1e10))
    assert net.allreduce(1e6, 8) == approx(ring_allreduce(1e6, 8, 1e-5, 1e9))


# ------------------------------------------------------------ step model

def _net(alpha=0.0, bw=1e6):
    # Ring between 2 single-GPU nodes: an allreduce of N bytes costs
    # 2 alpha + N/bw, so the arithmetic below is easy to follow.
    return Network(algorithm='ring', alpha=alpha, bandwidth=bw, intra_alpha=alpha,
                   intra_bandwidth=bw, gpus_per_node=1)


def _wl(g1=20000, g2=5000, t1=2):
    # Output layer first: 10 ms then 30 ms of backward; forward 20 ms.
    return Workload([Layer('out', 0.010, g1, t1), Layer('in', 0.030, g2)], 0.020)


def test_one_bucket_waits_for_backward():
    r = step_time(_wl(), _net(), 2, overlap=True, bucket_cap_bytes=float('inf'))
    # ready at 40 ms, 25 kB at 1 MB/s = 25 ms
    assert len(r.messages) == 1
    assert r.step_s == approx(0.020 + 0.040 + 0.025)
    assert r.exposed_comm_s == approx(0.025)


def test_two_buckets_overlap_backward():
    r = step_time(_wl(), _net(), 2, overlap=True, bucket_cap_bytes=10000)
    # bucket 1: ready 10 ms, 20 ms -> ends 30; bucket 2: ready 40, 5 ms -> 45
    assert [m.nbytes for m in r.messages] == [20000, 5000]
    assert r.step_s == approx(0.020 + 0.045)
    assert r.comm_s == approx(0.025)


def test_bucket_waits_for_previous_transfer():
    r = step_time(_wl(g1=50000), _net(), 2, overlap=True, bucket_cap_bytes=10000)
    # bucket 1 ends at 10 + 50 = 60 ms; bucket 2, ready at 40, starts at 60
    assert r.step_s == approx(0.020 + 0.065)


def test_fully_hidden_comm_costs_nothing():
    r = step_time(_wl(g1=1000, g2=0), _net(), 2, overlap=True, bucket_cap_bytes=1)
    assert r.step_s == approx(0.060)
    assert r.efficiency == approx(1.0)


def test_latency_bound_serial_and_overlap():
    net = _net(alpha=1e-3, bw=1e15)           # each allreduce costs 2 ms
    s = step_time(_wl(), net, 2, overlap=False)
    assert s.allreduces == 3                   # 'out' has two tensors
    assert s.step_s == approx(0.060 + 0.006)
    o = step_time(_wl(), net, 2, overlap=True)  # unbucketed: per tensor
    # out's two tensors: 10 -> 14 ms; in's: 40 -> 42 ms
    assert o.step_s == approx(0.020 + 0.042)
    assert s.efficiency == approx(0.060 / 0.066)


def test_bandwidth_bound_serial_and_barrier():
    s = step_time(_wl(), _net(), 2, overlap=False)
    assert s.step_s == approx(0.060 + 0.025)
    b = step_time(_wl(), _net(alpha=1e-3), 2, overlap=False, barrier=True)
    # 3 allreduces at 2 ms latency each, 25 ms of bytes, a 2 ms barrier
    assert b.step_s == approx(0.060 + 0.006 + 0.025 + 0.002)


def test_layers_without_gradient_add_time_only():
    wl = Workload([Layer('pool', 0.005, 0), Layer('conv', 0.010, 1000)], 0.0)
    msgs = make_messages(wl, None)
    assert len(msgs) == 1 and msgs[0].ready_s == approx(0.015)


def test_scaling_is_relative_to_baseline():
    rows = scaling(_wl(), _net(), [1, 2], bucket_cap_bytes=float('inf'), baseline_k=1)
    assert rows[0]['overlap_rel'] == approx(1.0)
    assert rows[1]['overlap_rel'] == approx(0.060 / 0.085)
    assert rows[1]['serial_rel'] == approx(0.060 / 0.085)


# --------------------------------------------------------------- presets

def test_architectures_parameter_counts():
    r50 = resnet50_layers()
    assert len(r50) == 54 and sum(s[1] for s in r50) == 25557032   # 53 conv + fc
    assert sum(s[1] for s in vgg16_layers()) == 138357544
    assert sum(s[1] for s in alexnet_layers()) == 60965224


def test_goyal2017_preset_reproduces_90_percent():
    p = get_preset('goyal2017')
    assert p.workload.grad_bytes == approx(102.2e6, rel=0.01)
    assert p.workload.backward_s == approx(0.120)
    rows = scaling(p.workload, p.network, [8, 256], p.bucket_mb * 2 ** 20, 8)
    assert abs(rows[-1]['overlap_rel'] - 0.90) < 0.05
    # Theano-MPI's serial exchange on the same cluster scales clearly worse.
    assert rows[-1]['serial_rel'] < rows[-1]['overlap_rel'] - 0.1


@pytest.mark.parametrize('name, comm, tol', [('theano-mpi', 5.41, 0.2),
                                             ('theano-mpi-alexnet', 0.60, 0.05)])
def test_theano_mpi_comm_per_5120_images(name, comm, tol):
    p = get_preset(name)
    r = step_time(p.workload, p.network, 8, overlap=False)
    steps = 5120 / (8 * p.workload.per_worker_batch)
    assert abs(r.comm_s * steps - comm) < tol


def test_unknown_preset():
    with pytest.raises(ValueError, match='nope'):
        get_preset('nope')


# ------------------------------------------------------------------- CLI

def _run(argv, capsys):
    parser = argparse.ArgumentParser(prog='theanompi-ext')
    sim_cli.register(parser.add_subparsers())
    args = parser.parse_args(['simulate'] + argv)
    status = args.func(args)
    out, err = capsys.readouterr()
    return status, out, err


def test_cli_goyal_last_line_is_the_efficiency(capsys):
    status, out, _ = _run(['--preset', 'goyal2017', '--gpus', '256'], capsys)
    assert status == 0
    lines = out.strip().splitlines()
    assert abs(float(lines[-1]) - 0.90) < 0.05
    assert 'relative to 8 GPUs' in out


def test_cli_no_overlap_reports_serial(capsys):
    _, out, _ = _run(['--preset', 'goyal2017', '--gpus', '256', '--no-overlap'], capsys)
    assert float(out.strip().splitlines()[-1]) < 0.8


def test_cli_json_and_plot(tmp_path, capsys):
    jpath, ppath = tmp_path / 'r.json', tmp_path / 'r.png'
    status, out, _ = _run(['--preset', 'theano-mpi', '--json', str(jpath),
                           '--plot', str(ppath)], capsys)
    assert status == 0
    doc = json.loads(jpath.read_text())
    assert [r['gpus'] for r in doc['rows']] == [1, 2, 4, 8]
    assert doc['mode'] == 'serial'
    assert doc['efficiency'] == approx(float(out.strip().splitlines()[-1]), abs=5e-4)
    assert all(math.isfinite(r['serial']['step_s']) for r in doc['rows'])
    assert ppath.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    assert '5.41' in out


def test_cli_layers_file(tmp_path, capsys):
    f = tmp_path / 'layers.json'
    f.write_text(json.dumps([{'name': 'fc', 'backward_s': 0.01, 'grad_bytes': 4e6},
                             {'name': 'conv', 'backward_s': 0.02, 'grad_bytes': 1e6}]))
    status, out, _ = _run(['--layers', str(f), '--forward-ms', '15', '--gpus', '16',
                           '--algorithm', 'ring'], capsys)
    assert status == 0 and 0 < float(out.strip().splitlines()[-1]) <= 1


def _trace(steps):
    """A timeline trace: rank 0's and rank 1's steps of forward + two chunks (us)."""
    ev, t = [], 0.0
    for pid in (1, 0):
        for i, (fwd, c0, c1) in enumerate(steps):
            ev.append({'name': 'step %d' % i, 'ph': 'X', 'pid': pid, 'tid': 0, 'ts': t,
                       'dur': fwd + c0 + c1 + 10, 'args': {}})
            ev.append({'name': 'forward', 'ph': 'X', 'pid': pid, 'tid': 0, 'ts': t,
                       'dur': fwd, 'args': {}})
            ev.append({'name': 'backward:fc', 'ph': 'X', 'pid': pid, 'tid': 0, 'ts': t + fwd,
                       'dur': c0, 'args': {'grad_bytes': 40, 'tensors': 2}})
            ev.append({'name': 'backward:conv1..conv2', 'ph': 'X', 'pid': pid, 'tid': 0,
                       'ts': t + fwd + c0, 'dur': c1, 'args': {'grad_bytes': 4000, 'tensors': 4}})
            ev.append({'name': 'bucket0', 'ph': 'X', 'pid': pid, 'tid': 1, 'ts': t + fwd,
                       'dur': 5, 'args': {'bytes': 4040}})
            t += 10000.0
    return {'traceEvents': ev, 'displayTimeUnit': 'ms', 'otherData': {}}


def test_layers_from_a_training_timeline(tmp_path, capsys):
    from theanompi_ext.simulate.trace import layers_from_trace
    # First step (compilation, first touch) left out; medians of the rest.
    doc = layers_from_trace(_trace([(900, 900, 900), (100, 10, 200), (120, 30, 260),
                                    (110, 20, 220)]), source='t')
    assert doc['forward_s'] == pytest.approx(110e-6)
    assert doc['layers'] == [
        {'name': 'fc', 'backward_s': pytest.approx(20e-6), 'grad_bytes': 40, 'tensors': 2},
        {'name': 'conv1..conv2', 'backward_s': pytest.approx(220e-6), 'grad_bytes': 4000,
         'tensors': 4}]
    assert doc['name'] == 't (rank 0, median of 3 step(s))'
    one = layers_from_trace(_trace([(100, 10, 200)]), source='t', rank=1)
    assert one['layers'][1]['backward_s'] == pytest.approx(200e-6)
    f = tmp_path / 'tl.json'
    f.write_text(json.dumps(_trace([(900, 900, 900), (100, 10, 200)])))
    wl = load_workload(str(f))
    assert [l.name for l in wl.layers] == ['fc', 'conv1..conv2']
    assert wl.forward_s == pytest.approx(100e-6) and wl.grad_bytes == 4040 and wl.tensors == 6
    status, out, _ = _run(['--layers', str(f), '--gpus', '2', '--algorithm', 'ring'], capsys)
    assert status == 0 and 'timeline' in out and '2 layers, 6 tensors' in out


def test_timeline_without_chunks_refused(tmp_path, capsys):
    serial = _trace([(100, 10, 200)])
    for e in serial['traceEvents']:
        if e['name'].startswith('backward:'):
            e['name'] = 'forward_backward'
    f = tmp_path / 'serial.json'
    f.write_text(json.dumps(serial))
    with pytest.raises(ValueError, match='no backward chunks for rank 0.*ar-overlap'):
        load_workload(str(f))
    status, _, err = _run(['--layers', str(f)], capsys)
    assert status == 2 and 'no backward chunks' in err
    old = _trace([(100, 10, 200)])
    for e in old['traceEvents']:
        e['args'].pop('grad_bytes', None)
    f.write_text(json.dumps(old))
    with pytest.raises(ValueError, match="'backward:fc' carries no grad_bytes"):
        load_workload(str(f))
    f.write_text(json.dumps({'traceEvents': {}}))
    with pytest.raises(ValueError, match='traceEvents must be a list'):
        load_workload(str(f))


@pytest.mark.parametrize('argv, needle', [
    (['--bandwidth-gbit', '-5'], '-5'),
    (['--intra-bandwidth-gbit', '0'], 'intra-bandwidth'),
    (['--gpus', '12', '--algorithm', 'hierarchical', '--gpus-per-node', '8'], '12'),
    (['--gpus', '8,abc'], 'abc'),
    (['--bucket-mb', '-1'], 'bucket'),
])
def test_cli_bad_inputs_exit_2(argv, needle, capsys):
    status, out, err = _run(['--preset', 'goyal2017'] + argv, capsys)
    assert status == 2
    assert err.startswith('theanompi-ext simulate: error:') and needle in err


@pytest.mark.parametrize('content, needle', [
    ('{not json', 'not valid JSON'),
    ('[]', 'empty'),
    ('[{"name": "a", "backward_s": 0.1}]', 'grad_bytes'),
    ('[{"name": "a", "backward_s": -1, "grad_bytes": 4}]', '-1'),
    ('[{"name": "a", "backward_s": 0.1, "grad_bytes": 4, "tensors": 0}]', 'tensors'),
])
def test_malformed_layers_file(tmp_path, capsys, content, needle):
    f = tmp_path / 'bad.json'
    f.write_text(content)
    with pytest.raises(ValueError, match=needle):
        load_workload(str(f))
    status, _, err = _run(['--layers', str(f)], capsys)
    assert status == 2 and 'error' in err


def test_library_rejects_bad_network():
    with pytest.raises(ValueError, match='bandwidth'):
        Network(bandwidth=-1.0)
    with pytest.raises(ValueError, match='algorithm'):
        Network(algorithm='tree')
    with pytest.raises(ValueError, match='k=12'):
        step_time(_wl(), Network(gpus_per_node=8), 12)


# ------------------------------------ terms for a measured host (bench validate)

def test_cpu_share_and_contended_time_by_hand():
    from theanompi_ext.simulate.host import contended, cpu_share, step_cpu_seconds
    assert cpu_share(2, 2) == 1.0                    # one core each
    assert cpu_share(8, 2) == approx(0.25)           # 8 ranks on 2 cores
    assert cpu_share(4, 2, outside=4) == approx(0.25)   # + 4 threads of other jobs
    assert contended(1e-3, 0.25) == approx(4e-3)
    # calibration: 14 ms for 4 steps, 6 ms of it on the link, at share 0.5
    assert step_cpu_seconds(14e-3, 0.5, 4, other_s=6e-3) == approx(1e-3)
    assert step_cpu_seconds(1e-3, 0.5, 4, other_s=6e-3) == 0.0
    for bad in (0, 1.5, float('nan')):
        with pytest.raises(ValueError, match='CPU share'):
            contended(1.0, bad)
    with pytest.raises(ValueError, match='cores'):
        cpu_share(2, 0)


def test_latency_steps_and_the_asa_algorithm():
    ring = Network('ring', 1e-3, 1e9, 1e-3, 1e9, 1)
    assert ring.latency_steps(8) == approx(14)
    assert Network('rhd', 1e-3, 1e9, 1e-3, 1e9, 1).latency_steps(8) == approx(6)
    asa = Network('asa', 1e-3, 1e9, 1e-3, 1e9, 1)
    # one alltoall latency + ceil(log2 k) of the recursive-doubling allgather
    assert [asa.latency_steps(k) for k in (2, 3, 4, 8)] == [2, 3, 3, 4]
    assert asa.allreduce(1e6, 4) == approx(3e-3 + 2 * 3 / 4 * 1e6 / 1e9)


def _three_layers():
    return Workload([Layer('a', 1e-3, 100.0), Layer('pool', 1e-3, 0.0),
                     Layer('b', 2e-3, 300.0, tensors=2)], forward_s=0.0)


def test_a_given_bucket_plan_by_hand():
    from theanompi_ext.simulate.model import planned_messages
    wl = _three_layers()
    m = planned_messages(wl, [100, 300])
    assert [(x.ready_s, x.nbytes, x.layers) for x in m] == [
        (approx(1e-3), 100, ('a',)), (approx(4e-3), 300, ('pool', 'b'))]
    assert [x.ready_s for x in make_messages(wl, buckets=[400])] == [approx(4e-3)]
    with pytest.raises(ValueError, match='buckets hold 300 bytes, the layers 400'):
        planned_messages(wl, [100, 200])
    with pytest.raises(ValueError, match='> 0 bytes'):
        planned_messages(wl, [0, 400])


def test_casts_and_the_statistics_collective_by_hand():
    wl = _three_layers()
    net = Network('ring', 0.0, 1e5, 0.0, 1e5, 1)       # 2 ranks: b bytes take b/1e5 s
    # buckets 100 B (1 ms) ready at 1 ms, 300 B (3 ms) at 4 ms; casts 1e-5 s/B
    # add 1 ms and 3 ms. Serial: 4 + 2 + 6 + sync 0.5 ms.
    s = step_time(wl, net, 2, overlap=False, buckets=[100, 300], cast_s_per_byte=1e-5,
                  sync_s=5e-4)
    assert s.comm_s == approx(8e-3) and s.step_s == approx(12.5e-3)
    # Overlapped: bucket 0 runs 1..3 ms, bucket 1 4..10 ms; the sync runs beside
    # it (10 ms) or queues behind it (10.5 ms).
    o = step_time(wl, net, 2, buckets=[100, 300], cast_s_per_byte=1e-5, sync_s=5e-4)
    assert o.step_s == approx(10e-3)
    q = step_time(wl, net, 2, buckets=[100, 300], cast_s_per_byte=1e-5, sync_s=5e-4,
                  sync_queued=True)
    assert q.step_s == approx(10.5e-3)
    # without the new terms (the presets' defaults): bucket 1 runs 4..7 ms
    assert step_time(wl, net, 2, buckets=[100, 300]).step_s == approx(7e-3)


def test_slowest_rank_gaps_and_buckets_of_a_timeline():
    from theanompi_ext.simulate.trace import bucket_bytes, layers_from_trace, piece_seconds
    # rank 1 slower in step 1, rank 0 in step 2 (us); a 10 us gap before conv1..conv2
    tr = _trace([(900, 900, 900), (100, 10, 200), (100, 10, 200)])
    for e in tr['traceEvents']:
        if e['name'] == 'backward:conv1..conv2':
            e['ts'] += 10
            slow = (e['pid'] == 1) == (int(e['ts'] // 10000) % 3 == 1)
            e['dur'] = 300 if slow else 200
    doc = layers_from_trace(tr, source='t', rank='slowest', gaps=True)
    # per step the slower rank: forward 100, fc 10, conv 10 + 300; whole 420 us
    assert [l['backward_s'] for l in doc['layers']] == [approx(10e-6), approx(310e-6)]
    assert doc['forward_s'] == approx(100e-6) and 'rank slowest' in doc['name']
    plain = layers_from_trace(tr, source='t')
    assert plain['layers'][1]['backward_s'] == approx(250e-6)     # rank 0: 200, 300
    assert piece_seconds(tr, 'forward', rank='slowest') == approx(100e-6)
    for e in tr['traceEvents']:
        if e['name'].startswith('bucket'):
            e['args']['step'] = int(e['ts'] // 10000) % 3
    assert bucket_bytes(tr) == [4040.0]
    with pytest.raises(ValueError, match="no 'update' pieces"):
        piece_seconds(tr, 'update')


def test_host_cores_serialise_the_ranks_work_by_hand():
    from theanompi_ext.simulate.host import (HostCPU, emulated_cores_per_host,
                                             machine_cores, serialised)
    import os
    assert serialised(1e-3, 2, 8) == approx(1e-3)       # a core each: side by side
    assert serialised(1e-3, 4, 2) == approx(2e-3)       # 4 ms of work on 2 cores
    assert serialised(1e-3, 1, 0.5) == approx(2e-3)     # half a core
    assert emulated_cores_per_host(2, 2) == 1.0 and emulated_cores_per_host(4, 2) == 0.5
    assert machine_cores() == os.cpu_count() and HostCPU().cores == os.cpu_count()
    # 2 ranks on a host of 1 core, 1 ns to sum a byte, 0.5 to copy, 2 for TCP; N = 8 MB
    cpu = HostCPU(cores=1, sum_s_per_byte=1e-9, copy_s_per_byte=0.5e-9, tcp_s_per_byte=2e-9)
    n = 8e6
    assert cpu.host_reduce(n, 2) == approx(2 * 4e6 * 1e-9)      # each sums N/2: 8 ms
    assert cpu.host_copy(n, 2) == approx(2 * 4e6 * 0.5e-9)      # each copies N/2: 4 ms
    # 2 hosts: each rank sums half its 4 MB shard, both on the one core
    assert cpu.cross_reduce(n, 2, 2) == approx(2 * 2e6 * 1e-9)  # 4 ms
    # ... and sends 4 MB (its shard's halves, out and back) at 2 ns a byte (both ends'
    # kernel work, as the loopback calibration counts it): 8 ms per rank, both on 1 core
    assert cpu.cross_tcp(n, 2, 2) == approx(2 * 4e6 * 2e-9)     # 16 ms
    for bad in (dict(cores=0), dict(sum_s_per_byte=-1.0), dict(tcp_s_per_byte=float('inf'))):
        with pytest.raises(ValueError):
            HostCPU(**bad)
    with pytest.raises(ValueError, match='CPU time'):
        serialised(-1.0, 2, 2)


def test_two_level_with_the_hosts_cpu_by_hand():
    """2 hosts x 2 ranks, N = 8 MB, 25 MB/s between hosts, 1 GB/s within, no latency;
    the host's CPU as above (1 core: sum 8 ms, copy 4 ms, sums across 4 ms, TCP 16 ms)."""
    from theanompi_ext.simulate.host import HostCPU
    from theanompi_ext.simulate.network import two_level_allreduce
    n, bw = 8e6, 25e6
    cpu = HostCPU(cores=1, sum_s_per_byte=1e-9, copy_s_per_byte=0.5e-9, tcp_s_per_byte=2e-9)
    link = n / bw                                     # 0.32 s: N/2 at bw/2
    # within the host 1 GB/s gives 4 ms per phase: the reduce-scatter's sums (8 ms)
    # are slower, the allgather's copies (4 ms) not; the link (320 ms) beats TCP's 16
    want = 0.008 + link + 0.004 + 0.004
    assert two_level_allreduce(n, 2, 2, 0.0, bw, 0.0, 1e9, cpu=cpu) == approx(want)
    assert two_level_allreduce(n, 2, 2, 0.0, bw, 0.0, 1e9) == approx(0.004 + link + 0.004)
    # 4 pieces: one piece's phases (2 + 1 ms) and one piece's sums across (1 ms) outside
    assert two_level_allreduce(n, 2, 2, 0.0, bw, 0.0, 1e9, pieces=4, cpu=cpu) == approx(
        0.002 + 0.001 + link + 0.001)
    # a link fast enough that the host's CPU is the bottleneck: 10 GB/s, the link 1.6 ms;
    # in pieces all the CPU work (8 + 4 + 4 + TCP's 16 ms) shares the one core
    assert two_level_allreduce(n, 2, 2, 0.0, 10e9, 0.0, 1e9, pieces=4, cpu=cpu) == approx(
        0.003 + 0.032)
    # ... in one piece the link phase is TCP's 16 ms
    assert two_level_allreduce(n, 2, 2, 0.0, 10e9, 0.0, 1e9, cpu=cpu) == approx(
        0.008 + 0.016 + 0.004 + 0.004)
    # two cores per host: nothing waits for another rank
    two = HostCPU(cores=2, sum_s_per_byte=1e-9, copy_s_per_byte=0.5e-9)
    assert two_level_allreduce(n, 2, 2, 0.0, bw, 0.0, 1e9, cpu=two) == approx(
        0.004 + link + 0.002 + 0.004)
    net = Network(algorithm='two-level', alpha=0.0, bandwidth=bw, intra_alpha=0.0,
                  intra_bandwidth=1e9, gpus_per_node=2, cpu=cpu)
    assert net.allreduce(n, 4) == approx(want)


def test_two_level_16mb_with_timeouts_by_hand():
    """2 hosts x 2 ranks, 16 MiB, 200 Mbit/s shaped at 1448/1514 of payload, 31 us
    between hosts, the host's reduce-scatter 8 ms, 16 pieces: the link's 16 MiB
    (0.7017 s, and 62 us of latency) plus one piece's reduce-scatter and allgather; each TCP
    retransmission timeout on the way adds Linux's least RTO, 200 ms."""
    from theanompi_ext.simulate.network import (TCP_RTO_MIN, two_level_allreduce,
                                                with_timeouts)
    n = 16 << 20
    bw = 25e6 * 1448 / 1514.0                   # 23.91 MB/s of payload
    link = 2 * 31e-6 + n / bw                   # rhd of N/2 at bw/2 between 2 hosts
    assert link == approx(0.70174, abs=1e-5)
    ibw = 0.5 * n / 0.008                       # a reduce-scatter of N in 8 ms
    piece = 2 * 0.5 * (n / 16) / ibw            # 1 ms: one piece in, one out
    t = two_level_allreduce(n, 2, 2, 31e-6, 25e6 * 1448 / 1514.0, 0.0, ibw, pieces=16)
    assert t == approx(piece + link) and t == approx(0.70274, abs=1e-5)
    assert TCP_RTO_MIN == 0.2
    assert with_timeouts(t, 0) == t and with_timeouts(t, 2) == approx(t + 0.4)
    with pytest.raises(ValueError):
        with_timeouts(t, -1)


def test_cli_host_cpu_bounds_the_two_level_phases(tmp_path, capsys):
    """--cores-per-host/--cpu-ns-per-byte: by hand, 8 MB on 2 servers x 2 ranks, links
    too fast to matter, 1 ns per byte of each kind. One core: reduce-scatter 2 ranks x
    4 MB summed = 8 ms, allgather the same in copies, TCP 2 ranks x 4 MB = 8 ms (longer
    than the link's 64 us), the sums between hosts 2 x 2 MB = 4 ms: 28 ms. Two cores
    halve each: 14 ms."""
    f = tmp_path / 'layers.json'
    f.write_text(json.dumps([{'name': 'fc', 'backward_s': 0.01, 'grad_bytes': 8e6}]))
    base = ['--layers', str(f), '--forward-ms', '5', '--gpus', '4', '--gpus-per-node', '2',
            '--algorithm', 'two-level', '--bandwidth-gbit', '1000', '--intra-bandwidth-gbit',
            '10000', '--latency-us', '0', '--intra-latency-us', '0', '--baseline-gpus', '1']
    for cores, comm_ms in (('1', 28.0), ('2', 14.0)):
        jpath = tmp_path / ('c%s.json' % cores)
        status, out, _ = _run(base + ['--cores-per-host', cores, '--cpu-ns-per-byte', '1,1,1',
                                      '--json', str(jpath)], capsys)
        doc = json.loads(jpath.read_text())
        row = [r for r in doc['rows'] if r['gpus'] == 4][0]
        assert status == 0 and row['overlap']['comm_s'] == approx(comm_ms / 1e3, rel=1e-6)
        assert doc['host_cpu'] == {'cores': float(cores), 'sum_s_per_byte': 1e-9,
                                   'copy_s_per_byte': 1e-9, 'tcp_s_per_byte': 1e-9,
                                   'from': 'given'}
        assert 'host CPU: %s cores per server' % cores in out
    # without the CPU model the links alone: 2 x 3.2 us in the host + 64 us between
    jpath = tmp_path / 'links.json'
    _run(base + ['--json', str(jpath)], capsys)
    doc = json.loads(jpath.read_text())
    assert doc['host_cpu'] is None
    assert doc['rows'][-1]['overlap']['comm_s'] == approx(70.4e-6, rel=1e-6)
    # cores alone: the per-byte costs are measured here, each > 0
    status, out, _ = _run(base + ['--cores-per-host', '2'], capsys)
    assert status == 0 and '(measured on this machine)' in out
    assert not re.search(r'(sum|copy|TCP) 0 ns', out), out


@pytest.mark.parametrize('extra, words', [
    (['--cores-per-host', '2', '--algorithm', 'ring'], 'apply to --algorithm two-level only'),
    (['--cpu-ns-per-byte', '1,1', '--algorithm', 'two-level'], 'is not three numbers'),
    (['--cpu-ns-per-byte', '1,x,1', '--algorithm', 'two-level'], "COPY='x' is not a number"),
    (['--cpu-ns-per-byte', '1,1,-1', '--algorithm', 'two-level'], 'TCP must be a finite'),
    (['--cores-per-host', '0', '--cpu-ns-per-byte', '1,1,1', '--algorithm', 'two-level'],
     '--cores-per-host must be a finite number > 0'),
])
def test_cli_host_cpu_bad_input(capsys, extra, words):
    status, _, err = _run(['--preset', 'goyal2017', '--gpus', '16'] + extra, capsys)
    assert status == 2 and words in err, err
