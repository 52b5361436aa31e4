"""Drive an unchanged Theano-MPI model (its *contract*) with this project's exchange.

A Theano-MPI model class exposes ``params``, ``grads`` (symbolic gradients
of ``cost``), ``cost``, ``error``, ``weight_types``, ``data``, ``base_lr``,
``shared_lr``, ``mu``, ``eta``, ``use_nesterov_momentum`` and the methods
``compile_iter_fns``, ``train_iter``, ``val_iter``, ``reset_iter``,
``adjust_hyperp`` and ``cleanup``. Its own train function both computes the
gradient *and* applies its own update, so it cannot give us per-worker
gradient values. Decision (see ``docs/migrating-from-theano-mpi.md``):

* :class:`GradientFunction` compiles **our own** Theano function whose
  outputs are ``[cost, error] + model.grads``, fed the way the model's own
  train function is fed (:mod:`theanompi_ext.theanompi_compat.feed`): its input is
  the sub-batch index ``model.subb_ind`` (when the model has sub-batches)
  and ``model.shared_x_slice``/``shared_y_slice`` (else ``shared_x``/
  ``shared_y``) and ``shared_lr`` are given for ``model.x``/``y``/``lr``.
  One iteration is one sub-batch, as in Theano-MPI's worker loop; n (of kn)
  is the sub-batch size.
* One training step's compute per iteration: after the model's own
  ``compile_iter_fns``, :meth:`ContractStepper.take_over` puts
  :class:`~theanompi_ext.theanompi_compat.train_fn.StepFunction` in place
  of ``model.train_iter_fn``. The model's own ``train_iter`` still loads
  the batch (its sharding, shuffling, parallel loading, recorder calls)
  and then calls ``train_iter_fn(subb)``, which now runs our step on that
  sub-batch: the model's own compiled train function never runs, nothing
  is undone, BN running statistics move once per step. A model may
  instead give the hook ``model.load_train_batch(i)`` (it only fills
  ``shared_x``/``shared_y``); our worker then calls :meth:`step` itself.
* The model's cost is a mean over the worker's n examples; its gradient
  times ``1/k`` is the gradient of the loss normalised by kn (the same
  number as dividing the loss by kn).

:class:`ContractStepper` then runs the trainer's step on those gradients
(:mod:`theanompi_ext.step`): assembled as the trainer's is (ParamSet in
``flat_order``, the checks across ranks, the exchanger, the rule ``kn``,
``avg`` or ``cdd``, host or device parts chosen once) and run by the same
:class:`~theanompi_ext.step.run.Step`: the watchdog armed per iteration
(``collective_timeout_s``, ``stall_warn_s``), one finiteness rule and
error class, the timeline (option ``timeline``).
It is shared by :mod:`theanompi_ext.theanompi_compat.worker` (our worker) and
:mod:`theanompi_ext.theanompi_compat.exchanger` (inside Theano-MPI).
"""
from types import SimpleNamespace

from ..collective.watchdog import watch
from ..exchange.modes import OVERLAP, SERIAL
from ..step.assemble import assemble_step, compile_in_turn, make_schedule
from ..step.run import RunsStep, Step
from .graph import ContractBackward, ContractGraph, GradientFunction
from .options import OPTION_DEFAULTS, resolve_options
from .tags import contract_tags


def contract_settings(opts, sync_type, overlap):
    """The options of a contract run (:func:`~.options.resolve_options`) under
    :class:`~theanompi_ext.train.config.TrainConfig`'s names, as
    :mod:`theanompi_ext.step.assemble` reads them.

    The model decays its own rate (``shared_lr``, see :meth:`ContractStepper.lr`):
    our schedule has no decay epochs.
    """
    keys = ('exchange_bn', 'wire_dtype', 'bucket_cap_mb', 'first_bucket_cap_mb',
            'weight_decay', 'momentum', 'momentum_form', 'nesterov', 'base_lr', 'ref_batch',
            'warmup', 'warmup_epochs')
    return SimpleNamespace(sync_type=sync_type, exch_strategy=OVERLAP if overlap else SERIAL,
                           decay_epochs=(), decay_factor=1.0, **{k: opts[k] for k in keys})


