"""bench validate: the simulator fed measured chunk times and link speed (issue 18)."""
import json
import re
import subprocess
import sys

import pytest

from theanompi_ext.bench.validate import (block_link_seconds, link_seconds, predict,
                                          stats_steps, wire_cast_cpu)
from theanompi_ext.launch.emulated_network import tbf_link

MS = 1e3


def _step_events(pid, t0, pieces, step):
    """Complete events of one step of rank ``pid``: (name, dur ms, args) back to back."""
    total = sum(d for _, d, _ in pieces)
    ev, t = [dict(ph='X', pid=pid, tid=0, name='step %d' % step, ts=t0 * MS,
                  dur=total * MS)], t0
    for name, dur, args in pieces:
        ev.append(dict(ph='X', pid=pid, tid=0, name=name, ts=t * MS, dur=dur * MS, args=args))
        t += dur
    return ev


def _traces(tmp_path, k):
    """Overlapped and serial timelines of 2 ranks, 3 steps (the first is dropped).

    Rank 1 is the slower one: its last chunk takes 35 ms (rank 0: 30 ms), its
    forward_backward 70 ms (rank 0: 60 ms). Buckets: 1000 then 3000 bytes.
    """
    over, ser = [], []
    for step in range(3):
        for pid, last in ((0, 30.0), (1, 35.0)):
            t0 = 200.0 * step
            over += _step_events(pid, t0, [
                ('forward', 10.0, {}),
                ('backward:c1', 20.0, {'grad_bytes': 1000, 'tensors': 1}),
                ('backward:c0', last, {'grad_bytes': 3000, 'tensors': 2}),
                ('stats', 1.0, {}), ('wait', 5.0, {}), ('update', 1.0, {})], step)
            for b, (nbytes, at) in enumerate(((1000, 30.0), (3000, 30.0 + last))):
                over.append(dict(ph='X', pid=pid, tid=1, name='bucket%d' % b, ts=(t0 + at) * MS,
                                 dur=4 * MS, args={'bytes': nbytes, 'step': step}))
            ser += _step_events(pid, t0, [('forward_backward', 60.0 + 10 * pid, {}),
                                          ('stats', 1.0, {}), ('update', 20.0, {})], step)
    path = tmp_path / ('k%d-overlap.json' % k)
    path.write_text(json.dumps({'traceEvents': over}))
    (tmp_path / ('k%d-serial.json' % k)).write_text(json.dumps({'traceEvents': ser}))
    return str(path)


def _row(**kw):
    row = dict(allreduce_s=0.014, cpu_per_wall_compute=0.5, cpu_per_wall_allreduce=0.5,
               cpu_per_wall_serial=0.5, compute_s=0.07, serial_s=0.0785, overlap_s=0.0715,
               steps=2)
    row.update(kw)
    return row


