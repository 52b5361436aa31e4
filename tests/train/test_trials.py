"""``theanompi-ext trials``: the paper's reporting protocol, by hand and end to end."""
import argparse
import json
import math
import os
import stat
import subprocess
import sys

import pytest

from theanompi_ext.train import options, trials
from theanompi_ext.train.report import plot_curves


# --------------------------------------------------------------------------- protocol math

def test_median_of_last_five_by_hand():
    # last five: 0.30 0.20 0.10 0.25 0.15 -> sorted 0.10 0.15 0.20 0.25 0.30 -> 0.20
    assert trials.median_of_last([0.5, 0.4, 0.3, 0.2, 0.1, 0.25, 0.15]) == (0.2, 5)


def test_median_of_fewer_epochs_is_mean_of_middle_pair():
    # four values 0.1 0.2 0.3 0.4 -> (0.2 + 0.3) / 2
    med, used = trials.median_of_last([0.3, 0.1, 0.2, 0.4])
    assert used == 4 and med == pytest.approx(0.25)
    assert trials.median_of_last([0.07]) == (0.07, 1)
    assert trials.median_of_last([]) == (None, 0)
    assert trials.median_of_last([0.4, 0.1, 0.2], last=2) == (0.15000000000000002, 2)
    with pytest.raises(ValueError):
        trials.median_of_last([0.1], last=0)


def test_run_error_uses_evaluated_epochs_only():
    # eval every 2nd epoch: the last five *evaluated* are epochs 4, 6, 8, 10, 12
    hist = [dict(epoch=e, train_loss=1.0 / e) for e in range(1, 13)]
    vals = {2: 0.9, 4: 0.5, 6: 0.04, 8: 0.03, 10: 0.05, 12: 0.02}
    for h in hist:
        if h['epoch'] in vals:
            h['val_top1'] = vals[h['epoch']]
    err, used, epochs = trials.run_error(hist)
    assert epochs == [4, 6, 8, 10, 12] and used == 5
    assert err == 0.04           # sorted 0.02 0.03 0.04 0.05 0.5
    assert trials.run_error([dict(epoch=1, train_loss=1.0)]) == (None, 0, [])


def test_mean_and_sample_std_by_hand():
    # mean 0.03; squared deviations 1e-4, 1e-4, 0 -> /(3-1) -> std 0.01 (ddof=0 gives 0.00816)
    mean, std = trials.mean_std([0.02, 0.04, 0.03])
    assert mean == pytest.approx(0.03) and std == pytest.approx(0.01)
    # Table-1-like: 23.6, 23.5, 23.7, 23.4, 23.8 -> mean 23.6, var (0+.01+.01+.04+.04)/4
    mean, std = trials.mean_std([23.6, 23.5, 23.7, 23.4, 23.8])
    assert mean == pytest.approx(23.6) and std == pytest.approx(math.sqrt(0.025))
    assert trials.mean_std([0.5]) == (0.5, None)
    assert trials.mean_std([]) == (None, None)


def test_summary_leaves_out_diverged_and_failed_runs():
    runs = [dict(status='ok', error=0.02, epochs_used=5),
            dict(status='diverged', error=None, epochs_used=0),
            dict(status='ok', error=0.04, epochs_used=3),
            dict(status='failed', error=None, epochs_used=0)]
    s = trials.summarise_runs(runs)
    assert s['mean'] == pytest.approx(0.03)
    assert s['std'] == pytest.approx(math.sqrt(2e-4))   # (1e-4 + 1e-4) / 1
    assert (s['n_runs'], s['n_ok'], s['n_diverged'], s['n_failed'], s['epochs_used']) == \
        (4, 2, 1, 1, 3)


def test_epoch_band_keeps_epochs_all_runs_have():
    a = [dict(epoch=1, val_top1=0.5), dict(epoch=2, val_top1=0.3), dict(epoch=3, val_top1=0.1)]
    b = [dict(epoch=1, val_top1=0.3), dict(epoch=2, val_top1=0.1)]
    ep, m, s = trials.epoch_band([a, b])
    assert ep == [1, 2]
    assert m == pytest.approx([0.4, 0.2])
    assert s == pytest.approx([math.sqrt(0.02)] * 2)   # (0.1^2 + 0.1^2) / 1
    assert trials.epoch_band([a])[2] == [0.0, 0.0, 0.0]
    assert trials.epoch_band([]) == ([], [], [])


