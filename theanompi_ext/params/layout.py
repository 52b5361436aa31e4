"""The flat layout of a model's trainable parameters.

:class:`ParamLayout` lays the trainable parameters end to end in one flat
float32 vector, in the order it is given; the trainer gives the exchanged
parameters in reverse model order, then the local ones
(:func:`~theanompi_ext.buckets.plan.flat_order`), so buckets are contiguous
views. Gradients, momentum and the exchange all work on vectors of that
layout.
"""
import numpy as np


class ParamLayout(object):
    """Offsets of named parameters in one flat vector.

    ``entries`` is a list of ``(name, shape, dtype)``; order is model order
    (input to output). Equal layouts on all ranks are the precondition of
    every collective; :meth:`signature` is what ranks compare.
    """

    def __init__(self, entries):
        names = [e[0] for e in entries]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError('duplicate parameter names: %s' % dup)
        self.names = names
        self.shapes = [tuple(int(d) for d in e[1]) for e in entries]
        self.dtypes = [np.dtype(e[2]).name for e in entries]
        self.sizes = [int(np.prod(s, dtype=np.int64)) for s in self.shapes]
        self.offsets = list(np.cumsum([0] + self.sizes[:-1]).astype(int))
        self.total = int(sum(self.sizes))

    def __len__(self):
        return len(self.names)

    def slice(self, i):
        """The slice of entry ``i`` in the flat vector."""
        return slice(self.offsets[i], self.offsets[i] + self.sizes[i])

    def view(self, flat, i):
        """Entry ``i`` of ``flat`` as an array of its own shape (a view)."""
        return flat[self.slice(i)].reshape(self.shapes[i])

    def mask(self, selected):
        """A float32 0/1 vector that is 1 on the entries in ``selected``."""
        m = np.zeros(self.total, np.float32)
        for i in selected:
            m[self.slice(i)] = 1.0
        return m

    def signature(self):
        """Hashable description (names, shapes, dtypes) compared across ranks."""
        return tuple(zip(self.names, self.shapes, self.dtypes))

    def describe_difference(self, other):
        """Human-readable first difference between two signatures."""
        a, b = self.signature(), tuple(other)
        if len(a) != len(b):
            return 'different number of parameters: %d vs %d' % (len(a), len(b))
        for x, y in zip(a, b):
            if x != y:
                return 'parameter %s %s %s vs %s %s %s' % (x + y)
        return None
