"""bench validate: the simulator fed measured chunk times and link speed (issue 18)."""
import json
import re
import subprocess
import sys

import pytest

from theanompi_ext.bench.validate import (link_seconds, predict, stats_steps, tbf_link,
                                          wire_cast_cpu)

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
               compute_s=0.07, serial_s=0.087, overlap_s=0.0765)
    row.update(kw)
    return row


def test_prediction_by_hand(tmp_path):
    link = (1e6, 2000.0)        # 1 MB/s after a 2000-byte burst
    measured = {2: (_row(), _traces(tmp_path, 2)),
                4: (_row(cpu_per_wall_compute=0.25, serial_s=0.149), _traces(tmp_path, 4))}
    got = {(r['workers'], r['mode']): r for r in predict(measured, 'float32', link)}
    # k0 = 2: the link moves 2 (k-1) 4000 = 8000 B, 2000 of them in the burst: 6 ms
    # at 1 MB/s. 2 buckets x 2 (k-1) = 4 ring steps share the other 14 - 6 = 8 ms at
    # CPU share 0.5: 1 ms of CPU per step.
    assert got[(2, 'serial')]['step_cpu_s'] == pytest.approx(1e-3)
    assert got[(2, 'serial')]['step_latency_s'] == pytest.approx(2e-3)        # 1 ms / 0.5
    assert got[(2, 'serial')]['allreduce_predicted_s'] == pytest.approx(0.014)
    # serial, k=2: slowest forward_backward 70 + stats (1 step, 2 ms) + buckets 14
    # + update 1 ms
    assert got[(2, 'serial')]['predicted_s'] == pytest.approx(0.087)
    assert got[(2, 'serial')]['error'] == pytest.approx(0.0)
    # overlapped, k=2: forward 10; rank 1's chunks 20, 35. Bucket 0 (1000 B: 2 steps
    # x 2 ms + 1.5 ms of link) ready at 20, done 25.5; bucket 1 (4 + 4.5 ms) ready at
    # 55, done 63.5; the stats (2 ms) queue behind it. Step 10 + 65.5 + update 1.
    assert got[(2, 'overlap')]['predicted_s'] == pytest.approx(0.0765)
    # k=4 at share 0.25: 4 ms per step; link (2*3*4000 - 2000) B = 22 ms;
    # buckets 2 x 6 x 4 + 22 = 70 ms; stats 2 steps x 4 = 8 ms.
    assert got[(4, 'serial')]['allreduce_predicted_s'] == pytest.approx(0.070)
    assert got[(4, 'serial')]['predicted_s'] == pytest.approx(0.070 + 0.008 + 0.070 + 0.001)
    assert got[(4, 'serial')]['error'] == pytest.approx(0.0)
    assert got[(4, 'serial')]['measured_efficiency'] == pytest.approx(0.07 / 0.149)
    # a 16-bit wire: half the bytes, and 2 ms of cast CPU at share 0.5 = 4 ms on the
    # comm stream; calibration: (14 - link 2 - casts 4) * 0.5 / 4 steps = 1 ms again.
    half = {(r['workers'], r['mode']): r for r in predict(
        {2: measured[2]}, 'float16', link, casts={2: 0.002})}
    assert half[(2, 'serial')]['step_cpu_s'] == pytest.approx(1e-3)
    assert half[(2, 'serial')]['cast_s'] == pytest.approx(0.004)
    assert half[(2, 'serial')]['predicted_s'] == pytest.approx(0.070 + 0.002 + 0.014 + 0.001)


def test_link_and_latency_terms_by_hand():
    assert tbf_link('200mbit') == (25e6, 256 * 1024.0)       # tc: rates 1000s, sizes 1024s
    assert tbf_link('8kbps', '1mb') == (8e3, 2 ** 20)
    with pytest.raises(ValueError, match='tc units'):
        tbf_link('fast')
    assert link_seconds(4000, 2, None) == 0.0                 # shared memory: CPU work
    assert link_seconds(4000, 4, (1e6, 2000.0)) == pytest.approx(22e-3)
    assert link_seconds(500, 2, (1e6, 2000.0)) == 0.0         # inside the burst
    # MPICH's recursive doubling for the few numbers of the loss statistics
    assert [stats_steps(k) for k in (2, 3, 4, 8, 16)] == [1, 3, 2, 3, 4]


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