# --------------------------------------------------------------------------- settings

def _common(argv):
    p = argparse.ArgumentParser()
    p.add_argument('--workers', type=int, default=1)
    p.add_argument('--hostfile', default=None)
    p.add_argument('--config', default=None)
    options.add_config_arguments(p)
    return p.parse_args(argv)


def test_parse_setting_and_file(tmp_path):
    assert trials.parse_setting("big: --workers 2 --base-lr 0.4") == \
        ('big', ['--workers', '2', '--base-lr', '0.4'])
    for bad in ('no-colon', ' :--epochs 2', 'a/b:--epochs 2', "x:--model 'open"):
        with pytest.raises(ValueError):
            trials.parse_setting(bad)
    f = tmp_path / 's.txt'
    f.write_text('# comment\n\nbase: --batch-per-worker 8   # small\n'
                 'big: --batch-per-worker 64 --warmup none\n')
    assert trials.read_settings_file(str(f)) == [
        ('base', ['--batch-per-worker', '8']),
        ('big', ['--batch-per-worker', '64', '--warmup', 'none'])]
    f.write_text('base --epochs 2\n')
    with pytest.raises(ValueError, match='line 1'):
        trials.read_settings_file(str(f))


def test_setting_precedence(tmp_path):
    common_cfg = tmp_path / 'common.cfg'
    common_cfg.write_text('epochs = 7\nbase_lr = 0.3\nmomentum = 0.5\n')
    own_cfg = tmp_path / 'own.cfg'
    own_cfg.write_text('EPOCHS = 9\nweight_decay = 0.001\n')
    common = _common(['--config', str(common_cfg), '--base-lr', '0.2', '--weight-decay',
                      '0.01', '--workers', '2', '--batch-per-worker', '8'])
    s = trials.build_setting('x', common, ['--config', str(own_cfg), '--epochs', '11'])
    # file < options < setting's file < setting's options
    assert s.cfg.momentum == 0.5           # common file only
    assert s.cfg.base_lr == 0.2            # common option beats common file
    assert s.cfg.weight_decay == 0.001     # setting's file beats common option
    assert s.cfg.epochs == 11              # setting's option beats everything
    assert s.workers == 2 and s.cfg.batch_per_worker == 8
    s = trials.build_setting('y', common, ['--workers', '4', '--nesterov'])
    assert s.workers == 4 and s.cfg.nesterov and s.cfg.epochs == 7
    with pytest.raises(ValueError, match='setting z'):
        trials.build_setting('z', common, ['--no-such-option'])
    with pytest.raises(ValueError, match='setting z'):
        trials.build_setting('z', common, ['--warmup', 'sideways'])


def test_peak_lr_is_the_linear_scaling_rule():
    from theanompi_ext.train.config import TrainConfig
    cfg = TrainConfig(batch_per_worker=64, base_lr=0.1, ref_batch=16)
    assert trials.peak_lr(cfg, 2) == pytest.approx(0.8)


# --------------------------------------------------------------------------- plots

def test_plot_curves_writes_png(tmp_path):
    hist = [dict(epoch=1, train_loss=1.0, train_err=0.4, lr=0.1, val_loss=0.9, val_top1=0.3,
                 val_top5=0.0),
            dict(epoch=2, train_loss=0.5, train_err=0.2, lr=0.1)]
    for h, name in ((hist, 'a.png'), ([], 'empty.png')):
        path = plot_curves(str(tmp_path / name), h, ([0.5, 1.0, 2.0], [0.1, 0.1, 0.1]), 't')
        with open(path, 'rb') as f:
            assert f.read(8) == b'\x89PNG\r\n\x1a\n'


# --------------------------------------------------------------------------- the command

