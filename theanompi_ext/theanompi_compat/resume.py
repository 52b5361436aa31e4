"""Checkpoints of a Theano-MPI model run, and its exact resume at an epoch boundary.

Under the restart supervisor (``BSP().init(..., max_restarts=N, out=OUT)``,
a session's ``MAX_RESTARTS``: :mod:`.restart_job`), with the option
``checkpoint_signal`` or when resuming (``resume=True``), rank 0 writes
``OUT/checkpoint.h5`` at the end of every epoch, and, within an epoch, after
the iteration a ``checkpoint_signal`` asked for, in the trainer's format
(:mod:`theanompi_ext.train.checkpoint`: sealed, atomic, the previous one
kept as ``checkpoint.prev.h5``), with every rank's state gathered:

* the parameters (the exchanged ones once, each rank's local tail: BN
  gamma/beta unless ``exchange_bn``), the rule's momentum and the rate of
  the last step (momentum correction);
* each rank's per-worker state that is not exchanged: every shared variable
  the step moves that is not a parameter (those with a ``default_update`` in
  the graph of ``model.cost``/``error``/``grads``: BN running statistics,
  Theano random streams), and its random generators: NumPy's global one,
  Python's ``random``, and every ``numpy.random.RandomState`` attribute of
  ``model`` and ``model.data``;
* each rank's losses and errors of the epoch so far (a checkpoint within an
  epoch: the epoch's record is then the one a run never stopped gives);
* the iteration, the epochs finished and the steps of the next one done
  (``partial``), and the history.

Resuming at epoch ``e`` (epochs ``0..e-1`` finished) replays, on every rank
and without training, what the worker loop does to the model between
epochs, in its order: for ``ep < e``: ``model.epoch = ep``,
``model.reset_iter('train')``, ``model.reset_iter('val')``,
``model.adjust_hyperp(ep)``. Within an epoch (``j`` of its steps done),
the worker then runs the first ``j`` iterations' loading as it runs them
(``model.train_iter(i)`` or ``load_train_batch(i)``) with the step itself
skipped (:class:`~.train_fn.StepFunction` ``skipping``): the model's own
counters, file batch and sub-batch come to where they were. The state
above is loaded over all of it (so the generators are the checkpoint's,
whatever the replay drew).

The contract for a bitwise resume: a model's data order and augmentation
depend only on that replay (seeds its ``reset_iter`` sets from
``model.epoch``, cumulative shuffles included, its loading in
``train_iter``) and on the generators listed above; nothing else carries
over (no time- or pid-seeded shuffle, no state that its train function
changes and its loading reads). A model that loads in a separate process
(``para_load``) or declares ``tmx_resumable = False`` is refused before its
first step.
"""
import collections
import json
import os
import random
from types import SimpleNamespace

import numpy as np

from ..errors import BadInput

#: Set to '1' by the supervisor (:mod:`.restart_job`) when the ranks resume from OUT.
RESUME_VAR = 'THEANOMPI_EXT_RESUME'


#: Where a checkpoint puts the run: ``epochs_done`` finished, then
#: ``steps_in_epoch`` iterations of the next one.
ResumePoint = collections.namedtuple('ResumePoint', 'epochs_done steps_in_epoch')


def read_position(path):
    """The :class:`ResumePoint` of the checkpoint ``path``, its checksum verified
    (:class:`~theanompi_ext.errors.CheckpointError`: missing, corrupt, or not a
    Theano-MPI model run's)."""
    from ..train import checkpoint
    with checkpoint.read(path) as f:
        try:
            partial = json.loads(f.attrs['partial'])
            return ResumePoint(int(partial['epochs_done']),
                               int(partial.get('steps_in_epoch', 0)))
        except (KeyError, ValueError, TypeError) as exc:
            raise checkpoint.CheckpointError(
                '%s: not a checkpoint of a Theano-MPI model run (no %s)' % (path, exc))


class EpochSoFar(object):
    """This rank's losses and errors of the epoch in progress, as a checkpoint
    entry (``get_value``/``set_value`` of a fixed ``(2, iters_per_epoch)``
    float64 array, zeros past the steps done; an error of NaN, from a model
    without one, is kept as 0 and given back as NaN)."""
    name = 'epoch_so_far'

    def __init__(self, iters_per_epoch, has_error):
        self.size, self.has_error = int(iters_per_epoch), bool(has_error)
        self.losses, self.errors = [], []
        self._saved = None

    def clear(self):
        """A new epoch."""
        self.losses, self.errors = [], []

    def get_value(self):
        v = np.zeros((2, self.size), np.float64)
        v[0, :len(self.losses)] = self.losses
        if self.has_error:
            v[1, :len(self.errors)] = self.errors
        return v

    def set_value(self, v):
        self._saved = np.asarray(v, np.float64)

    def restore(self, steps):
        """The first ``steps`` entries of the loaded value become the epoch's so far."""
        v = self._saved
        self.losses = [float(x) for x in v[0, :steps]]
        self.errors = [float(x) if self.has_error else float('nan') for x in v[1, :steps]]


def check_resumable(model):
    """Refuse (BadInput) a model that says or shows that it cannot resume exactly."""
    if getattr(model, 'tmx_resumable', True) is False:
        raise BadInput('option max_restarts: the model declares tmx_resumable = False (its '
                       'data order or augmentation does not resume exactly)')
    for owner in (model, getattr(model, 'data', None)):
        if getattr(owner, 'para_load', False):
            raise BadInput('option max_restarts: the model loads its data in a separate '
                           'process (para_load), whose position a checkpoint cannot hold')


