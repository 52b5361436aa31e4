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
  train function is fed (:mod:`theanompi_ext.contract_feed`): its input is
  the sub-batch index ``model.subb_ind`` (when the model has sub-batches)
  and ``model.shared_x_slice``/``shared_y_slice`` (else ``shared_x``/
  ``shared_y``) and ``shared_lr`` are given for ``model.x``/``y``/``lr``.
  One iteration is one sub-batch, as in Theano-MPI's worker loop; n (of kn)
  is the sub-batch size.
* Loading a batch: the model's optional hook ``model.load_train_batch(i)``
  is used when present (it only fills ``shared_x``/``shared_y``). Without
  it we call the model's own ``train_iter(i, recorder)`` (which loads the
  batch and takes the model's own local step) and then **restore** the
  parameters from our master copy, so the model's own step is discarded;
  the cost is one extra forward/backward per iteration and BN running
  statistics, if any, are updated twice.
* The model's cost is a mean over the worker's n examples; its gradient
  times ``1/k`` is the gradient of the loss normalised by kn (the same
  number as dividing the loss by kn).

:class:`ContractStepper` then runs the flat exchange of this project on
those gradients: ParamSet in ``flat_order``, :class:`KnSumExchanger`,
:func:`make_rule` (``kn``, ``avg`` or ``cdd``) and :class:`Schedule`.
It is shared by :mod:`theanompi_ext.theanompi_worker` (our worker) and
:mod:`theanompi_ext.exchange.theanompi_exchanger` (inside Theano-MPI).
"""
import os

import numpy as np

from .params import ParamSet, tags_of
from .buckets.plan import DEFAULT_CAP_MB, DEFAULT_FIRST_CAP_MB

# Options of a contract-model run: name -> (default, parser). Values come
# from, in increasing priority: these defaults, the model's attributes
# (see :func:`resolve_options`), a ``tmx_options`` dict on the model, the
# environment ``THEANOMPI_EXT_<NAME>`` (which BSP.init and tmlauncher set).
OPTION_DEFAULTS = {
    'batch_per_worker': (0, int),      # 0: model.batch_size
    'ref_batch': (0, int),             # 0: batch_per_worker (base_lr tuned for one worker)
    'warmup': ('gradual', str),
    'warmup_epochs': (-1.0, float),    # -1: min(5, n_epochs / 2)
    'momentum_form': ('eq9', str),
    'weight_decay': (-1.0, float),     # -1: model.eta
    'momentum': (-1.0, float),         # -1: model.mu
    'exchange_bn': (False, lambda s: str(s).strip().lower() in ('1', 'true', 'yes', 'on')),
    'bucket_cap_mb': (DEFAULT_CAP_MB, float),
    'first_bucket_cap_mb': (DEFAULT_FIRST_CAP_MB, float),
    'wire_dtype': ('float32', str),    # float16/bfloat16: 16-bit wire, float32 sums
    'max_steps': (0, int),             # 0: whole epochs (tests use a few steps)
    'out': ('', str),                  # rank 0 writes params.npz, summary.json, record, snapshots
    'snapshot_freq': (5, int),         # epochs between HDF5 snapshots in OUT/snapshots (0: none)
}
ENV_PREFIX = 'THEANOMPI_EXT_'
BN_NAMES = ('gamma', 'beta')


def option_env_name(name):
    """The environment variable carrying option ``name`` to the ranks."""
    return ENV_PREFIX + name.upper()


def resolve_options(model, environ=None):
    """The run's options as a dict (see :data:`OPTION_DEFAULTS`), filled in from the model."""
    environ = os.environ if environ is None else environ
    opts = {k: v[0] for k, v in OPTION_DEFAULTS.items()}
    opts.update(getattr(model, 'tmx_options', None) or {})
    for key, (_, parse) in OPTION_DEFAULTS.items():
        raw = environ.get(option_env_name(key))
        if raw not in (None, ''):
            try:
                opts[key] = parse(raw)
            except ValueError:
                raise ValueError('option %s=%r: expected %s' % (option_env_name(key), raw,
                                                                 OPTION_DEFAULTS[key][0].__class__.__name__))
    if opts['batch_per_worker'] <= 0:
        n = getattr(model, 'batch_size', None)
        if not n:
            raise ValueError('cannot tell the per-worker batch size: the model has no '
                             'batch_size attribute; set %s' % option_env_name('batch_per_worker'))
        opts['batch_per_worker'] = int(n)
    if opts['ref_batch'] <= 0:
        opts['ref_batch'] = opts['batch_per_worker']
    n_epochs = int(model.n_epochs)
    if opts['warmup_epochs'] < 0:
        opts['warmup_epochs'] = min(5.0, n_epochs / 2.0)
    if opts['weight_decay'] < 0:
        opts['weight_decay'] = float(getattr(model, 'eta', 0.0) or 0.0)
    if opts['momentum'] < 0:
        opts['momentum'] = float(getattr(model, 'mu', 0.0) or 0.0)
    opts['nesterov'] = bool(getattr(model, 'use_nesterov_momentum', False))
    opts['base_lr'] = float(model.base_lr)
    return opts