FAKE_MPIEXEC = '''#!%s
"""A stand-in mpiexec: writes a summary whose val errors depend on the seed."""
import json, os, sys
if '--version' in sys.argv:
    sys.exit(0)
cfg = json.loads(os.environ['THEANOMPI_EXT_WORKER_CONFIG'])   # launch/worker_job.CONFIG_VAR
mode = os.environ['FAKE_MODE']
if mode == 'diverge' and cfg['seed'] == 1:
    print('theanompi-ext: rank 0 of 2 failed: NonFiniteLoss: non-finite loss (nan)')
    sys.exit(3)
if mode == 'fail' and cfg['seed'] == 1:
    sys.exit(1)
if mode == 'killonce' and cfg['seed'] == 1 and os.environ['THEANOMPI_EXT_ATTEMPT'] == '0':
    print('theanompi-ext: rank 1 of 2 (pid 7 on h) died: Killed (signal 9); mpiexec '
          'stopped the other ranks (exit status 9)')
    sys.exit(9)
# run i has val errors (10 - epoch + seed) / 100 for epochs 1..6
hist = [dict(epoch=e, train_loss=1.0 / e, train_err=0.1, lr=0.1,
             val_top1=(10 - e + cfg['seed']) / 100.0, val_top5=0.0) for e in range(1, 7)]
with open(os.path.join(cfg['out'], 'summary.json'), 'w') as f:
    json.dump(dict(workers=2, history=hist, config=cfg, iterations=60, wall_s=1.0,
                   final_val_top1=hist[-1]['val_top1'], final_val_top5=0.0,
                   step_s_median=0.01), f)
'''


def _run_trials(argv, env=None, timeout=300):
    full = dict(os.environ)
    full.update(env or {})
    return subprocess.run([sys.executable, '-m', 'theanompi_ext', 'trials'] + argv,
                          capture_output=True, text=True, timeout=timeout, env=full)


@pytest.fixture
def fake_mpiexec(tmp_path):
    path = tmp_path / 'fake-mpiexec'
    path.write_text(FAKE_MPIEXEC % sys.executable)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_trials_aggregates_runs_by_hand(tmp_path, fake_mpiexec):
    out = tmp_path / 'out'
    r = _run_trials(['--runs', '3', '--workers', '2', '--epochs', '6', '--seed', '0',
                     '--out', str(out)],
                    env=dict(THEANOMPI_EXT_MPIEXEC=fake_mpiexec, FAKE_MODE='ok'))
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads((out / 'trials.json').read_text())
    (s,) = doc['settings']
    # run i: epochs 2..6 have errors (8..4 + i)/100 -> median (6 + i)/100
    assert [x['error'] for x in s['runs']] == pytest.approx([0.06, 0.07, 0.08])
    assert [x['error_epochs'] for x in s['runs']] == [[2, 3, 4, 5, 6]] * 3
    assert [(x['seed'], x['data_seed']) for x in s['runs']] == [(0, 0), (1, 1), (2, 2)]
    assert [x['out'] for x in s['runs']] == [str(out / ('run%d' % i)) for i in range(3)]
    assert s['mean'] == pytest.approx(0.07) and s['std'] == pytest.approx(0.01)
    assert s['n_ok'] == 3 and s['total_batch'] == 64
    assert (out / 'trials.png').exists()
    assert '7.00 +- 1.00' in r.stdout


def test_trials_restarts_a_run_whose_rank_was_killed(tmp_path, fake_mpiexec):
    """--max-restarts reaches each run (train/restarts.py): run 1's first attempt
    ends with a killed rank, its restart finishes; both are in its log."""
    out = tmp_path / 'out'
    r = _run_trials(['--runs', '2', '--workers', '2', '--epochs', '6', '--out', str(out),
                     '--max-restarts', '1', '--restart-backoff-s', '0'],
                    env=dict(THEANOMPI_EXT_MPIEXEC=fake_mpiexec, FAKE_MODE='killonce'))
    assert r.returncode == 0, r.stdout + r.stderr
    (s,) = json.loads((out / 'trials.json').read_text())['settings']
    assert s['n_ok'] == 2
    log = json.loads((out / 'run1' / 'restarts.json').read_text())
    assert [(f['status'], f['rank'], f['restarted']) for f in log['failures']] == [(9, 1, True)]
    assert not (out / 'run0' / 'restarts.json').exists()
    text = (out / 'run1' / 'train.log').read_text()
    assert text.count('$ ') == 2 and 'died: Killed (signal 9)' in text


