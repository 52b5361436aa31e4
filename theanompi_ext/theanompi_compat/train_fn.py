"""Our step where a Theano-MPI model calls its own train function.

Every model of Theano-MPI's zoo loads its batch inside ``train_iter`` and
then calls ``self.train_iter_fn(subb)`` (``cost, error = ...``), which runs
the model's compiled train functions (``get_vel``/``descent_vel`` for
``cdd``, one function for ``avg``). :func:`take_over` puts our step in
their place: called with the sub-batch index, it runs one step of ours
(gradient, exchange, update) on that sub-batch and returns what the
model's function returns, ``[cost, error]``. So an unmodified model's
loading code keeps working and only one training step's compute runs per
iteration; the model's own compiled functions are kept
(:attr:`StepFunction.replaced`) but never run.

What is replaced: ``model.train_iter_fn``, and every compiled Theano
function held by the model that updates shared variables by its own
``updates`` (its training step under another name, e.g. ``get_vel``,
``descent_vel``, ``train_fn``): one that returns values runs our step on
the sub-batch it is given (its one input must be ``model.subb_ind``, or it
has none: sub-batch 0); one that returns nothing (``descent_vel``) does
nothing. Validation functions (no updates of their own) stay the model's.
"""
import numpy as np


def _own_updates(fn):
    """True for a compiled Theano function with ``updates`` of its own (not
    only the default updates of random generators or BN statistics)."""
    inputs = getattr(getattr(fn, 'maker', None), 'inputs', None)
    if inputs is None:
        return False
    return any(getattr(i, 'update', None) is not None and
               getattr(i.variable, 'default_update', None) is None for i in inputs)


class StepFunction(object):
    """Our step, called where the model calls its train function.

    Attributes: ``stepper`` (the :class:`~.stepper.ContractStepper`),
    ``replaced`` (name -> the model's own function), ``calls``, ``last``
    ``(cost, error, lr)`` of the last step, ``skipping``: while true, a call
    runs no step and returns zeros (a resume within an epoch runs the
    model's loading of the steps already done, :mod:`.resume`).
    """

    def __init__(self, stepper):
        self.stepper = stepper
        self.replaced = {}
        self.calls, self.last = 0, None
        self.skipping = False

    def __call__(self, subb=0, *args, **kwargs):
        """One step on sub-batch ``subb`` of the loaded batch; ``[cost, error]``
        as 0-d float32 arrays, as a compiled Theano function returns them."""
        if isinstance(subb, (bool, float)) or not isinstance(subb, (int, np.integer)):
            raise TypeError('model.train_iter_fn was called with %r: theanompi_ext\'s step '
                            'takes the sub-batch index (an int), as Theano-MPI\'s models '
                            'pass it' % (subb,))
        if not 0 <= int(subb) < self.stepper.n_subb:
            raise ValueError('model.train_iter_fn(%d): the model has %d sub-batch(es) per '
                             'file batch' % (subb, self.stepper.n_subb))
        self.calls += 1
        if self.skipping:
            self.last = None
            return [np.zeros((), np.float32), np.zeros((), np.float32)]
        cost, error, lr = self.stepper.step(int(subb))
        self.last = (cost, error, lr)
        return [np.asarray(cost, np.float32), np.asarray(error, np.float32)]

    def expect_one_call(self, before, what):
        """Raise unless exactly one step ran since ``calls`` was ``before``."""
        ran = self.calls - before
        if ran != 1:
            raise RuntimeError(
                '%s ran %d training step(s), not 1: theanompi_ext runs its step where the '
                'model calls its train function (model.train_iter_fn(subb), or a compiled '
                'function of the model with updates); a model whose train_iter calls none '
                'of them once per sub-batch needs the hook model.load_train_batch(i) '
                '(docs/migrating-from-theano-mpi.md)' % (what, ran))


class _Compiled(object):
    """One of the model's compiled train functions, replaced (module docstring)."""

    def __init__(self, step, name, fn, subb_ind):
        self.step, self.name = step, name
        inputs = [i.variable for i in fn.maker.inputs if not getattr(i, 'implicit', False)]
        self.returns = len(fn.maker.outputs) > 0
        if len(inputs) > 1 or (inputs and inputs[0] is not subb_ind):
            raise ValueError('model.%s (the model\'s own train function, replaced by '
                             'theanompi_ext\'s step) takes inputs %s; only the sub-batch '
                             'index model.subb_ind is understood: give the model the hook '
                             'load_train_batch(i)' % (name, [str(v) for v in inputs]))
        self.takes_subb = bool(inputs)

    def __call__(self, *args):
        if not self.returns:
            return []
        if self.takes_subb != bool(args) or len(args) > 1:
            raise TypeError('model.%s called with %d argument(s), compiled with %d'
                            % (self.name, len(args), int(self.takes_subb)))
        return self.step(args[0] if args else 0)


def take_over(model, stepper):
    """Replace the model's train functions by our step; returns the :class:`StepFunction`."""
    step = StepFunction(stepper)
    subb_ind = getattr(model, 'subb_ind', None)
    for name, value in sorted(vars(model).items()):
        if name == 'train_iter_fn' and callable(value) and not _own_updates(value):
            step.replaced[name] = value          # Theano-MPI's cdd closure, or the like
            setattr(model, name, step)
        elif _own_updates(value):
            step.replaced[name] = value
            setattr(model, name, _Compiled(step, name, value, subb_ind))
    if 'train_iter_fn' not in step.replaced and hasattr(model, 'train_iter'):
        # A model that compiled nothing under that name still gets it (and the
        # worker checks that train_iter calls it).
        model.train_iter_fn = step
    return step