def contract_tags(model):
    """Tag sets for ``model.params``.

    Our own tags win when the model's layers set them; otherwise (plain
    Theano-MPI layers) the documented fallback: a parameter named
    ``'gamma'`` or ``'beta'`` is a BN affine parameter, and weight type
    ``'b'`` marks a bias.
    """
    wtypes = list(getattr(model, 'weight_types', None) or [])
    out = []
    for i, p in enumerate(model.params):
        t = set(tags_of(p))
        if not t:
            t.add('trainable')
            if (p.name or '') in BN_NAMES:
                t.add('bn_affine')
            if i < len(wtypes) and wtypes[i] == 'b':
                t.add('bias')
        out.append(frozenset(t))
    return out


class GradientFunction(object):
    """``fn(subb) -> (cost, error, [grad values])`` on sub-batch ``subb`` of the loaded batch.

    Compiled from the model's own graph with the model's own feed
    (:class:`~theanompi_ext.contract_feed.ModelFeed`: ``subb_ind`` as input,
    ``shared_x_slice``/``shared_y_slice``/``shared_lr`` given for
    ``x``/``y``/``lr``), so inputs transformed inside the graph are seen
    as the model's train function sees them.
    """

    def __init__(self, model, params_order, feed):
        from .engine import theano
        err = getattr(model, 'error', None)
        self.has_error = err is not None
        outs = [model.cost] + ([err] if self.has_error else [])
        grads = [model.grads[i] for i in params_order]
        self.feed = feed
        self.fn = theano.function(list(feed.inputs), outs + grads, givens=feed.givens or None,
                                  on_unused_input='ignore', name='tmx_contract_grads')
        self.n_out = len(outs)

    def __call__(self, subb=0):
        res = self.fn(*self.feed.values(subb))
        cost = float(res[0])
        error = float(res[1]) if self.has_error else float('nan')
        return cost, error, res[self.n_out:]


def layer_entries(model):
    """``model.tmx_layers`` as a list of (name, output, params), forward order.

    Each entry is either an object with ``.output`` and ``.params`` (and
    optionally ``.name``), as Theano-MPI's layer classes are, or an
    ``(output, params)`` pair. Returns None when the model has no such
    attribute; raises ValueError naming the entry when one is malformed.
    """
    layers = getattr(model, 'tmx_layers', None)
    if layers is None:
        return None
    layers = list(layers)
    if not layers:
        raise ValueError('model.tmx_layers is empty: list the top-level layers in forward '
                         'order, each with .output and .params')
    out = []
    for i, entry in enumerate(layers):
        if isinstance(entry, (tuple, list)) and len(entry) == 2:
            output, params = entry
            name = 'layer%d' % i
        else:
            output = getattr(entry, 'output', None)
            params = getattr(entry, 'params', None)
            name = getattr(entry, 'name', None) or 'layer%d' % i
        if output is None or params is None or not hasattr(output, 'owner'):
            raise ValueError('model.tmx_layers[%d] (%r): expected an object with a symbolic '
                             '.output and a .params list, or an (output, params) pair'
                             % (i, entry))
        out.append((str(name), output, list(params)))
    return out