def test_trials_reports_diverged_and_failed_runs(tmp_path, fake_mpiexec):
    out = tmp_path / 'out'
    env = dict(THEANOMPI_EXT_MPIEXEC=fake_mpiexec, FAKE_MODE='diverge')
    r = _run_trials(['--runs', '3', '--epochs', '6', '--out', str(out),
                     '--setting', 'a:--workers 2', '--setting', 'b:--seed 10'], env=env)
    assert r.returncode == 0, r.stdout + r.stderr       # diverging is a result, not an error
    doc = json.loads((out / 'trials.json').read_text())
    a, b = doc['settings']
    assert [x['status'] for x in a['runs']] == ['ok', 'diverged', 'ok']
    assert a['n_diverged'] == 1 and a['mean'] == pytest.approx(0.07)
    assert a['std'] == pytest.approx(math.sqrt(2e-4))
    assert 'NonFiniteLoss' in a['runs'][1]['reason']
    assert (out / 'a' / 'run1' / 'train.log').exists()
    assert [x['seed'] for x in b['runs']] == [10, 11, 12] and b['n_ok'] == 3
    assert 'diverged' in r.stdout
    env['FAKE_MODE'] = 'fail'
    r = _run_trials(['--runs', '2', '--epochs', '6', '--out', str(tmp_path / 'f')], env=env)
    assert r.returncode == 3
    doc = json.loads((tmp_path / 'f' / 'trials.json').read_text())
    assert [x['status'] for x in doc['settings'][0]['runs']] == ['ok', 'failed']


def test_trials_reuse_keeps_finished_runs(tmp_path, fake_mpiexec):
    out = tmp_path / 'out'
    argv = ['--runs', '2', '--workers', '2', '--epochs', '6', '--out', str(out)]
    env = dict(THEANOMPI_EXT_MPIEXEC=fake_mpiexec, FAKE_MODE='ok')
    assert _run_trials(argv, env=env).returncode == 0
    # run 1 would fail now; --reuse reads its summary instead of training again
    env['FAKE_MODE'] = 'fail'
    r = _run_trials(argv + ['--reuse', '--runs', '3'], env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    (s,) = json.loads((out / 'trials.json').read_text())['settings']
    assert [x.get('reused', False) for x in s['runs']] == [True, True, False]
    assert [x['error'] for x in s['runs']] == pytest.approx([0.06, 0.07, 0.08])
    assert '(reused)' in r.stdout
    # a changed option is a different run: not reused, so run 1 fails
    r = _run_trials(argv + ['--reuse', '--weight-decay', '0.001'], env=env)
    assert r.returncode == 3


def test_trials_refuses_bad_options(tmp_path):
    for argv, msg in ((['--runs', '0', '--out', 'x'], '--runs'),
                      (['--runs', '2'], '--out'),
                      (['--out', 'x', '--setting', 'a:--epochs 2', '--setting', 'a:--epochs 3'],
                       'twice'),
                      (['--out', 'x', '--setting', 'a:--warmup-epochs 9 --epochs 3'],
                       'warmup_epochs')):
        r = _run_trials(argv)
        assert r.returncode == 2 and msg in r.stderr, (argv, r.stderr)


def test_trials_two_real_runs(tmp_path):
    """Two real one-rank runs (a minute at most): well-formed trials.json."""
    out = tmp_path / 'trials'
    r = _run_trials(['--runs', '2', '--epochs', '2', '--warmup-epochs', '1',
                     '--batch-per-worker', '64', '--ref-batch', '64', '--seed', '3',
                     '--data-seed', '5', '--out', str(out)], timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    doc = json.loads((out / 'trials.json').read_text())
    assert doc['protocol']['last_epochs'] == 5
    (s,) = doc['settings']
    assert s['n_runs'] == s['n_ok'] == 2 and s['epochs_used'] == 2
    errs = []
    for i, run in enumerate(s['runs']):
        assert (run['seed'], run['data_seed']) == (3 + i, 5 + i)
        summary = json.loads((out / ('run%d' % i) / 'summary.json').read_text())
        assert summary['config']['seed'] == 3 + i and summary['config']['data_seed'] == 5 + i
        vals = [h['val_top1'] for h in summary['history']]
        assert run['error'] == pytest.approx(sum(vals) / 2)      # median of two
        assert 0 <= run['error'] <= 1
        assert (out / ('run%d' % i) / 'curves.png').exists()
        errs.append(run['error'])
    mean, std = trials.mean_std(errs)
    assert s['mean'] == pytest.approx(mean) and s['std'] == pytest.approx(std)
    assert (out / 'trials.png').exists()
    assert 'only 2 evaluated epoch(s)' in r.stdout


def test_trials_is_a_listed_command():
    from theanompi_ext.cli.commands import COMMANDS
    assert 'theanompi_ext.train.trials' in COMMANDS
    r = subprocess.run([sys.executable, '-m', 'theanompi_ext', 'trials', '--help'],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and '--setting' in r.stdout