def replay(model, epochs):
    """What the worker loop does to ``model`` between epochs, for the first
    ``epochs`` epochs, without training (module docstring)."""
    for ep in range(epochs):
        model.epoch = ep
        model.reset_iter('train')
        model.reset_iter('val')
        model.adjust_hyperp(ep)


class _Generator(object):
    """A random generator's state as a float64 vector (exact for its 32-bit words)."""

    def __init__(self, name, get, put):
        self.name, self._get, self._put = name, get, put

    def get_value(self):
        return np.asarray(self._get(), np.float64)

    def set_value(self, v):
        self._put(np.asarray(v))


def _numpy_generator(name, rs):
    def get():
        kind, keys, pos, has_gauss, cached = rs.get_state()
        return np.concatenate([keys.astype(np.float64), [pos, has_gauss, cached]])

    def put(v):
        rs.set_state(('MT19937', v[:624].astype(np.uint32), int(v[624]), int(v[625]),
                      float(v[626])))
    return _Generator(name, get, put)


def _python_generator():
    def get():
        version, words, gauss = random.getstate()
        return list(words) + [version, gauss is not None, gauss or 0.0]

    def put(v):
        gauss = float(v[-1]) if v[-2] else None
        random.setstate((int(v[-3]), tuple(int(w) for w in v[:-3]), gauss))
    return _Generator('rng_python', get, put)


class _Named(object):
    """A shared variable under a name unique in the checkpoint."""

    def __init__(self, name, var):
        self.name, self.var = name, var

    def get_value(self):
        return np.asarray(self.var.get_value())

    def set_value(self, v):
        self.var.set_value(np.asarray(v, dtype=self.var.dtype))


def worker_state(model):
    """This rank's state that no exchange keeps equal: the shared variables the
    step moves besides the parameters, and the random generators (module docstring)."""
    from ..engine.core import toposort
    params = set(model.params)
    outs = [model.cost, getattr(model, 'error', None)] + list(model.grads)
    found = []
    for node in toposort([o for o in outs if o is not None]):
        for v in node.inputs:
            if getattr(v, 'default_update', None) is not None and v not in params \
                    and v not in found:
                found.append(v)
    state = []
    for i, v in enumerate(found):
        name, value = '%03d_%s' % (i, v.name or 'state'), v.get_value(borrow=True)
        # theano.tensor.shared_randomstreams keeps a RandomState object (MRG: an array)
        state.append(_numpy_generator(name, value) if isinstance(value, np.random.RandomState)
                     else _Named(name, v))
    # the generator of the "unused" np.random.shuffle-style calls, and Python's
    state += [_numpy_generator('rng_numpy', np.random.mtrand._rand), _python_generator()]
    for where, owner in (('model', model), ('data', getattr(model, 'data', None))):
        for attr in sorted(vars(owner) if owner is not None and hasattr(owner, '__dict__')
                           else ()):
            obj = getattr(owner, attr)
            if isinstance(obj, np.random.RandomState):
                state.append(_numpy_generator('rng_%s.%s' % (where, attr), obj))
    return state


class ContractCheckpoint(object):
    """A Theano-MPI run seen as :mod:`theanompi_ext.train.checkpoint` sees a
    trainer: ``params``, ``rule``, ``n_exch``, ``layout``, ``net.stats``,
    ``comm``, ``cfg``, ``iteration``, ``history``."""

    def __init__(self, model, stepper, modelclass, options, out, history, so_far):
        self.stepper, self.history, self.so_far = stepper, history, so_far
        self._history = history
        self.params, self.rule, self.n_exch, self.layout = (
            stepper.params, stepper.rule, stepper.n_exch, stepper.layout)
        self.comm = stepper.comm
        self.net = SimpleNamespace(stats=worker_state(model) + [so_far])
        config = {k: v for k, v in options.items() if k not in ('out',)}
        config.update(workers=stepper.k)
        self.cfg = SimpleNamespace(model=modelclass, sync_type=stepper.sync_type,
                                   to_dict=lambda: dict(config))
        self.path = os.path.join(out, 'checkpoint.h5')
        self.write_timeout_s = float(options.get('write_timeout_s', 300.0))

    @property
    def iteration(self):
        """The stepper's iteration (what the checkpoint records and restores)."""
        return self.stepper.iteration

    @iteration.setter
    def iteration(self, value):
        self.stepper.iteration = value

    def save(self, epochs_done, in_write=None, steps_in_epoch=0):
        """Every rank: gather the state after ``epochs_done`` epochs and
        ``steps_in_epoch`` steps of the next; rank 0 writes it.

        One watched wait bounded by ``write_timeout_s``, as the trainer's."""
        from ..files.signals import deferred_signals
        from ..train import checkpoint
        note = ('this rank (the writer) has not finished writing %s' % self.path
                if self.comm.rank == 0 else None)
        with deferred_signals(), self.comm.bounded(
                self.iteration, 'checkpoint %s (written by rank 0)' % self.path,
                self.write_timeout_s, 'write_timeout_s', note):
            checkpoint.save(self, self.path, {'epochs_done': epochs_done,
                                              'steps_in_epoch': steps_in_epoch},
                            in_write=in_write)
            self.comm.barrier()

    def position(self):
        """Where the checkpoint puts the run (:func:`read_position`)."""
        return read_position(self.path)

    def restore(self, point):
        """Load this rank's state of the checkpoint at ``point`` over the model (the
        finished epochs replayed, and the steps of the next one's loading run):
        parameters, momentum, per-worker state, generators, the epoch so far,
        the iteration and the history."""
        from ..train import checkpoint
        checkpoint.load(self, self.path)     # the checksum verified again
        self.so_far.restore(point.steps_in_epoch)
        # (load set self.history to a new list: the worker keeps its own)
        self._history[:] = self.history
        self.history = self._history
