"""The learning-rate schedule against hand-computed values."""
import pytest

from theanompi_ext.update.schedule import Schedule


def sched(**kw):
    base = dict(base_lr=0.1, total_batch=1024, iters_per_epoch=10, epochs=90,
                ref_batch=256, warmup='gradual', warmup_epochs=5)
    base.update(kw)
    return Schedule(**base)


def test_linear_scaling_rule():
    assert sched().target_lr == pytest.approx(0.4)          # 0.1 * 1024/256
    assert sched(total_batch=8192).target_lr == pytest.approx(3.2)  # the paper's 8k


def test_gradual_warmup_per_iteration_by_hand():
    s = sched()  # 50 warm-up iterations from 0.1 to 0.4: +0.006 per iteration
    assert s.warmup_iters == 50
    assert s.lr(0) == pytest.approx(0.1)
    assert s.lr(1) == pytest.approx(0.106)
    assert s.lr(25) == pytest.approx(0.25)
    assert s.lr(49) == pytest.approx(0.394)
    assert s.lr(50) == pytest.approx(0.4)
    # it changes every iteration, not once per epoch
    assert len({s.lr(i) for i in range(10)}) == 10


def test_step_decay_at_30_60_80():
    s = sched()
    assert s.lr(299) == pytest.approx(0.4)
    assert s.lr(300) == pytest.approx(0.04)
    assert s.lr(600) == pytest.approx(0.004)
    assert s.lr(800) == pytest.approx(0.0004)


def test_constant_and_no_warmup():
    c = sched(warmup='constant')
    assert c.lr(0) == c.lr(49) == pytest.approx(0.1)
    assert c.lr(50) == pytest.approx(0.4)
    n = sched(warmup='none')
    assert n.lr(0) == pytest.approx(0.4)


def test_theanompi_geometric_per_epoch_warmup():
    s = sched(warmup='theanompi', workers=8)
    assert s.lr(0) == pytest.approx(0.1)
    assert s.lr(9) == pytest.approx(0.1)                  # constant within an epoch
    assert s.lr(10) == pytest.approx(0.1 * 8 ** 0.2)
    assert s.lr(50) == pytest.approx(0.8)
    assert s.lr(70) == pytest.approx(0.8)


@pytest.mark.parametrize('kw,msg', [
    (dict(base_lr=-0.1), 'base_lr'),
    (dict(base_lr=0), 'base_lr'),
    (dict(warmup_epochs=90), 'shorter than training'),
    (dict(warmup='linear'), 'unknown warmup'),
    (dict(decay_epochs=(60, 30)), 'decay_epochs'),
    (dict(iters_per_epoch=0), 'iters_per_epoch'),
])
def test_bad_schedules_are_refused(kw, msg):
    with pytest.raises(ValueError, match=msg):
        sched(**kw)
