"""bench validate: the simulator fed measured chunk times and link speed (issue 18)."""
import json
import re
import subprocess
import sys

import pytest

from theanompi_ext.bench.validate import link_rate, predict


def _trace(path):
    ev = [dict(ph='X', pid=0, tid=0, name='forward', ts=0, dur=1000),
          dict(ph='X', pid=0, tid=0, name='backward:c1', ts=1000, dur=2000,
               args={'grad_bytes': 100000, 'tensors': 2}),
          dict(ph='X', pid=0, tid=0, name='backward:c0', ts=3000, dur=3000,
               args={'grad_bytes': 300000, 'tensors': 2})]
    path.write_text(json.dumps({'traceEvents': ev}))
    return str(path)


def test_prediction_by_hand(tmp_path):
    # 2 ranks: 4e5 bytes of gradients, allreduces alone 8 ms -> the shared
    # link moves 2 (k-1) 4e5 = 8e5 bytes in 8 ms: 1e8 B/s.
    row = dict(grad_bytes=400000, allreduce_s=0.008, compute_s=0.007, serial_s=0.015,
               overlap_s=0.0125, bucket_cap_mb=0.1)
    assert link_rate(row, 2, 'float32') == pytest.approx(1e8)
    assert link_rate(row, 2, 'float32', shared_link=False) == pytest.approx(5e7)
    trace = _trace(tmp_path / 't.json')
    rows = predict({2: (row, trace), 4: (dict(row, serial_s=0.031), trace)}, 'float32')
    got = {(r['workers'], r['mode']): r for r in rows}
    # one bucket (0.1 MiB cap reached by the second chunk), ready at 5 ms;
    # k=2: per-link 5e7 B/s, ring 2 (k-1)/k 4e5 / 5e7 = 8 ms; k=4: 2.5e7, 24 ms.
    # step = forward 1 + backward 5 + exchange + other (compute 7 - 6 = 1) ms
    assert got[(2, 'serial')]['predicted_s'] == pytest.approx(0.015)
    assert got[(2, 'overlap')]['predicted_s'] == pytest.approx(0.015)   # bucket ready last
    assert got[(4, 'serial')]['predicted_s'] == pytest.approx(0.031)
    assert got[(2, 'overlap')]['error'] == pytest.approx(0.015 / 0.0125 - 1)
    assert got[(4, 'serial')]['error'] == pytest.approx(0.0)
    assert got[(4, 'serial')]['predicted_efficiency'] == pytest.approx(0.007 / 0.031)
    assert got[(2, 'serial')]['measured_efficiency'] == pytest.approx(0.007 / 0.015)
    # a 16-bit wire: half the bytes; calibrated on them, the same link
    half = predict({4: (dict(row, allreduce_s=0.012), trace)}, 'float16')
    # k0=4: rate = 2*3*2e5 / 12 ms = 1e8; per link 2.5e7; 2*3/4*2e5/2.5e7 = 12 ms
    assert half[0]['predicted_s'] == pytest.approx(0.001 + 0.005 + 0.012 + 0.001)


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
    js = tmp_path / 'v.json'
    r = subprocess.run([sys.executable, '-m', 'theanompi_ext', 'bench', 'validate', '--quick',
                        '--workers', '2,3', '--network', 'shm', '--json', str(js)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert re.search(r'largest error [0-9.]+% \(target: within 10% on every point\)', r.stdout)
    rows = json.loads(js.read_text())
    assert sorted((x['workers'], x['mode']) for x in rows) == [
        (2, 'overlap'), (2, 'serial'), (3, 'overlap'), (3, 'serial')]
    for x in rows:
        assert x['measured_s'] > 0 and x['predicted_s'] > 0
        assert x['error'] == pytest.approx(x['predicted_s'] / x['measured_s'] - 1)


def test_bad_worker_counts_are_refused():
    r = subprocess.run([sys.executable, '-m', 'theanompi_ext', 'bench', 'validate',
                        '--workers', '1,2'], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and 'every count must be >= 2' in r.stderr
