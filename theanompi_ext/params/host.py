"""The model's trainable parameters bound to one flat host vector (:class:`ParamSet`).

Its device-resident twin is :class:`theanompi_ext.params.device.DeviceParamSet`.
"""
import numpy as np

from .layout import ParamLayout
from .tags import tags_of


class ParamSet(object):
    """A model's trainable shared variables bound to one flat vector.

    The flat vector ``values`` is the master copy of the parameters. When
    the engine lets a shared variable borrow a view of it (Theano on the
    CPU does), an update of ``values`` is seen by the compiled functions
    without a copy; otherwise :meth:`push` copies the values in.
    """

    def __init__(self, shared_vars, names=None):
        self.vars = list(shared_vars)
        if names is None:
            names = [v.name or 'param%d' % i for i, v in enumerate(self.vars)]
        vals = [v.get_value(borrow=True) for v in self.vars]
        for n, v in zip(names, vals):
            if v.dtype != np.float32:
                raise TypeError('parameter %s has dtype %s; the exchange needs float32'
                                % (n, v.dtype))
        self.layout = ParamLayout([(n, v.shape, v.dtype) for n, v in zip(names, vals)])
        self.values = np.empty(self.layout.total, np.float32)
        self._bound = []
        for i, (var, val) in enumerate(zip(self.vars, vals)):
            view = self.layout.view(self.values, i)
            view[...] = val
            var.set_value(view, borrow=True)
            self._bound.append(np.shares_memory(var.get_value(borrow=True), self.values))
        self.tags = [tags_of(v) for v in self.vars]

    def indices(self, include=(), exclude=()):
        """Indices of parameters having every tag in include and none in exclude."""
        return [i for i, t in enumerate(self.tags)
                if all(x in t for x in include) and not any(x in t for x in exclude)]

    def push(self):
        """Make the shared variables see ``values`` (copies only unbound ones)."""
        for i, var in enumerate(self.vars):
            if not self._bound[i]:
                var.set_value(self.layout.view(self.values, i).copy(), borrow=True)

    def pull(self):
        """Refresh ``values`` from the shared variables (after outside changes)."""
        for i, var in enumerate(self.vars):
            if not self._bound[i]:
                self.layout.view(self.values, i)[...] = var.get_value(borrow=True)

    def state_dict(self):
        """name -> array copy of every parameter."""
        return {n: self.layout.view(self.values, i).copy()
                for i, n in enumerate(self.layout.names)}
