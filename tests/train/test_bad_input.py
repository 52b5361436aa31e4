"""Bad input gets a clear error and never a hang."""
import json
import os
import subprocess
import sys

import pytest

from theanompi_ext.train.config import TrainConfig


@pytest.mark.parametrize('kw,msg', [
    (dict(base_lr=-0.1), 'base_lr.*> 0'),
    (dict(warmup_epochs=12, epochs=10), 'warmup_epochs.*shorter than training'),
    (dict(sync_type='swap'), "sync_type.*choose from"),
    (dict(exch_strategy='nccl99'), 'exch_strategy'),
    (dict(batch_per_worker=0), 'batch_per_worker'),
    (dict(momentum=1.5), 'momentum'),
    (dict(sync_type='avg', exch_strategy='ar-overlap'), 'overlap exists only'),
    (dict(decay_epochs=(20, 10)), r'decay_epochs=\(20, 10\).*strictly increasing'),
    (dict(decay_epochs=(0,)), r'decay_epochs.*>= 1'),
    (dict(decay_epochs=(10, 10)), r'decay_epochs.*strictly increasing'),
    (dict(decay_epochs=(2.5,)), r'decay_epochs.*whole epochs'),
    (dict(decay_epochs='30'), r'decay_epochs.*whole epochs'),
])
def test_invalid_options_rejected(kw, msg):
    with pytest.raises(ValueError, match=msg):
        TrainConfig(**kw).validate()


def test_default_exchange_overlaps_where_it_exists():
    assert TrainConfig().validate().exch_strategy == 'ar-overlap'
    assert TrainConfig(sync_type='avg').validate().exch_strategy == 'ar'
    assert TrainConfig(sync_type='cdd').validate().exch_strategy == 'ar'
    assert TrainConfig(exch_strategy='ar').validate().exch_strategy == 'ar'


def test_unknown_option_names_refused():
    with pytest.raises(ValueError, match='unknown option.*learning_rate'):
        TrainConfig.from_dict({'learning_rate': 0.1})


def cli(*args, timeout=120):
    return subprocess.run([sys.executable, '-m', 'theanompi_ext'] + list(args),
                          capture_output=True, text=True, timeout=timeout)


def test_cli_rejects_bad_options_with_status_2():
    r = cli('train', '--base-lr', '-1')
    assert r.returncode == 2 and 'base_lr' in r.stderr
    r = cli('train', '--sync-type', 'swap')
    assert r.returncode == 2 and 'sync_type' in r.stderr


def test_decay_epochs_accepted_forms():
    assert TrainConfig(decay_epochs=[5, 8]).validate().decay_epochs == (5, 8)
    assert TrainConfig(decay_epochs=()).validate().decay_epochs == ()


@pytest.mark.parametrize('text,want', [
    ('30,60,80', (30, 60, 80)), ('(5, 8)', (5, 8)), ("''", ()), ('', ()), ('30.0', (30,)),
    ('2.5', None), ('1,x', None), ('1e400', None), ('nan', None), ('true', None)])
def test_decay_epochs_option_parsed_or_named(text, want, capsys):
    # 2.5 used to become 2 silently, before the config's own check could see it; the
    # error named argparse's function ("invalid _parse_tuple value")
    import argparse
    from theanompi_ext.train import options
    parser = argparse.ArgumentParser(prog='t')
    options.add_config_arguments(parser)
    if want is not None:
        assert parser.parse_args(['--decay-epochs', text]).decay_epochs == want
        return
    with pytest.raises(SystemExit):
        parser.parse_args(['--decay-epochs', text])
    assert ("argument --decay-epochs: expected whole numbers separated by commas (e.g. "
            "30,60,80; '' for none), got %r" % text) in capsys.readouterr().err
    # the same words for a config file's key
    with pytest.raises(ValueError, match=r'config key DECAY_EPOCHS: expected whole numbers'):
        options.config_from(parser.parse_args([]), {'decay_epochs': text})


def test_bad_decay_epochs_refused_before_launch():
    # Used to pass validation, start mpiexec, and fail on every rank (status 3).
    r = cli('train', '--workers', '2', '--decay-epochs', '20,10')
    assert r.returncode == 2, r.stdout + r.stderr
    assert 'decay_epochs=(20, 10)' in r.stderr and 'strictly increasing' in r.stderr
    assert 'mpiexec' not in r.stdout + r.stderr


def test_minibatch_larger_than_data_is_bad_input():
    from theanompi_ext.data.shards import iterations_per_epoch
    from theanompi_ext.errors import exit_status, EXIT_BAD_INPUT
    with pytest.raises(ValueError, match=r'1438 examples, fewer than one minibatch of '
                                         r'k\*n = 2\*1000 = 2000') as err:
        iterations_per_epoch(1438, 2, 1000)
    assert exit_status(err.value) == EXIT_BAD_INPUT
    assert iterations_per_epoch(1438, 2, 32) == 22


def test_config_file_unknown_key_named(tmp_path):
    p = tmp_path / 'session.cfg'
    p.write_text('epochs = 3\nLEARNING_RATE = 0.2\n')
    r = cli('train', '--config', str(p))
    assert r.returncode == 2 and 'LEARNING_RATE' in r.stderr and 'line 2' in r.stderr


