"""Every rank script of tests/mpi/ also runs alone: one plain process, no mpiexec.

The multi-rank tests run these scripts on 2 to 4 ranks under mpiexec; here each
runs at k = 1 with MPI's singleton init, and what it prints or asserts about a
world of one is checked. Scripts that mean nothing alone are listed in
NOT_ALONE with the reason, and every script of tests/mpi/ is in one list or the
other, so a new script is not forgotten.
"""
import json
import os

import numpy as np
import pytest

from support.configs import write_cfg
from support.paths import MPI_DIR
from support.procs import run_alone

LR, MU, WD = 0.1, 0.9, 0.01            # the rule run_rules.py builds


def _json(res):
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def communicator(tmp_path):
    out = _json(run_alone('run_communicator.py', timeout=120))
    assert out['size'] == 1
    for progress in ('thread', 'request'):     # alone, no barrier and no wait is held up
        assert out[progress]['barrier_s'] < 0.5 and out[progress]['wait_s'] < 0.3, out


def gpucomm(tmp_path):
    out = _json(run_alone('run_gpucomm.py', timeout=120))
    assert out == {'ranks': 1, 'gpucomm_calls': [[True, '+', 300], [True, '+', 450],
                                                 [True, '+', 250]],
                   'copies': [300, 450, 250], 'equal_to_host': True}


def one_rank_sgd(g, steps=2):
    """Momentum SGD of one rank on run_rules.py's layout [W0, W1 | b | gamma]: decay
    on all but gamma, the same gradient each step (what kn and avg are at k = 1)."""
    w, u, out = [1.0, 2.0, 0.5, 1.0], [0.0] * 4, []
    for _ in range(steps):
        for i in range(4):
            u[i] = MU * u[i] + g[i] + (WD * w[i] if i < 3 else 0.0)
            w[i] -= LR * u[i]
        out.append(list(w))
    return out


def rules(tmp_path):
    g = [0.1, 0.2, 0.3, 0.4]
    got = {s: _json(run_alone('run_rules.py', s, json.dumps([g]), timeout=120))
           for s in ('kn', 'avg', 'cdd')}
    want = one_rank_sgd(g)
    for sync_type in ('kn', 'avg'):          # the sum and the mean of one rank: its own
        assert len(got[sync_type]) == 1
        for step in range(2):
            assert got[sync_type][0][step] == pytest.approx(want[step], rel=1e-5, abs=1e-6)
    for step in range(2):                    # cdd: weights as kn, the bias not
        assert got['cdd'][0][step][:2] == pytest.approx(want[step][:2], rel=1e-5, abs=1e-6)
    assert abs(got['cdd'][0][1][2] - want[1][2]) > 1e-3


def started(tmp_path):
    out = _json(run_alone('run_started.py', timeout=120))
    for poll_us in ('0', '500'):
        assert out[poll_us]['ok'] and out[poll_us]['n_inline'] is None, out
        assert 'mpi rank 0/1' in out[poll_us]['describe']


def wire(tmp_path):
    assert _json(run_alone('run_wire.py', timeout=120)) == {'k': 1, 'alone_unchanged': True}


def train(tmp_path):
    cfg = write_cfg(str(tmp_path / 'cfg.json'), out=str(tmp_path / 'run'))
    res = run_alone('run_train.py', cfg, tmp_path, timeout=200)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((tmp_path / 'summary.json').read_text())
    assert (summary['workers'], summary['total_batch'], summary['iterations']) == (1, 8, 6)
    params = np.load(str(tmp_path / 'rank0.npz'))
    assert params.files and all(np.all(np.isfinite(params[k])) for k in params.files)


def nonfinite(tmp_path):
    res = run_alone('run_nonfinite.py', timeout=200)
    assert res.returncode == 3, res.stderr[-3000:]
    assert 'rank 0 of 1 failed: NonFiniteLoss' in res.stderr and 'at iteration' in res.stderr


def failing_together(tmp_path):
    """Alone, "all ranks" is one rank: its own line, its status, no abort."""
    for case in ('alike', 'mixed'):
        res = run_alone('run_failing_together.py', case, timeout=120)
        assert res.returncode == 3, res.stderr[-3000:]
        assert 'rank 0 of 1 failed: %s' % ('NonFiniteLoss' if case == 'alike' else
                                          'MemoryError') in res.stderr
        assert 'ranks failed' not in res.stderr and 'Abort' not in res.stderr


