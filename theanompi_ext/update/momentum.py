"""Momentum SGD on flat float32 vectors, in the paper's two forms.

eq. (9)   ``u <- m*u + g``;            ``w <- w - lr*u``
eq. (10)  ``v <- m*v + lr*g``;         ``w <- w - v``
          with momentum correction (Remark 2), when the rate changes from
          ``lr_prev`` to ``lr``: ``v <- m*(lr/lr_prev)*v + lr*g``.

``g`` here already includes weight decay: ``g + decay*w`` where ``decay``
is lambda on decayed entries and 0 elsewhere (BN gamma/beta).
Nesterov: eq. (9) steps ``w -= lr*(g + m*u)``; eq. (10) ``w -= m*v + lr*g``
(equal to eq. (9) when ``v = lr*u``, which correction maintains).

Forms: ``'eq9'``, ``'eq10'`` (with correction), ``'eq10-nocorrect'``.
All functions update their arrays in place.
"""
import numpy as np

FORMS = ('eq9', 'eq10', 'eq10-nocorrect')


def decayed_gradient(g, w, decay, out):
    """``out = g + decay*w`` (decay: scalar or per-entry vector)."""
    np.multiply(w, decay, out=out)
    out += g
    return out


def step_eq9(w, u, gd, lr, m, nesterov=False, scratch=None):
    """Eq. (9): ``u = m*u + gd``, ``w -= lr*u`` (Nesterov: ``w -= lr*(gd + m*u)``)."""
    u *= m
    u += gd
    if nesterov:
        s = scratch if scratch is not None else np.empty_like(w)
        np.multiply(u, m, out=s)
        s += gd
        s *= lr
        w -= s
    else:
        s = scratch if scratch is not None else np.empty_like(w)
        np.multiply(u, lr, out=s)
        w -= s


def step_eq10(w, v, gd, lr, lr_prev, m, correction=True, nesterov=False, scratch=None):
    """Eq. (10): ``v = m*c*v + lr*gd``, ``w -= v``; c = lr/lr_prev with correction, else 1."""
    c = lr / lr_prev if (correction and lr_prev) else 1.0
    v *= m * c
    s = scratch if scratch is not None else np.empty_like(w)
    np.multiply(gd, lr, out=s)
    v += s
    if nesterov:
        # w -= m*v + lr*gd  (s holds lr*gd)
        s += m * v
        w -= s
    else:
        w -= v


def check_options(form, momentum, decay):
    """Validate the options of an optimizer; returns the decay as float32."""
    if form not in FORMS:
        raise ValueError('unknown momentum form %r; choose from %s' % (form, FORMS))
    if not 0 <= momentum < 1:
        raise ValueError('momentum must be in [0, 1), got %r' % (momentum,))
    dv = np.asarray(decay, np.float32)
    if np.any(dv < 0) or not np.all(np.isfinite(dv)):
        raise ValueError('weight decay must be finite and >= 0')
    return dv


def momentum_scale(form, momentum, lr, lr_prev):
    """The factor the velocity is multiplied by: m, or m*lr/lr_prev for eq. (10)
    with momentum correction (after the first step)."""
    if form == 'eq10' and lr_prev:
        return momentum * (lr / lr_prev)
    return momentum


class Optimizer(object):
    """Momentum SGD with named state, for flat parameter vectors.

    Parameters
    ----------
    size : int
        Length of the flat parameter vector.
    momentum : float
        m (0.9 in the paper).
    form : str
        One of :data:`FORMS`.
    nesterov : bool
        Nesterov momentum (the paper's runs use it).
    decay : float or ndarray
        Weight decay per entry (see :func:`theanompi_ext.update.policy.decay_vector`).
    """

    def __init__(self, size, momentum=0.9, form='eq9', nesterov=False, decay=0.0):
        dv = check_options(form, momentum, decay)
        self.form = form
        self.momentum = float(momentum)
        self.nesterov = bool(nesterov)
        self.decay = dv
        self.velocity = np.zeros(size, np.float32)   # u (eq. 9) or v (eq. 10)
        self.lr_prev = 0.0
        self._gd = np.empty(size, np.float32)
        self._scratch = np.empty(size, np.float32)

    def step(self, w, g, lr):
        """Apply one update to ``w`` (in place) from gradient ``g`` at rate ``lr``."""
        gd = decayed_gradient(g, w, self.decay, self._gd)
        if self.form == 'eq9':
            step_eq9(w, self.velocity, gd, lr, self.momentum, self.nesterov, self._scratch)
        else:
            step_eq10(w, self.velocity, gd, lr, self.lr_prev, self.momentum,
                      correction=(self.form == 'eq10'), nesterov=self.nesterov,
                      scratch=self._scratch)
        self.lr_prev = lr

    def state(self):
        """Named state for checkpoints."""
        return {'velocity': self.velocity.copy(),
                'lr_prev': np.float64(self.lr_prev)}

    def load_state(self, state):
        """Restore :meth:`state` output (shapes must match)."""
        v = np.asarray(state['velocity'], np.float32)
        if v.shape != self.velocity.shape:
            raise ValueError('optimizer state has %d entries, model has %d'
                             % (v.size, self.velocity.size))
        self.velocity[...] = v
        self.lr_prev = float(state['lr_prev'])
