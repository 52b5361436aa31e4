"""The momentum-SGD update as one compiled device function over flat buffers.

The same math as :mod:`theanompi_ext.update.momentum` (eq. 9, eq. 10 with
and without momentum correction, Nesterov, per-entry weight decay that is
0 on BN gamma/beta) plus the BN-local gradient scale of
:mod:`theanompi_ext.update.policy` (k on the local tail of the layout),
compiled once and run where the parameters live: the flat parameter
vector, the flat velocity and the flat gradient never leave the device.
Tested equal to the numpy functions to float32 round-off.
"""
import numpy as np

from ..engine.core import T, device_value, function, shared
from .momentum import check_options, momentum_scale


class DeviceOptimizer(object):
    """Momentum SGD on the flat parameter shared variable ``params_flat``.

    Parameters
    ----------
    params_flat : shared variable
        The flat float32 parameters (updated in place when Theano can).
    momentum, form, nesterov, decay
        As :class:`~theanompi_ext.update.momentum.Optimizer`.
    grad_scale : float32 vector or None
        Per-entry factor on the gradient before the update (k on BN
        gamma/beta updated locally, 1 elsewhere); None: 1.
    """

    def __init__(self, params_flat, momentum=0.9, form='eq9', nesterov=False, decay=0.0,
                 grad_scale=None):
        size = int(device_value(params_flat).size)
        dv = check_options(form, momentum, decay)
        self.form, self.momentum, self.nesterov = form, float(momentum), bool(nesterov)
        self.lr_prev = 0.0
        self.params = params_flat
        self.velocity = shared(np.zeros(size, np.float32), name='velocity_flat')
        decay = shared(np.broadcast_to(dv, (size,)).astype(np.float32), name='decay_flat')
        g = T.fvector('grads_flat')
        gsum = g
        if grad_scale is not None:
            gscale = np.asarray(grad_scale, np.float32)
            if gscale.shape != (size,):
                raise ValueError('grad_scale has %d entries, the parameters %d'
                                 % (gscale.size, size))
            gsum = g * shared(gscale, name='grad_scale_flat')
        lr, mscale = T.fscalar('lr'), T.fscalar('momentum_scale')
        w, v, m = params_flat, self.velocity, np.float32(momentum)
        gd = gsum + decay * w
        if form == 'eq9':
            v_new = v * mscale + gd
            w_new = w - (gd + v_new * m) * lr if nesterov else w - v_new * lr
        else:
            v_new = v * mscale + gd * lr
            w_new = w - (gd * lr + v_new * m) if nesterov else w - v_new
        self._fn = function([g, lr, mscale], [], updates=[(w, w_new), (v, v_new)],
                            name='update_' + form, device_inputs=[g])

    def step(self, grads_flat, lr):
        """One update from the flat device gradient ``grads_flat`` at rate ``lr``."""
        self._fn(grads_flat, lr, momentum_scale(self.form, self.momentum, lr, self.lr_prev))
        self.lr_prev = lr

    def state(self):
        """Named state for checkpoints (host copies)."""
        return {'velocity': np.asarray(self.velocity.get_value(), np.float32),
                'lr_prev': np.float64(self.lr_prev)}

    def load_state(self, state):
        """Restore :meth:`state` output (shapes must match)."""
        v = np.asarray(state['velocity'], np.float32)
        cur = device_value(self.velocity)
        if v.shape != tuple(cur.shape):
            raise ValueError('optimizer state has %d entries, model has %d' % (v.size, cur.size))
        if isinstance(cur, np.ndarray):
            cur[...] = v
        else:
            cur.write(np.ascontiguousarray(v))
        self.lr_prev = float(state['lr_prev'])
