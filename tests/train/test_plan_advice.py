"""The plan before launch and the warnings for unlikely settings (issue 19).

The learning rates are computed here from the paper's formulas (linear
scaling, per-iteration gradual warm-up, step decay), not with the package's
Schedule.
"""
import os
import re
import subprocess
import sys

import pytest

from support.procs import mpiexec
from theanompi_ext.train import advice
from theanompi_ext.train.config import TrainConfig

N_DIGITS_TRAIN = 1438          # the built-in digits' training split (test_bad_input)
ROW = re.compile(r'^\s+iteration\s+(\d+)\s+epoch\s+(\d+)\s+lr\s+(\S+)\s+(.*)$', re.M)


def cli(*args, timeout=120):
    return subprocess.run([sys.executable, '-m', 'theanompi_ext'] + list(args),
                          capture_output=True, text=True, timeout=timeout)


def paper_lr(it, base, kn, ref, warm_iters, ipe, decays, factor):
    """Goyal et al. 2017: eta = base*kn/ref; gradual warm-up from base over warm_iters
    iterations; multiplied by factor at each decay epoch."""
    target = base * kn / ref
    if it < warm_iters:
        return base + (target - base) * it / warm_iters
    return target * factor ** sum(it // ipe >= e for e in decays)


def rows(text):
    return {int(m.group(1)): (int(m.group(2)), float(m.group(3)), m.group(4).strip())
            for m in ROW.finditer(text)}


def test_dry_run_prints_the_schedule_and_launches_nothing(tmp_path):
    out = tmp_path / 'run'
    r = cli('train', '--dry-run', '--workers', '2', '--batch-per-worker', '16',
            '--base-lr', '0.05', '--ref-batch', '16', '--warmup-epochs', '2', '--epochs', '10',
            '--decay-epochs', '4,7', '--momentum-form', 'eq10', '--out', str(out))
    assert r.returncode == 0, r.stderr
    kn, ipe = 32, N_DIGITS_TRAIN // 32                     # 44 iterations per epoch
    assert 'k x n         2 x 16 = 32' in r.stdout
    assert '%d per epoch, %d in total' % (ipe, 10 * ipe) in r.stdout
    got = rows(r.stdout)
    named = {0: 'start', 2 * ipe: 'end of warm-up', 4 * ipe: 'after decay 1 (epoch 4)',
             7 * ipe: 'after decay 2 (epoch 7)', 10 * ipe - 1: 'last iteration'}
    assert sorted(got) == sorted(named)
    for it, what in named.items():
        epoch, lr, label = got[it]
        assert epoch == it // ipe and label == what
        want = paper_lr(it, 0.05, kn, 16, 2 * ipe, ipe, (4, 7), 0.1)
        assert lr == pytest.approx(want, rel=1e-5), (it, lr, want)
    assert [got[i][1] for i in sorted(got)] == pytest.approx([0.05, 0.1, 0.01, 0.001, 0.001])
    assert 'eq. 10' in r.stdout and 'momentum correction' in r.stdout
    # digits_cnn: every parameter but BN gamma/beta is exchanged, as float32
    m = re.search(r'(\d+) of (\d+) parameters = ([0-9.]+) KB per iteration in (\d+) bucket',
                  r.stdout)
    assert m and int(m.group(1)) < int(m.group(2))
    assert float(m.group(3)) == pytest.approx(4 * int(m.group(1)) / 1e3, rel=1e-2)
    assert re.search(r'backward in \d+ chunks', r.stdout)
    assert 'path          mpi, 2 ranks, topology auto (two-level when several hosts have several ranks); device cpu' in r.stdout
    assert str(out) in r.stdout and 'checkpoint.h5' in r.stdout
    assert not out.exists() and 'mpiexec' not in r.stdout + r.stderr
    assert 'warning' not in r.stderr


def test_dry_run_warns_once_when_the_warm_up_lowers_the_rate():
    # the case: k=1, n=16 with the ImageNet defaults
    r = cli('train', '--dry-run', '--batch-per-worker', '16', '--epochs', '10',
            '--decay-epochs', '')
    assert r.returncode == 0, r.stderr
    ipe = N_DIGITS_TRAIN // 16
    got = rows(r.stdout)
    w = 5 * ipe
    assert got[0][1] == pytest.approx(0.1)
    assert got[w][1] == pytest.approx(paper_lr(w, 0.1, 16, 256, w, ipe, (), 0.1))  # 0.00625
    assert r.stderr.count('warning:') == 1
    assert 'warm-up starts at 0.1 and ramps it down to 0.00625' in r.stderr
    assert '--warmup none' in r.stderr and '--ref-batch 16' in r.stderr


def test_trials_dry_run_plans_every_setting(tmp_path):
    out = tmp_path / 'trials'
    r = cli('trials', '--dry-run', '--runs', '3', '--out', str(out), '--epochs', '6',
            '--batch-per-worker', '16', '--ref-batch', '32', '--warmup', 'none',
            '--decay-epochs', '3', '--setting', 'k1:--workers 1', '--setting', 'k2:--workers 2')
    assert r.returncode == 0, r.stderr
    plans = r.stdout.split('setting ')[1:]
    assert [p.split(',')[0] for p in plans] == ['k1', 'k2']
    for k, plan in zip((1, 2), plans):
        kn, ipe = 16 * k, N_DIGITS_TRAIN // (16 * k)
        got = rows(plan)
        assert got[0][1] == pytest.approx(0.1 * kn / 32)
        assert got[3 * ipe][1] == pytest.approx(0.01 * kn / 32)
        assert os.path.join(str(out), 'k%d' % k, 'run0') in plan
    assert not out.exists()


def test_bad_input_of_a_dry_run_is_status_2(tmp_path):
    r = cli('train', '--dry-run', '--data', str(tmp_path / 'missing.h5'))
    assert r.returncode == 2 and 'missing.h5' in r.stderr


# --------------------------------------------------------------------------- warnings

def paper(**kw):
    """The paper's ImageNet recipe at kn = 8 x 32 = 256."""
    base = dict(batch_per_worker=32, epochs=90, base_lr=0.1, ref_batch=256, warmup='gradual',
                warmup_epochs=5, decay_epochs=(30, 60, 80), decay_factor=0.1,
                momentum=0.9, momentum_form='eq9')
    base.update(kw)
    return TrainConfig(**base).validate()


@pytest.mark.parametrize('form', ['eq9', 'eq10'])
def test_no_warning_for_the_papers_recipe(form):
    assert advice.check(paper(momentum_form=form), workers=8, cores=8) == []
    assert advice.check(paper(momentum_form=form), workers=8, cores=None) == []


@pytest.mark.parametrize('warmup', ['gradual', 'constant'])
def test_warm_up_that_lowers_the_rate(warmup):
    text = advice.warmup_lowers_rate(paper(batch_per_worker=16, warmup=warmup), 1)
    assert text and 'below --ref-batch 256' in text and '0.00625' in text
    assert '--warmup none' in text and '--ref-batch 16' in text
    assert advice.warmup_lowers_rate(paper(batch_per_worker=16, warmup='none'), 1) is None
    assert advice.warmup_lowers_rate(paper(), 8) is None                  # kn = ref
    assert advice.warmup_lowers_rate(paper(), 16) is None                 # kn > ref: rises


def test_decay_at_or_beyond_the_last_epoch():
    text = advice.decay_after_end(paper(epochs=10))
    assert 'decay epochs 30,60,80 are at or beyond' in text
    # 30/90, 60/90, 80/90 of a 10-epoch run: 3.3, 6.7, 8.9 -> 3,7,9
    assert '--decay-epochs 3,7,9' in text
    text = advice.decay_after_end(paper(epochs=30, decay_epochs=(10, 30)))
    assert 'decay epoch 30 is at or beyond' in text          # 30 == last + 1: never
    assert advice.decay_after_end(paper(epochs=31, decay_epochs=(10, 30))) is None


def test_warm_up_longer_than_the_first_decay():
    assert 'first decay (epoch 4)' in advice.warmup_past_decay(
        paper(epochs=10, warmup_epochs=5, decay_epochs=(4, 8)))
    assert advice.warmup_past_decay(paper(epochs=10, warmup_epochs=5, decay_epochs=(5,)))
    assert advice.warmup_past_decay(paper(epochs=10, warmup_epochs=3, decay_epochs=(5,))) \
        is None
    # Theano-MPI's warm-up lasts 5 epochs whatever --warmup-epochs says
    assert advice.warmup_past_decay(paper(epochs=10, warmup='theanompi', warmup_epochs=1,
                                          decay_epochs=(3,)))
    assert advice.warmup_past_decay(paper(epochs=10, warmup='none', decay_epochs=(1,))) is None


def test_more_ranks_than_cores():
    text = advice.ranks_exceed_cores(paper(), 4, cores=2)
    assert '4 ranks on 2 cores' in text and '--workers 2' in text and '--hostfile' in text
    assert advice.ranks_exceed_cores(paper(), 2, cores=2) is None
    assert advice.ranks_exceed_cores(paper(), 64, cores=None) is None     # several machines


def test_eq10_without_correction_while_the_rate_changes():
    text = advice.uncorrected_momentum(paper(momentum_form='eq10-nocorrect'), 8)
    assert 'the decays' in text and '--momentum-form eq10' in text
    assert 'warm-up' in advice.uncorrected_momentum(
        paper(momentum_form='eq10-nocorrect', decay_epochs=()), 16)
    # a constant rate: nothing to correct
    assert advice.uncorrected_momentum(
        paper(momentum_form='eq10-nocorrect', warmup='none', decay_epochs=()), 8) is None
    assert advice.uncorrected_momentum(paper(momentum_form='eq10'), 8) is None


def test_dry_run_inside_your_own_mpiexec_prints_once_and_ends():
    """Inside a user's mpiexec only rank 0 prints the plan, and the job ends: rank 0's
    Theano import starts MPI, which waits for every rank (it hung before)."""
    cmd = [mpiexec(), '-n', '2', sys.executable, '-m', 'theanompi_ext', 'train', '--dry-run',
           '--batch-per-worker', '128', '--epochs', '4', '--decay-epochs', '3',
           '--warmup-epochs', '1']
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                           start_new_session=True)
    except subprocess.TimeoutExpired:
        pytest.fail('train --dry-run inside mpiexec -n 2 hung')
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count('k x n         2 x 128 = 256 examples per iteration') == 1, r.stdout
