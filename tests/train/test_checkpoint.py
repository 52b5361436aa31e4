"""Checkpoints: resume reproduces an uninterrupted run bitwise; bad checkpoints are refused."""
import json

import h5py
import numpy as np
import pytest


def cfg(tmp_path, name, **kw):
    d = dict(model='digits_cnn', batch_per_worker=16, epochs=3, base_lr=0.05, ref_batch=32,
             warmup='gradual', warmup_epochs=1, decay_epochs=[2], quiet=True,
             out=str(tmp_path / 'run'), extra={'train_subset': 128, 'model_kw': {'width': 8}})
    d.update(kw)
    p = tmp_path / (name + '.json')
    p.write_text(json.dumps(d))
    return p


def reseal(path):
    """Take the checksum of ``path`` again (after an edit made on purpose)."""
    from theanompi_ext.files import sealed
    data = bytearray(path.read_bytes())
    data[:sealed.USERBLOCK] = bytes(sealed.USERBLOCK)
    path.write_bytes(sealed.seal(bytes(data)))


def load(path):
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def test_resume_reproduces_uninterrupted_run_bitwise(mpirun, tmp_path):
    full = tmp_path / 'full'
    full.mkdir()
    r = mpirun(2, 'run_train.py', cfg(tmp_path, 'a', out=str(full)), full, timeout=400)
    assert r.returncode == 0, r.stderr[-2000:]
    part = tmp_path / 'part'
    part.mkdir()
    # stop in the middle of epoch 2 (4 iterations per epoch), then resume
    r = mpirun(2, 'run_train.py', cfg(tmp_path, 'b', out=str(part), max_steps=6), part,
               timeout=400)
    assert r.returncode == 0, r.stderr[-2000:]
    with h5py.File(part / 'checkpoint.h5', 'r') as f:
        assert f.attrs['iteration'] == 6
    r = mpirun(2, 'run_train.py', cfg(tmp_path, 'c', out=str(part), resume=True), part,
               timeout=400)
    assert r.returncode == 0, r.stderr[-2000:]
    for rank in (0, 1):
        a, b = load(full / ('rank%d.npz' % rank)), load(part / ('rank%d.npz' % rank))
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    sa = json.loads((full / 'summary.json').read_text())
    sb = json.loads((part / 'summary.json').read_text())
    assert sb['iterations'] == sa['iterations'] == 12
    assert [h['val_top1'] for h in sa['history']] == [h['val_top1'] for h in sb['history']]


@pytest.fixture(scope='module')
def one_rank_checkpoint(tmp_path_factory):
    """A 1-rank run that leaves a checkpoint, and a builder for trainers."""
    from theanompi_ext.train.config import TrainConfig
    from theanompi_ext.train.worker import run
    out = tmp_path_factory.mktemp('ck')
    c = TrainConfig(model='digits_cnn', batch_per_worker=16, epochs=2, warmup='none',
                    quiet=True, out=str(out), extra={'train_subset': 64, 'model_kw': {'width': 8}})
    run(c)
    return out


def make_trainer(out, **kw):
    from theanompi_ext.collective.local import LocalCommunicator
    from theanompi_ext.data.digits import load_digits
    from theanompi_ext.model import build_model
    from theanompi_ext.train.config import TrainConfig
    from theanompi_ext.train.trainer import Trainer
    model_kw = kw.pop('model_kw', {'width': 8})
    c = TrainConfig(model=kw.pop('model', 'digits_cnn'), batch_per_worker=16, epochs=2,
                    warmup='none', quiet=True, out=str(out), **kw)
    data = load_digits(train_subset=64)
    return Trainer(build_model(c.model, data.input_shape, 10, **model_kw), data, c,
                   LocalCommunicator())


def test_checkpoint_of_another_model_is_refused(one_rank_checkpoint):
    from theanompi_ext.train.checkpoint import CheckpointError
    tr = make_trainer(one_rank_checkpoint, model_kw={'width': 4})
    with pytest.raises(CheckpointError, match='another model.*first difference'):
        tr.resume()


def test_truncated_checkpoint_is_refused_and_not_overwritten(one_rank_checkpoint, tmp_path):
    from theanompi_ext.train.checkpoint import CheckpointError
    src = one_rank_checkpoint / 'checkpoint.h5'
    data = src.read_bytes()
    (tmp_path / 'checkpoint.h5').write_bytes(data[:len(data) // 2])
    tr = make_trainer(tmp_path)
    with pytest.raises(CheckpointError, match='checkpoint.h5'):
        tr.resume()
    assert (tmp_path / 'checkpoint.h5').read_bytes() == data[:len(data) // 2]


def test_other_rank_count_is_refused(one_rank_checkpoint, tmp_path):
    from theanompi_ext.train.checkpoint import CheckpointError
    (tmp_path / 'checkpoint.h5').write_bytes((one_rank_checkpoint / 'checkpoint.h5').read_bytes())
    with h5py.File(tmp_path / 'checkpoint.h5', 'r+') as f:
        f.attrs['workers'] = 4
    reseal(tmp_path / 'checkpoint.h5')      # a file edited on purpose, not a corrupt one
    with pytest.raises(CheckpointError, match='written by 4 ranks; resuming with 1'):
        make_trainer(tmp_path).resume()


def test_missing_checkpoint_named(tmp_path):
    from theanompi_ext.train.checkpoint import CheckpointError
    with pytest.raises(CheckpointError, match='no checkpoint'):
        make_trainer(tmp_path).resume()


def test_summary_line_without_a_validation_pass():
    """A run stopped inside its first epoch says so instead of printing nan."""
    from theanompi_ext.train.worker import format_summary
    base = dict(workers=2, total_batch=64, iterations=4, wall_s=1.5, step_s_median=0.07)
    line = format_summary(dict(base, final_val_top1=None, final_val_top5=None))
    assert line == ('summary: 2 workers, batch 64, 4 iterations in 1.5s (median step 70.0 ms); '
                    'no validation pass ran')
    line = format_summary(dict(base, final_val_top1=0.05, final_val_top5=0.01))
    assert line.endswith('final val top-1 error 0.0500, top-5 error 0.0100')
