"""Eq. (9) vs eq. (10) with and without momentum correction, in numpy."""
import numpy as np
import pytest

from theanompi_ext.update.momentum import Optimizer
from theanompi_ext.update.schedule import Schedule


def trajectory(form, nesterov=False, steps=40, decay=1e-2):
    rng = np.random.RandomState(0)
    w = rng.randn(50).astype(np.float32)
    opt = Optimizer(50, momentum=0.9, form=form, nesterov=nesterov, decay=decay)
    # warm-up over 10 iterations, then a /10 decay at iteration 30
    s = Schedule(0.1, 1024, 10, 5, warmup='gradual', warmup_epochs=1, decay_epochs=(3,))
    out = []
    for t in range(steps):
        g = (0.5 * w + rng.randn(50)).astype(np.float32)
        opt.step(w, g, s.lr(t))
        out.append(w.copy())
    return np.array(out)


@pytest.mark.parametrize('nesterov', [False, True])
def test_eq9_equals_eq10_with_correction(nesterov):
    a, b = trajectory('eq9', nesterov), trajectory('eq10', nesterov)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_eq10_without_correction_differs():
    a, c = trajectory('eq9'), trajectory('eq10-nocorrect')
    assert np.max(np.abs(a - c)) > 1e-2


def test_eq9_one_step_by_hand():
    w = np.array([1.0, -2.0], np.float32)
    opt = Optimizer(2, momentum=0.9, form='eq9', decay=np.array([0.1, 0.0], np.float32))
    opt.velocity[...] = [1.0, 1.0]
    opt.step(w, np.array([0.5, 0.5], np.float32), 0.1)
    # u = 0.9*1 + (0.5 + 0.1*1) = 1.5 ; u2 = 0.9 + 0.5 = 1.4
    np.testing.assert_allclose(opt.velocity, [1.5, 1.4], rtol=1e-6)
    np.testing.assert_allclose(w, [1.0 - 0.15, -2.0 - 0.14], rtol=1e-6)


def test_nesterov_one_step_by_hand():
    w = np.array([1.0], np.float32)
    opt = Optimizer(1, momentum=0.9, form='eq9', nesterov=True)
    opt.velocity[...] = 2.0
    opt.step(w, np.array([1.0], np.float32), 0.1)
    # u = 0.9*2 + 1 = 2.8 ; w -= 0.1*(1 + 0.9*2.8) = 0.352
    np.testing.assert_allclose(w, [1.0 - 0.352], rtol=1e-6)


@pytest.mark.parametrize('kw,msg', [(dict(form='eq11'), 'form'), (dict(momentum=1.0), 'momentum'),
                                    (dict(decay=-1.0), 'weight decay')])
def test_bad_optimizer_options(kw, msg):
    with pytest.raises(ValueError, match=msg):
        Optimizer(3, **kw)