def test_prediction_by_hand(tmp_path):
    link = (1e6, 2000.0)        # 1 MB/s after a 2000-byte burst
    measured = {2: (_row(), _traces(tmp_path, 2)),
                4: (_row(cpu_per_wall_compute=0.25, serial_s=0.1035), _traces(tmp_path, 4))}
    got = {(r['workers'], r['mode']): r for r in predict(measured, 'float32', link)}
    # k0 = 2: the slowest rank's loss statistics take 1 ms in the serial steps, one
    # recursive-doubling step at CPU share 0.5: 0.5 ms of CPU per step.
    assert got[(2, 'serial')]['step_cpu_s'] == pytest.approx(0.5e-3)
    assert got[(2, 'serial')]['step_latency_s'] == pytest.approx(1e-3)        # 0.5 ms / 0.5
    # the link moves 2 (k-1) 4000 = 8000 B a step, 2000 of them in the burst (70 ms
    # of compute refill it): 6 ms at 1 MB/s, 1.5 + 4.5 ms for the two buckets. Each
    # bucket's 2 (k-1) = 2 ring steps take 2 ms of CPU; the shared link costs a bucket
    # the larger of its CPU and its bytes: 2 + 4.5 ms.
    assert got[(2, 'serial')]['link_s'] == pytest.approx(6e-3)
    # serial, k=2: slowest forward_backward 70 + stats 1 + buckets 6.5 + update 1 ms
    assert got[(2, 'serial')]['predicted_s'] == pytest.approx(0.0785)
    assert got[(2, 'serial')]['error'] == pytest.approx(0.0)
    # overlapped, k=2: forward 10; rank 1's chunks 20, 35. Bucket 0 ready at 20, done
    # 22; bucket 1 ready at 55, done 59.5; the stats (1 ms) queue behind it. Step
    # 10 + 60.5 + update 1.
    assert got[(2, 'overlap')]['predicted_s'] == pytest.approx(0.0715)
    # allreduce-alone blocks of 2 back to back: the first has 6 ms of link, the second
    # (the bucket emptied) 8 ms; median 7 ms, 1.75 + 5.25: buckets 2 + 5.25 ms.
    assert got[(2, 'serial')]['allreduce_predicted_s'] == pytest.approx(7.25e-3)
    # k=4 at share 0.25: 2 ms per step, 6 steps a bucket = 12 ms; link (2*3*4000 -
    # 2000) B = 22 ms, 5.5 + 16.5: buckets 12 + 16.5; stats 2 steps x 2 = 4 ms.
    assert got[(4, 'serial')]['predicted_s'] == pytest.approx(0.070 + 0.004 + 0.0285 + 0.001)
    assert got[(4, 'serial')]['error'] == pytest.approx(0.0)
    assert got[(4, 'serial')]['measured_efficiency'] == pytest.approx(0.07 / 0.1035)
    # a 16-bit wire: half the bytes (link 4000 - 2000 B = 2 ms: 0.5 + 1.5), 2 ms of cast
    # CPU at share 0.5 = 4 ms on the comm stream (1 + 3 by bytes); asa: 1 + 1 latency
    # steps = 2 ms a bucket. Buckets max(2 + 1, 0.5) + max(2 + 3, 1.5) = 8 ms.
    half = {(r['workers'], r['mode']): r for r in predict(
        {2: measured[2]}, 'float16', link, casts={2: 0.002})}
    assert half[(2, 'serial')]['step_cpu_s'] == pytest.approx(0.5e-3)
    assert half[(2, 'serial')]['cast_s'] == pytest.approx(0.004)
    assert half[(2, 'serial')]['predicted_s'] == pytest.approx(0.070 + 0.001 + 0.008 + 0.001)


def test_link_and_latency_terms_by_hand():
    assert tbf_link('200mbit') == (25e6, 256 * 1024.0)       # tc: rates 1000s, sizes 1024s
    assert tbf_link('8kbps', '1mb') == (8e3, 2 ** 20)
    with pytest.raises(ValueError, match='tc units'):
        tbf_link('fast')
    link = (1e6, 2000.0)
    assert link_seconds(4000, 2, None) == 0.0                 # shared memory: CPU work
    assert link_seconds(4000, 4, link) == pytest.approx(22e-3)
    assert link_seconds(500, 2, link) == 0.0                  # inside the burst
    # 1 ms since the last exchange refills only 1000 of the 2000 bytes
    assert link_seconds(4000, 4, link, refill_s=1e-3) == pytest.approx(23e-3)
    # back to back: 8000 B a step through a 2000 B burst: 6, 8, 8 ms; median 8
    assert block_link_seconds(4000, 2, link, 3) == pytest.approx(8e-3)
    assert block_link_seconds(500, 2, link, 2) == 0.0         # the block fits the burst
    assert block_link_seconds(4000, 2, None, 3) == 0.0
    # MPICH's recursive doubling for the few numbers of the loss statistics
    assert [stats_steps(k) for k in (2, 3, 4, 8, 16)] == [1, 3, 2, 3, 4]


