"""How a Theano-MPI model feeds its own graph: sub-batches, givens, sizes.

Theano-MPI models keep a *file batch* in ``shared_x``/``shared_y`` and
train on sub-batches of it: ``n_subb`` sub-batches per file batch, an
integer scalar input ``subb_ind`` and ``shared_x_slice``/``shared_y_slice``
(expressions of ``shared_x``/``shared_y`` and ``subb_ind``) given for the
symbolic ``model.x``/``model.y`` at compile time; ``model.lr`` is given
``model.shared_lr``. Whatever the model does to its input between
``shared_x`` and its first layer (a c01b -> bc01 dimshuffle inside the
slice or inside the graph, a crop, a mean subtraction) is part of these
expressions, so a function built from them sees the batch exactly as the
model's own train function does.

:class:`ModelFeed` reads that layout from the model and refuses, before
the first step and naming what it could not understand, a model whose
graph has an input nobody feeds, a sub-batch index of the wrong type,
``n_subb > 1`` without a sub-batch index, or a sub-batch whose size is not
the model's ``batch_size``.
"""
import numpy as np


def _symbolic(v):
    """True for a symbolic (non-shared, non-constant) Theano variable."""
    return v is not None and hasattr(v, 'owner') and not hasattr(v, 'get_value') \
        and not hasattr(v, 'data')


def _shared(v):
    return v is not None and hasattr(v, 'get_value')