class ContractGraph(object):
    """A contract model's own symbolic graph, as the chunked backward reads it.

    Gives :class:`~theanompi_ext.backward.chunked.ChunkedBackward` what
    :class:`~theanompi_ext.backward.graph.TrainGraph` gives it for our own
    networks: ``cost`` (the model's cost times a shared ``scale`` = 1/k,
    i.e. the loss over kn), ``loss_sum``/``err_sum`` (here the model's own
    per-worker means), the layers' outputs and parameters from
    ``model.tmx_layers``, and the data inputs. The graph is the model's own,
    rewritten with the model's feed (:class:`~theanompi_ext.contract_feed.ModelFeed`)
    to read the shared file batch; its one input, if any, is the sub-batch
    index ``model.subb_ind``. BN running statistics are
    left to the model, as in the serial path.
    """

    def __init__(self, model, loss_scale, feed=None):
        from .engine import T, shared, toposort
        from .contract_feed import ModelFeed
        entries = layer_entries(model)
        if entries is None:
            raise ValueError('the model has no tmx_layers attribute')
        self.layers = [(name, params) for name, _, params in entries]
        self.data_roots = [v for v in (getattr(model, 'shared_x', None),
                                       getattr(model, 'shared_y', None)) if hasattr(v, 'get_value')]
        if not self.data_roots:
            raise ValueError('the model has neither model.x/model.y nor model.shared_x/'
                             'shared_y: cannot tell where the batch enters its graph')
        err = getattr(model, 'error', None)
        self.has_error = err is not None
        # The outputs must be on the cost's graph, each computed from the one before.
        ancestors = set(v for node in toposort([model.cost]) for v in node.outputs)
        for i, (name, output, _) in enumerate(entries):
            if output not in ancestors:
                raise ValueError('model.tmx_layers[%d] (%s): its output is not part of '
                                 'model.cost\'s graph' % (i, name))
            if i and not any(entries[i - 1][1] in node.inputs
                             for node in toposort([output])):
                raise ValueError('model.tmx_layers must be in forward order: the output of '
                                 'entry %d (%s) is not computed from that of entry %d (%s)'
                                 % (i, name, i - 1, entries[i - 1][0]))
        self.model_feed = feed if feed is not None else ModelFeed(model)
        # The model's graph as its own train function runs it: read from the
        # shared file batch through the model's givens (slice, dimshuffle, ...).
        outs = self.model_feed.clone([model.cost] + ([err] if err is not None else []) +
                                     [output for _, output, _ in entries])
        cost = outs[0]
        self.layer_outputs = outs[1 + self.has_error:]
        self.inputs = list(self.model_feed.inputs)
        self.data_roots += self.inputs
        self.loss_sum = cost
        self.err_sum = outs[1] if self.has_error else T.constant(np.float32(np.nan))
        self.scale = shared(np.float32(loss_scale), name='loss_scale')
        self.cost = cost * self.scale
        self.stat_updates = []

    def feed(self, x=None, y=None):
        """Values of :attr:`inputs`: ``x`` is the sub-batch index (the batch
        itself is already in the model's shared variables)."""
        return self.model_feed.values(x or 0)


class NonFiniteStep(FloatingPointError):
    """A rank saw a non-finite loss or gradient (raised on every rank, before the update)."""
    all_ranks = True


