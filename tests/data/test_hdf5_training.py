"""Training end to end on an HDF5 file, and the example configurations."""
import glob
import json
import math
import os
import subprocess
import sys

import pytest

from theanompi_ext.train import options

from support.paths import ROOT

EXAMPLES = os.path.join(ROOT, 'examples')


def test_train_two_ranks_on_hdf5_digits(tmp_path):
    from theanompi_ext.data.convert import write_digits_h5
    data = str(tmp_path / 'digits.h5')
    write_digits_h5(data)
    out = tmp_path / 'run'
    cmd = [sys.executable, '-m', 'theanompi_ext', 'train', '--data', data,
           '--model', 'digits_cnn', '--workers', '2', '--epochs', '2',
           '--batch-per-worker', '32', '--ref-batch', '64', '--warmup-epochs', '1',
           '--scale-min', '0.5', '--out', str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    summary = json.loads((out / 'summary.json').read_text())
    assert summary['workers'] == 2 and summary['total_batch'] == 64
    assert summary['config']['data'] == data
    assert [h['epoch'] for h in summary['history']] == [1, 2]
    top1 = summary['final_val_top1']
    assert isinstance(top1, float) and math.isfinite(top1) and 0 <= top1 <= 1
    # 1438 train / 359 val examples of 8x8 grey images, stored at that size
    assert summary['iterations'] == 2 * (1438 // 64)
    with open(out / 'curves.png', 'rb') as f:
        assert f.read(8) == b'\x89PNG\r\n\x1a\n'
    assert 'final val top-1 error' in r.stdout


def _example_configs():
    return sorted(glob.glob(os.path.join(EXAMPLES, '**', '*.cfg'), recursive=True))


def test_there_are_example_configs():
    names = {os.path.basename(p) for p in _example_configs()}
    assert {'resnet50_goyal2017.cfg', 'vgg16_goyal2017.cfg', 'digits_cnn.cfg',
            'resnet20_digits_h5.cfg'} <= names


@pytest.mark.parametrize('path', _example_configs(), ids=os.path.basename)
def test_example_config_parses(path):
    values = options.read_kv_file(path, options.config_keys())
    cfg = options.config_from(options.build_parser().parse_args([]), values)
    assert cfg.model in ('resnet50', 'vgg16', 'digits_cnn', 'resnet20')
    if 'goyal2017' in path:
        # the paper's recipe (Sec. 5.1): n=32, gradual warm-up over 5 of 90 epochs
        assert cfg.batch_per_worker == 32 and cfg.ref_batch == 256
        assert (cfg.epochs, cfg.decay_epochs, cfg.warmup, cfg.warmup_epochs) == \
            (90, (30, 60, 80), 'gradual', 5.0)
        assert cfg.momentum == 0.9 and cfg.nesterov and cfg.weight_decay == 1e-4
        assert cfg.crop == 224


def test_example_settings_file_parses():
    from theanompi_ext.train import trials
    import argparse
    path = os.path.join(EXAMPLES, 'cpu', 'table1.settings')
    named = trials.read_settings_file(path)
    assert [n for n, _ in named] == ['baseline', 'no-warmup', 'constant', 'gradual']
    p = argparse.ArgumentParser()
    p.add_argument('--workers', type=int, default=1)
    p.add_argument('--hostfile', default=None)
    p.add_argument('--config', default=None)
    options.add_config_arguments(p)
    common = p.parse_args([])
    settings = [trials.build_setting(n, common, argv) for n, argv in named]
    kn = [s.workers * s.cfg.batch_per_worker for s in settings]
    assert kn[1:] == [8 * kn[0]] * 3
    # the 16-bit wire comparison: Table 1's baseline and gradual settings, each wire
    wire = [trials.build_setting(n, common, argv) for n, argv in trials.read_settings_file(
        os.path.join(EXAMPLES, 'cpu', 'wire.settings'))]
    assert [(s.cfg.batch_per_worker, s.cfg.warmup, s.cfg.wire_dtype) for s in wire] == [
        (8, 'none', 'float32'), (8, 'none', 'float16'),
        (64, 'gradual', 'float32'), (64, 'gradual', 'float16')]


@pytest.mark.parametrize('path', sorted(glob.glob(os.path.join(EXAMPLES, '**', '*.sh'),
                                                  recursive=True)), ids=os.path.basename)
def test_example_scripts_are_valid_shell(path):
    r = subprocess.run(['bash', '-n', path], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert os.access(path, os.X_OK), '%s is not executable' % path