def wire_train(tmp_path):
    res = run_alone('run_wire_train.py', timeout=200)
    # alone nothing is cast, so no WireOverflow: the loss itself turns non-finite
    assert res.returncode == 3, res.stderr[-3000:]
    assert 'rank 0 of 1 failed: NonFiniteLoss' in res.stderr
    assert 'float16 wire' not in res.stderr


def faults(tmp_path):
    cfg = write_cfg(str(tmp_path / 'cfg.json'))
    res = run_alone('run_faults.py', cfg, tmp_path, 'none', 0, 0, timeout=200)
    assert res.returncode == 0, res.stderr[-3000:]
    assert 'FAULT' not in res.stderr
    assert json.loads((tmp_path / 'rank0_0.json').read_text())['iteration'] == 6
    assert json.loads((tmp_path / 'summary0.json').read_text())['workers'] == 1


def overlap_equiv(tmp_path):
    out = tmp_path / 'equiv.npz'
    variants = [['ar', 25.0, 1.0], ['ar-overlap', 0.001, 0.0005]]
    res = run_alone('run_overlap.py', 'equiv', 'mlp', 3, json.dumps(variants), out, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    d = np.load(str(out))
    assert list(d['buckets']) == [1, 5] and d['agree'].all()
    assert np.array_equal(d['v0'], d['v1'])          # overlapped == serial, bit for bit
    assert not np.array_equal(d['v0'], d['initial'])


def clock_sync(tmp_path):
    """A world of one: its own clock, nothing moved, however skewed."""
    out = _json(run_alone('run_clock_sync.py', json.dumps([123.0]), json.dumps(['A']),
                          timeout=120))
    other = out['other']
    assert other['clock_offset_us'] == {'0': 0.0} and other['clock_error_us'] == 0.0
    assert out['step0_us'] == {'0': 0.0}
    assert other['job_exposed_comm_us'] == [5000.0, 5000.0]


ALONE = {'run_communicator.py': communicator, 'run_clock_sync.py': clock_sync, 'run_gpucomm.py': gpucomm,
         'run_rules.py': rules, 'run_started.py': started, 'run_wire.py': wire,
         'run_train.py': train, 'run_nonfinite.py': nonfinite,
         'run_wire_train.py': wire_train, 'run_faults.py': faults,
         'run_failing_together.py': failing_together,
         'run_overlap.py equiv': overlap_equiv}
NOT_ALONE = {
    'run_overlap.py mismatch': 'needs k >= 2: bucket plans can only differ across ranks',
    'run_overlap.py trace': 'left out for time (a digits_cnn build, ~40 s here); the '
                            'timeline itself is the same code at k = 1 and k = 2',
    'run_two_level.py': 'needs k >= 2 ranks faked as hosts: at k = 1 MPICommunicator never '
                        'builds a two-level sum (collective/mpi.py _two_levels); '
                        'tests/collective/test_two_level.py runs it at k = 3 and 4',
    'ckpt_writer.py': 'no MPI: writes checkpoints until killed, always run alone '
                      '(tests/launch/test_faults.py)',
    'device_unit.py': 'no MPI: one process on the OpenCL device, always run alone '
                      '(tests/train/test_device.py)',
    'run_keeper.py': 'needs k >= 2: one rank starts no keeper (train/faults.keep_rank), and '
                     'alone the script only waits to be killed '
                     '(tests/launch/test_rank_keeper.py)',
}


# NOT_ALONE is not parametrized as skips: those runs do not exist, and the
# completeness test below holds the list (each with its reason) to tests/mpi/.
@pytest.mark.parametrize('script', sorted(ALONE))
def test_rank_script_alone(script, tmp_path):
    ALONE[script](tmp_path)


def test_every_rank_script_is_listed():
    listed = {name.split()[0] for name in list(ALONE) + list(NOT_ALONE)}
    assert listed == {f for f in os.listdir(MPI_DIR) if f.endswith('.py')}
    assert not set(ALONE) & set(NOT_ALONE) and all(NOT_ALONE.values())