class ContractStepper(object):
    """One synchronous step of this project's exchange for a contract model.

    ``comm`` is one of our :class:`~theanompi_ext.collective.Communicator`.
    Call :meth:`step` once per iteration after the batch is in the model's
    shared variables.
    """

    def __init__(self, model, comm, sync_type='kn', options=None, log=print, overlap=False):
        from .buckets.plan import flat_order, plan_buckets, check_plan_across_ranks
        from .exchange.knsum import KnSumExchanger
        from .exchange.rules import make_rule, SYNC_TYPES
        from .update.schedule import Schedule
        from .train.trainer import check_models_match, compile_in_turn
        from types import SimpleNamespace
        if sync_type not in SYNC_TYPES:
            raise ValueError('unknown sync_type %r; choose from %s' % (sync_type, SYNC_TYPES))
        self.model, self.comm, self.sync_type = model, comm, sync_type
        self.opts = opts = options if options is not None else resolve_options(model)
        self.k = k = comm.size
        tags = contract_tags(model)
        order, n_exch_params = flat_order(tags, exchange_bn=opts['exchange_bn'])
        # Theano-MPI models reuse names ('W', 'b') in every layer: prefix the model index.
        names = ['%03d_%s' % (i, model.params[i].name or 'param') for i in order]
        self.order = order
        self.params = ParamSet([model.params[i] for i in order], names)
        self.params.tags = [tags[i] for i in order]
        self.layout = self.params.layout
        check_models_match(comm, self.layout)
        self.n_exch = (self.layout.offsets[n_exch_params] if n_exch_params < len(self.layout)
                       else self.layout.total)
        self.buckets = plan_buckets(self.layout.sizes, n_exch_params,
                                    opts['bucket_cap_mb'], opts['first_bucket_cap_mb'])
        check_plan_across_ranks(comm, self.buckets, self.layout, extra=(sync_type,))
        self.exchanger = KnSumExchanger(comm, self.buckets, self.n_exch, local_scale=k,
                                        wire=opts['wire_dtype'])
        rule_opts = SimpleNamespace(weight_decay=opts['weight_decay'], momentum=opts['momentum'],
                                    momentum_form=opts['momentum_form'],
                                    nesterov=opts['nesterov'])
        self.rule = make_rule(sync_type, comm, self.layout, n_exch_params, self.params.tags,
                              self.exchanger, rule_opts)
        from .contract_feed import ModelFeed
        self.feed = ModelFeed(model, opts['batch_per_worker'],
                              outputs=[getattr(model, 'error', None)])
        self.n = self.feed.n
        self.n_subb = self.feed.n_subb
        # One iteration is one sub-batch (Theano-MPI's worker loop).
        self.iters_per_epoch = int(model.data.n_batch_train) * self.n_subb
        self.schedule = Schedule(opts['base_lr'], k * self.n, self.iters_per_epoch,
                                 int(model.n_epochs), opts['ref_batch'], opts['warmup'],
                                 opts['warmup_epochs'], decay_epochs=(), workers=k)
        # Overlap: our chunked backward on the model's own graph, each bucket
        # started as soon as its gradients are final (needs model.tmx_layers).
        self.overlap = bool(overlap)
        if self.overlap and sync_type != 'kn':
            raise ValueError('overlap exists only for sync_type kn, not %r' % sync_type)
        if self.overlap:
            from .backward.chunked import ChunkedBackward
            self.backward = compile_in_turn(comm, lambda: ChunkedBackward(
                None, self.params.vars, 1.0 / k,
                graph=ContractGraph(model, 1.0 / k, feed=self.feed)))
            self.gradfn = None
        else:
            self.gradfn = compile_in_turn(comm, lambda: GradientFunction(model, order, self.feed))
        self.grads = np.zeros(self.layout.total, np.float32)
        self.master = self.params.values.copy()
        self._stats = np.zeros(2, np.float32)
        self.iteration = 0

    def rebind(self):
        """Point every shared variable at its view of the flat vector again.

        The model's own train function may have replaced a variable's
        storage (or updated it in place); this restores our binding cheaply.
        """
        ps = self.params
        for i, var in enumerate(ps.vars):
            var.set_value(ps.layout.view(ps.values, i), borrow=True)

    def restore(self):
        """Undo anything the model did to its parameters since our last step."""
        self.params.values[...] = self.master
        self.rebind()

    def model_step_moved(self):
        """True when the model's own train function changed its parameters since our last step.

        Theano-MPI models compiled by its ``pre_model_iter_fn(k>1)`` never do:
        their parameters move only in ``cdd``'s second step, after the
        exchange has filled ``vels2``.
        """
        return any(not np.array_equal(np.asarray(var.get_value()).reshape(-1),
                                      self.master[self.layout.slice(i)])
                   for i, var in enumerate(self.params.vars))

    def lr(self):
        """This iteration's rate: our schedule times the model's own decay
        (``shared_lr / base_lr``, which ``adjust_hyperp`` changes)."""
        mult = 1.0
        shared_lr = getattr(self.model, 'shared_lr', None)
        if shared_lr is not None and self.opts['base_lr'] > 0:
            mult = float(shared_lr.get_value()) / self.opts['base_lr']
        return self.schedule.lr(self.iteration) * mult

    def step(self, subb=0):
        """Gradients on sub-batch ``subb`` of the loaded batch, exchange, update.

        Returns (cost, error, lr); ``cost``/``error`` are this worker's (the
        model's per-n means).
        """
        self.restore()
        if self.overlap:
            cost, error = self.backward.run(
                subb, None, self.grads, self.layout, self.exchanger.chunk_hook(self.grads))
            if not self.backward.graph.has_error:
                error = float('nan')
            # A non-finite gradient anywhere makes every rank's sum non-finite.
            self.exchanger.finish(self.grads)
        else:
            cost, error, gvals = self.gradfn(subb)
            inv_k = np.float32(1.0 / self.k)
            for i, g in enumerate(gvals):
                np.multiply(np.asarray(g, np.float32).reshape(-1), inv_k,
                            out=self.grads[self.layout.slice(i)])
        self._stats[...] = (cost, 0.0 if not np.isfinite(error) else error)
        finite = np.array([1.0 if np.all(np.isfinite(self.grads)) and np.isfinite(cost)
                           else 0.0], np.float32)
        self.comm.allreduce(finite)
        if finite[0] < self.k:
            raise NonFiniteStep('non-finite loss or gradient at iteration %d'
                                     % self.iteration)
        lr = self.lr()
        self.rule.step(self.params.values, self.grads, lr, reduced=self.overlap)
        self.master[...] = self.params.values
        self.rebind()
        self.iteration += 1
        return cost, error, lr

    def state_dict(self):
        """name -> parameter copy (flat-layout names)."""
        return self.params.state_dict()
