"""Parameter tags and the flat layout of a model's trainable parameters.

Parameters are tagged where a layer creates them (Lasagne's idea), so the
exchanger and weight decay select them structurally, never by name:

``trainable``      updated by the optimiser.
``bn_affine``      a batch-norm gamma or beta (no weight decay; by default
                   updated locally and never exchanged).
``bn_stat``        a batch-norm running mean/variance (per-worker state,
                   never trainable, never exchanged).
``bias``           a bias (Theano-MPI's weight type ``'b'``).

:class:`ParamLayout` lays the trainable parameters end to end in one flat
float32 vector, in the order it is given; the trainer gives the exchanged
parameters in reverse model order, then the local ones
(:func:`~theanompi_ext.buckets.plan.flat_order`), so buckets are contiguous
views. Gradients, momentum and the exchange all work on vectors of that
layout.
"""
import numpy as np

TAGS = ('trainable', 'bn_affine', 'bn_stat', 'bias')
_ATTR = 'theanompi_ext_tags'


def tag(var, *tags):
    """Attach tags to a shared variable (returns it, for chaining)."""
    bad = [t for t in tags if t not in TAGS]
    if bad:
        raise ValueError('unknown parameter tag(s) %s; known: %s' % (bad, TAGS))
    current = set(getattr(var.tag, _ATTR, ()))
    current.update(tags)
    setattr(var.tag, _ATTR, frozenset(current))
    return var


def tags_of(var):
    """The tags of a shared variable (empty frozenset when untagged)."""
    return getattr(var.tag, _ATTR, frozenset())


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