class ModelFeed(object):
    """The model's own feed of its graph.

    Attributes: ``inputs`` (``[model.subb_ind]`` or ``[]``), ``givens``
    (dict symbolic input -> expression of the shared batch), ``n_subb``,
    ``n`` (examples per sub-batch: the n of kn), ``description`` (one
    line for the log). Raises ValueError naming what was not understood.
    """

    def __init__(self, model, batch_per_worker=None, outputs=()):
        from ..engine.core import theano
        self.model = model
        n_subb = getattr(model, 'n_subb', 1)
        try:
            self.n_subb = int(n_subb if n_subb is not None else 1)
        except (TypeError, ValueError):
            raise ValueError('model.n_subb = %r is not a number of sub-batches' % (n_subb,))
        if self.n_subb < 1:
            raise ValueError('model.n_subb = %d: need at least 1 sub-batch per file batch'
                             % self.n_subb)
        subb = getattr(model, 'subb_ind', None)
        x_slice = getattr(model, 'shared_x_slice', None)
        y_slice = getattr(model, 'shared_y_slice', None)
        self.givens, self.inputs = {}, []
        if subb is not None:
            if not _symbolic(subb) or getattr(subb, 'ndim', None) != 0 or \
                    not str(getattr(subb, 'dtype', '')).startswith(('int', 'uint')):
                raise ValueError('model.subb_ind (%r) must be a symbolic integer scalar (the '
                                 'sub-batch index, T.iscalar), not %s'
                                 % (subb, getattr(subb, 'type', type(subb))))
            self.inputs = [subb]
            pairs = (('x', 'shared_x_slice', x_slice), ('y', 'shared_y_slice', y_slice))
        else:
            if self.n_subb > 1:
                raise ValueError('model.n_subb = %d but the model has no model.subb_ind '
                                 '(sub-batch index) and model.shared_x_slice: cannot tell '
                                 'which sub-batch its train function reads' % self.n_subb)
            pairs = (('x', 'shared_x', getattr(model, 'shared_x', None)),
                     ('y', 'shared_y', getattr(model, 'shared_y', None)))
        for sym, src_name, src in pairs:
            var = getattr(model, sym, None)
            if not _symbolic(var):
                continue
            if src is None:
                raise ValueError('model.%s is symbolic but the model has no model.%s to '
                                 'feed it' % (sym, src_name))
            self.givens[var] = src
        lr = getattr(model, 'lr', None)
        if _symbolic(lr) and _shared(getattr(model, 'shared_lr', None)):
            self.givens[lr] = model.shared_lr
        self._check_inputs(theano, [model.cost] + list(outputs))
        self.n = self._measure_n(theano, batch_per_worker)

    def _check_inputs(self, theano, outputs):
        """Refuse a graph with a symbolic input that nothing feeds."""
        from ..engine.core import graph_inputs
        outs = [o for o in outputs if o is not None]
        fed = theano.clone(outs, replace=self.givens) if self.givens else outs
        unfed = [v for v in graph_inputs(fed) if _symbolic(v) and v not in self.inputs]
        if unfed:
            names = ', '.join('%s (%s)' % (v.name or '<unnamed>', v.type) for v in unfed)
            known = [k for k in ('x', 'y', 'lr', 'subb_ind') if hasattr(self.model, k)]
            raise ValueError('model.cost depends on symbolic input(s) %s that the model does '
                             'not feed: only model.x/model.y (from %s), model.lr (from '
                             'model.shared_lr) and model.subb_ind are understood; the model '
                             'has %s' % (names, 'shared_x_slice/shared_y_slice' if self.inputs
                                         else 'shared_x/shared_y', ', '.join(known) or 'none'))

    def _measure_n(self, theano, batch_per_worker):
        """Examples per sub-batch, read from the model's own y slice when it has one."""
        model = self.model
        y = getattr(model, 'y', None)
        src = self.givens.get(y) if y is not None else None
        n = None
        if src is not None:
            fn = theano.function(self.inputs, src.shape[0], on_unused_input='ignore',
                                 name='tmx_subbatch_size')
            n = int(fn(*self.values(0)))
        want = batch_per_worker or getattr(model, 'batch_size', None)
        if n is None:
            if not want:
                raise ValueError('cannot tell the sub-batch size: the model has neither '
                                 'model.y fed from shared_y nor a batch_size attribute')
            return int(want)
        if want and int(want) != n:
            raise ValueError('the model\'s sub-batch holds %d examples (%s for model.y) but '
                             'its batch size is %d (model.batch_size or BATCH_PER_WORKER): '
                             'cannot tell which is n' % (
                                 n, 'shared_y_slice' if self.inputs else 'shared_y', int(want)))
        if self.inputs:
            total = int(np.shape(model.shared_y.get_value(borrow=True))[0]) \
                if _shared(getattr(model, 'shared_y', None)) else None
            if total is not None and total < self.n_subb * n:
                raise ValueError('model.n_subb = %d sub-batches of %d examples need a file '
                                 'batch of %d, but model.shared_y holds %d'
                                 % (self.n_subb, n, self.n_subb * n, total))
        return n

    def values(self, subb):
        """Input values for sub-batch ``subb`` (in the order of :attr:`inputs`)."""
        return [np.int32(subb)] if self.inputs else []

    def describe(self):
        """One line for the run's first log line."""
        if self.inputs:
            return 'model feed: %d sub-batch(es) of %d per file batch (model.subb_ind, ' \
                   'model.shared_x_slice)' % (self.n_subb, self.n)
        return 'model feed: the whole batch in shared_x (%d examples)' % self.n

    def clone(self, outputs):
        """``outputs`` rewritten to read the shared batch (givens applied)."""
        from ..engine.core import theano
        return theano.clone(list(outputs), replace=self.givens) if self.givens else list(outputs)

    def clone_with_state(self, outputs):
        """``(outputs, updates)``: :meth:`clone` of ``outputs``, and the default
        updates of the shared variables they read (Lasagne's BN running
        statistics, random generators) rewritten the same way, as explicit
        ``(variable, expression)`` pairs for the one function that moves them.

        Theano applies a default update as written, on the symbolic
        ``model.x``; a function compiled from the rewritten graph without
        ``givens`` would miss that input.
        """
        from ..engine.core import toposort
        outputs = list(outputs)
        state = []
        for node in toposort([o for o in outputs if o is not None]):
            for v in node.inputs:
                if getattr(v, 'default_update', None) is not None and v not in state:
                    state.append(v)
        cloned = self.clone(outputs + [v.default_update for v in state])
        return cloned[:len(outputs)], list(zip(state, cloned[len(outputs):]))