def test_a_shared_link_costs_the_larger_of_cpu_and_bytes():
    from theanompi_ext.simulate.model import Message
    from theanompi_ext.simulate.network import Network
    net = Network(algorithm='ring', alpha=1e-3, bandwidth=1e6, intra_alpha=1e-3,
                  intra_bandwidth=1e6, gpus_per_node=1)
    m = Message(0.0, 8000.0)
    # ring, k=2: 2 steps x 1 ms, and 2 (k-1)/k 8000 B / 1 MB/s = 8 ms of bytes
    assert m.cost(net, 2) == pytest.approx(10e-3)
    assert m.cost(net, 2, shared_link=True) == pytest.approx(8e-3)
    # 7 ms of casts on top of the CPU steps: now the CPU side is longer
    assert m.cost(net, 2, cast_s_per_byte=7e-3 / 8000, shared_link=True) == pytest.approx(9e-3)


def test_wire_cast_cpu_is_measured_for_16_bits_only():
    assert wire_cast_cpu([4000, 12000], 2, 'float32') == 0.0
    small = wire_cast_cpu([4 * 2 ** 10], 2, 'float16', reps=3)
    big = wire_cast_cpu([4 * 2 ** 20], 2, 'float16', reps=3)
    assert 0 < small < big          # CPU seconds, growing with the bucket


def test_simulate_takes_the_wire_dtype():
    out = {}
    for wire in ('float32', 'float16'):
        r = subprocess.run([sys.executable, '-m', 'theanompi_ext', 'simulate', '--preset',
                            'goyal2017', '--no-overlap', '--wire-dtype', wire],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        out[wire] = float(r.stdout.strip().splitlines()[-1])
    assert out['float16'] > out['float32']       # half the bytes: better serial scaling


def test_quick_validation_runs_at_2_and_3_ranks(tmp_path):
    """The command end to end (its figures mean nothing here; the bar is in the docs)."""
    js, kept = tmp_path / 'v.json', tmp_path / 'runs'
    r = subprocess.run([sys.executable, '-m', 'theanompi_ext', 'bench', 'validate', '--quick',
                        '--workers', '2,3', '--network', 'shm', '--json', str(js),
                        '--save-runs', str(kept)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert re.search(r'largest error [0-9.]+% \(target: within 10% on every point\)', r.stdout)
    rows = json.loads(js.read_text())
    assert sorted((x['workers'], x['mode']) for x in rows) == [
        (2, 'overlap'), (2, 'serial'), (3, 'overlap'), (3, 'serial')]
    for x in rows:
        assert x['measured_s'] > 0 and x['predicted_s'] > 0
        assert x['error'] == pytest.approx(x['predicted_s'] / x['measured_s'] - 1)
    # the kept measurements predict the same again, running nothing
    again = tmp_path / 'again.json'
    r = subprocess.run([sys.executable, '-m', 'theanompi_ext', 'bench', 'validate',
                        '--from-runs', str(kept), '--json', str(again)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert [x['predicted_s'] for x in json.loads(again.read_text())] == pytest.approx(
        [x['predicted_s'] for x in rows])


def test_from_runs_refuses_a_folder_without_a_record(tmp_path):
    r = subprocess.run([sys.executable, '-m', 'theanompi_ext', 'bench', 'validate',
                        '--from-runs', str(tmp_path)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and 'runs.json' in r.stderr and 'cannot read' in r.stderr
    (tmp_path / 'runs.json').write_text('{"runs": 3}')
    r = subprocess.run([sys.executable, '-m', 'theanompi_ext', 'bench', 'validate',
                        '--from-runs', str(tmp_path)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and 'not a record of bench validate --save-runs' in r.stderr


def test_bad_worker_counts_are_refused():
    r = subprocess.run([sys.executable, '-m', 'theanompi_ext', 'bench', 'validate',
                        '--workers', '1,2'], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and 'every count must be >= 2' in r.stderr