def test_config_file_key_given_twice_names_both_lines(tmp_path):
    from theanompi_ext.train.options import read_kv_file
    p = tmp_path / 'session.cfg'
    p.write_text('epochs=2\n# the last one used to win\nbatch_per_worker = 8\nEPOCHS = 0\n')
    with pytest.raises(ValueError, match=r'session.cfg line 4: key EPOCHS given twice '
                                         r'\(line 1 already set it\)'):
        read_kv_file(str(p))
    r = cli('train', '--config', str(p), '--dry-run')
    assert r.returncode == 2 and 'line 4: key EPOCHS given twice (line 1' in r.stderr, r.stderr
    p.write_text('epochs=2\nbatch_per_worker = 8\n')
    assert read_kv_file(str(p)) == {'epochs': '2', 'batch_per_worker': '8'}


def test_config_files_saved_by_a_windows_editor_read_as_any_other(tmp_path):
    """A byte-order mark and CR LF line ends (Notepad's way): the keys as written,
    in ``train --config`` and in a Theano-MPI session file. Before: "unknown key
    '\\ufeffEPOCHS'"."""
    from theanompi_ext.theanompi_compat.session import read_session_file
    from theanompi_ext.train.options import read_kv_file
    p = tmp_path / 'win.cfg'
    p.write_bytes(b'\xef\xbb\xbfepochs = 2\r\nbatch_per_worker = 8\r\n')
    assert read_kv_file(str(p)) == {'epochs': '2', 'batch_per_worker': '8'}
    p.write_bytes(b'\xef\xbb\xbfRULE=BSP\r\nDEVICES=(cpu0\r\n cpu1)\r\n')
    assert read_session_file(str(p), {'rule', 'devices'}) == {'rule': 'BSP',
                                                              'devices': ['cpu0', 'cpu1']}


@pytest.mark.parametrize('target,why', [('missing', 'no such file'),
                                        ('plain', 'not executable')])
def test_mpiexec_variable_naming_no_program_is_bad_input(tmp_path, target, why):
    """THEANOMPI_EXT_MPIEXEC that names no program: exit 2 naming it, no traceback."""
    from theanompi_ext.errors import BadInput
    from theanompi_ext.launch.mpiexec import find_mpiexec
    path = tmp_path / 'mpiexec'
    if target == 'plain':
        path.write_text('#!/bin/sh\n')          # exists, not executable
    env = dict(os.environ, THEANOMPI_EXT_MPIEXEC=str(path))
    r = subprocess.run([sys.executable, '-m', 'theanompi_ext', 'train', '--workers', '2',
                        '--epochs', '1', '--warmup', 'none'], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 2, r.stdout + r.stderr
    assert 'THEANOMPI_EXT_MPIEXEC=%s: %s' % (path, why) in r.stderr
    assert 'Traceback' not in r.stderr
    old = os.environ.get('THEANOMPI_EXT_MPIEXEC')
    try:
        os.environ['THEANOMPI_EXT_MPIEXEC'] = str(path)
        with pytest.raises(BadInput, match=why):
            find_mpiexec()
        path.write_text('#!/bin/sh\n')
        path.chmod(0o755)                          # now a program: taken as it is
        assert find_mpiexec() == str(path)
    finally:
        if old is None:
            del os.environ['THEANOMPI_EXT_MPIEXEC']
        else:
            os.environ['THEANOMPI_EXT_MPIEXEC'] = old


@pytest.mark.parametrize('k', [2, 3])
def test_models_that_differ_across_ranks_are_detected(mpirun, tmp_path, k):
    # The last rank builds a wider hidden layer than the others.
    cfg = dict(model='mlp', epochs=2, warmup='none', quiet=True, batch_per_worker=8,
               extra={'train_subset': 64, 'model_kw': {'hidden': [16]}})
    (tmp_path / 'cfg.json').write_text(json.dumps(cfg))
    over = {str(k - 1): {'extra': {'train_subset': 64, 'model_kw': {'hidden': [17]}}}}
    (tmp_path / 'over.json').write_text(json.dumps(over))
    res = mpirun(k, 'run_train.py', tmp_path / 'cfg.json', tmp_path, tmp_path / 'over.json',
                 timeout=200)
    # docs/faults.md: ranks given different models are bad input, status 2
    assert res.returncode == 2, res.stderr[-3000:]
    assert 'the model on rank %d differs from rank 0' % (k - 1) in res.stderr \
        and '(16, 10)' in res.stderr \
        and '(17, 10)' in res.stderr
    assert not (tmp_path / 'rank0.npz').exists()        # no step was taken


@pytest.mark.parametrize('ranks', [1, 2])
def test_non_finite_loss_stops_with_iteration(mpirun, ranks):
    res = mpirun(ranks, 'run_nonfinite.py', timeout=200)
    # docs/faults.md: a non-finite loss is a failed training, status 3
    assert res.returncode == 3, res.stderr[-3000:]
    assert 'non-finite loss' in res.stderr and 'at iteration' in res.stderr


@pytest.mark.parametrize('argv', [
    ['bench', 'overlap', '--quick', '--json', '{missing}/out.json'],
    ['bench', 'overlap', '--quick', '--timeline', '{missing}/trace'],
    ['bench', 'allreduce', '--json', '{missing}/out.json'],
    ['bench', 'compare', '--quick', '--json', '{missing}/out.json'],
    ['simulate', '--preset', 'goyal2017', '--plot', '{missing}/eff.png'],
])
def test_output_in_missing_folder_refused_before_running(tmp_path, capsys, argv):
    # A benchmark measures for minutes before writing: a typo in the folder
    # must stop it when the options are read, naming the folder.
    from theanompi_ext.cli.commands import build_parser
    missing = str(tmp_path / 'no_such_dir')
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args([a.format(missing=missing) for a in argv])
    assert exc.value.code == 2
    assert "folder %r does not exist" % missing in capsys.readouterr().err
    # an existing folder is accepted
    ok = [a.format(missing=str(tmp_path)) for a in argv]
    build_parser().parse_args(ok)
