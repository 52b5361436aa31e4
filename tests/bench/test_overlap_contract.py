"""``theanompi-ext bench overlap --contract MODULE:CLASS``: the overlap measured on an
unmodified Theano-MPI model (examples/theanompi_style/resnet20_tm.py's ResNet-8).

The quick run starts real mpiexec ranks; timings are not asserted (a shared
machine), only that every figure is there and finite and that the model was
chunked from its own layers.
"""
import json
import math
import os
import subprocess
import sys

import pytest

from support.paths import ROOT

from theanompi_ext.bench.overlap_contract import parse_contract

EXAMPLES = os.path.join(ROOT, 'examples', 'theanompi_style')
FIGURES = ('compute_s', 'compute_chunked_s', 'serial_s', 'overlap_s', 'allreduce_s',
           'exposed_comm_s', 'exposed_comm_rank_s', 'chunk_overhead')


def bench(*argv, timeout):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [ROOT, EXAMPLES] + [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p]))
    cmd = [sys.executable, '-m', 'theanompi_ext', 'bench', 'overlap'] + list(argv)
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                              start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        pytest.fail('bench overlap %s hung:\n%s\n%s' % (' '.join(argv), exc.stdout, exc.stderr))


def test_contract_quick_run_has_every_figure(tmp_path):
    out, prefix = str(tmp_path / 'bench.json'), str(tmp_path / 'tl')
    res = bench('--quick', '--contract', 'resnet20_tm:TinyResNetTM', '--json', out,
                '--timeline', prefix, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert 'resnet20_tm:TinyResNetTM' in res.stdout and 'hidden' in res.stdout
    with open(out) as f:
        rows = json.load(f)
    assert len(rows) == 1                  # --contract alone: no zoo model
    row = rows[0]
    assert row['model'] == 'resnet20_tm:TinyResNetTM' and row['source'] == 'contract'
    assert row['network'] == 'shm' and row['workers'] == 2
    for key in FIGURES:
        assert math.isfinite(row[key]), key
    for key in ('compute_s', 'serial_s', 'overlap_s', 'allreduce_s'):
        assert row[key] > 0, key
    hf = row['hidden_fraction']            # None where the exchange costs ~nothing (shm)
    assert hf is None or math.isfinite(hf)
    assert row['extra_bytes'] == 0 and row['batch'] == 32   # the model's own batch
    # stem, 3 blocks, softmax: cut at the outputs of model.layers
    assert row['n_chunks'] == 5 and 'model.layers' in row['chunks_found']
    assert row['grad_bytes'] > 0 and row['n_buckets'] >= 1 and row['chunk_saved_bytes'] > 0
    for label in ('serial', 'overlap'):
        assert os.path.exists('%s-shm-resnet20_tm_TinyResNetTM-%s.json' % (prefix, label))


def test_contract_spec_is_checked_before_any_rank_starts(tmp_path):
    res = bench('--contract', 'resnet20_tm', '--json', str(tmp_path / 'x.json'), timeout=60)
    assert res.returncode == 2
    assert '--contract wants MODULE:CLASS' in res.stderr
    assert not (tmp_path / 'x.json').exists()


@pytest.mark.parametrize('text,want', [
    ('resnet20_tm:ResNet20TM', ('resnet20_tm', 'ResNet20TM')),
    ('pkg.models:Cifar10_model', ('pkg.models', 'Cifar10_model')),
    ('/a/b/model.py:Net', ('/a/b/model.py', 'Net')),
])
def test_parse_contract(text, want):
    assert parse_contract(text) == want


@pytest.mark.parametrize('text', ['resnet20_tm', ':Net', 'mod:', 'mod:1Net', 'mod:Net.x'])
def test_parse_contract_refuses(text):
    with pytest.raises(ValueError, match='MODULE:CLASS'):
        parse_contract(text)