class ContractStepper(RunsStep):
    """One synchronous step of this project's exchange for a contract model.

    ``comm`` is one of our :class:`~theanompi_ext.collective.Communicator`.
    Call :meth:`step` once per iteration after the batch is in the model's
    shared variables.
    """

    def __init__(self, model, comm, sync_type='kn', options=None, log=print, overlap=False,
                 chunks=None):
        self.opts = opts = options if options is not None else resolve_options(model)
        # Waits inside a step are bounded and reported, as the trainer's (docs/faults.md).
        comm = watch(comm, *(opts.get(key, OPTION_DEFAULTS[key][0])
                             for key in ('collective_timeout_s', 'stall_warn_s')))
        self.model, self.comm, self.sync_type = model, comm, sync_type
        self.k = k = comm.size
        self.overlap = bool(overlap)
        settings = contract_settings(opts, sync_type, self.overlap)
        # Theano-MPI models reuse names ('W', 'b') in every layer: prefix the model index.
        names = ['%03d_%s' % (i, p.name or 'param') for i, p in enumerate(model.params)]
        # order, params, layout, n_exch, buckets, exchanger, rule, ... on the host or
        # the device: the model's shared variables become views of a flat device
        # vector there (step/assemble.py)
        parts = assemble_step(comm, model.params, contract_tags(model), settings, k,
                              names=names)
        parts.install(self)
        self.on_device = parts.device_grads is not None
        from .feed import ModelFeed
        self.feed = ModelFeed(model, opts['batch_per_worker'],
                              outputs=[getattr(model, 'error', None)])
        self.n = self.feed.n
        self.n_subb = self.feed.n_subb
        # One iteration is one sub-batch (Theano-MPI's worker loop).
        self.iters_per_epoch = int(model.data.n_batch_train) * self.n_subb
        self.schedule = make_schedule(settings, k * self.n, self.iters_per_epoch,
                                      int(model.n_epochs), workers=k)
        # Overlap: our chunked backward on the model's own graph, each bucket
        # started as soon as its gradients are final. ``chunks``: the
        # (name, output, params) entries (chunks.find_chunks), found if not given.
        if self.overlap:
            from ..backward.chunked import ChunkedBackward
            if chunks is None:
                from .chunks import find_chunks
                chunks = find_chunks(model).entries
            if chunks is None:
                raise ValueError('overlap asked for, but no backward chunks were found in '
                                 'the model (chunks.find_chunks)')
            self.backward = compile_in_turn(comm, lambda: ChunkedBackward(
                None, self.params.vars, 1.0 / k,
                graph=ContractGraph(model, 1.0 / k, feed=self.feed, entries=chunks),
                device_io=self.on_device))
        else:
            scale = 1.0 / k if self.on_device else None
            self.backward = ContractBackward(compile_in_turn(comm, lambda: GradientFunction(
                model, self.order, self.feed, device_scale=scale)), k, self.on_device)
        self.has_error = self.backward.graph.has_error if self.overlap \
            else self.backward.has_error
        self._step = Step(comm, parts, self.backward, self.overlap, self.iters_per_epoch)
        if opts.get('timeline'):
            self.timeline = self.make_timeline()
        self.iteration = 0
        self.train_fn = None

    def take_over(self):
        """Put our step in place of the model's own train functions (once its
        ``compile_iter_fns`` has run); returns the
        :class:`~theanompi_ext.theanompi_compat.train_fn.StepFunction`."""
        from .train_fn import take_over
        if self.train_fn is None:
            self.train_fn = take_over(self.model, self)
        return self.train_fn

    def lr(self):
        """This iteration's rate: our schedule times the model's own decay
        (``shared_lr / base_lr``, which ``adjust_hyperp`` changes)."""
        mult = 1.0
        shared_lr = getattr(self.model, 'shared_lr', None)
        if shared_lr is not None and self.opts['base_lr'] > 0:
            mult = float(shared_lr.get_value()) / self.opts['base_lr']
        return self.schedule.lr(self.iteration) * mult

    def step(self, subb=0):
        """Gradients on sub-batch ``subb`` of the loaded batch, exchange, update
        (:meth:`Step.run <theanompi_ext.step.run.Step.run>`).

        Returns (cost, error, lr); ``cost``/``error`` are this worker's (the
        model's per-n means; error NaN when the model has none).
        """
        lr = self.lr()
        # One example-weight per rank: the global sums are sums of per-n means.
        out = self._step.run(subb, None, lr, self.iteration, 1)
        self.iteration += 1
        return out.local_loss, (out.local_err if self.has_error else float('nan')), lr

    def state_dict(self):
        """name -> parameter copy (flat-layout names)."""
        return self.params.state_dict()
