"""The plan of a training run: every option resolved, before a step is taken.

``train --dry-run`` and ``trials --dry-run`` print it instead of launching;
a real run logs it first (rank 0). :func:`make_plan` computes it from the
options and a few facts about the data and the model (plain numbers, so it
is testable without Theano); :func:`resolve_plan` gathers those facts for a
dry run (loads the data set, builds the model, compiles nothing);
:func:`plan_of_trainer` reads them from a built trainer. :func:`format_plan`
is the one formatter. A feature with something to say about the run adds a
``(label, text)`` pair to :attr:`RunPlan.lines`.
"""
import os
from dataclasses import dataclass, field

from ..buckets.plan import exchanged_entries, flat_order, plan_buckets
from ..update.policy import split_exchanged
from ..update.schedule import Schedule

FORMS_TEXT = {
    'eq9': 'eq. 9 (u = m*u + g; w -= lr*u; no correction needed)',
    'eq10': 'eq. 10 (v = m*v + lr*g; w -= v) with momentum correction v *= lr/lr_prev',
    'eq10-nocorrect': 'eq. 10 (v = m*v + lr*g; w -= v) without momentum correction',
}
WHAT_EXCHANGED = {'kn': 'gradients summed', 'avg': 'parameters averaged',
                  'cdd': 'momenta summed'}

#: How the plan words ``--topology`` (the ranks decide ``auto`` once they know
#: their hosts: collective/two_level.two_level_pays).
TOPOLOGY_TEXT = {'auto': 'auto (two-level when several hosts have several ranks)'}


@dataclass
class RunPlan(object):
    """What a training run will do (see :func:`format_plan`)."""
    model: str
    data: str
    n_train: int
    workers: int                  # k
    batch_per_worker: int         # n
    total_batch: int              # kn
    iters_per_epoch: int
    epochs: int
    total_iters: int
    base_lr: float
    ref_batch: int
    target_lr: float
    warmup: str
    warmup_iters: int
    lr_points: list               # [(iteration, lr, what)]
    momentum: str
    n_params: int
    n_exchanged: int              # scalars exchanged per iteration
    exchanged_bytes: int
    buckets: int                  # 0: the rule exchanges without buckets
    chunks: int                   # backward functions per step
    sync_type: str
    exch_strategy: str
    path: str
    device: str
    outputs: list                 # [str]
    lines: list = field(default_factory=list)   # [(label, text)] added by features


def lr_points(schedule, total_iters):
    """``[(iteration, lr, what)]``: the start, the end of the warm-up, each
    decay reached within ``total_iters`` and the last iteration."""
    ipe = schedule.iters_per_epoch
    marks = [(0, 'start')]
    if schedule.warmup == 'theanompi':
        marks.append((5 * ipe, 'end of warm-up'))
    elif schedule.warmup_iters:
        marks.append((schedule.warmup_iters, 'end of warm-up'))
    for i, e in enumerate(schedule.decay_epochs, 1):
        marks.append((e * ipe, 'after decay %d (epoch %d)' % (i, e)))
    marks.append((total_iters - 1, 'last iteration'))
    merged = {}
    for it, what in marks:
        if 0 <= it < total_iters:
            merged.setdefault(it, []).append(what)
    return [(it, schedule.lr(it), ', '.join(merged[it])) for it in sorted(merged)]


def output_files(cfg):
    """What the run writes, and where."""
    out = []
    if cfg.out:
        files = ['summary.json', 'params.npz', 'curves.png']
        if cfg.checkpoint:
            when = ['every %d iterations' % cfg.checkpoint_every] if cfg.checkpoint_every \
                else ['each epoch']
            if cfg.checkpoint_every_s:
                when.append('every %g s' % cfg.checkpoint_every_s)
            if cfg.checkpoint_signal:
                when.append('on SIG%s, then %s' % (cfg.checkpoint_signal,
                                                   'stop' if cfg.on_checkpoint_signal == 'stop'
                                                   else 'go on'))
            files.append('checkpoint.h5 (%s)' % ' and '.join(when))
        if cfg.max_restarts:
            files.append('restarts.json (up to %d restarts)' % cfg.max_restarts)
        out.append('%s: %s' % (os.path.join(cfg.out, ''), ', '.join(files)))
    if cfg.timeline:
        out.append('timeline %s.json, %s.png' % (cfg.timeline, cfg.timeline))
    return out or ['nothing written (no --out)']


def make_plan(cfg, workers, n_train, param_sizes, n_exch_params, layer_counts,
              path=None, device=None):
    """The :class:`RunPlan` of ``cfg`` on ``workers`` ranks.

    ``param_sizes`` are the scalars of each parameter in flat-layout order
    (exchanged first, :func:`~theanompi_ext.buckets.plan.flat_order`),
    ``n_exch_params`` how many of them are exchanged, ``layer_counts`` the
    scalars of each top-level layer (the backward chunks follow them).
    """
    from ..backward.chunked import plan_chunks
    from ..data.shards import iterations_per_epoch
    k, n = int(workers), cfg.batch_per_worker
    ipe = iterations_per_epoch(n_train, k, n)
    total = cfg.total_iterations(ipe)
    sched = Schedule(cfg.base_lr, k * n, ipe, cfg.epochs, cfg.ref_batch, cfg.warmup,
                     cfg.warmup_epochs, cfg.decay_epochs, cfg.decay_factor, workers=k)
    n_exch = exchanged_entries(param_sizes, n_exch_params)
    if cfg.sync_type == 'kn':
        buckets = len(plan_buckets(list(param_sizes), n_exch_params, cfg.bucket_cap_mb,
                                   cfg.first_bucket_cap_mb))
    else:
        buckets = 0
    chunks = len(plan_chunks(layer_counts)) if cfg.exch_strategy == 'ar-overlap' else 1
    if path is None:
        # what create_communicator(cfg.backend) picks in the ranks
        mpi = cfg.backend == 'mpi' or (cfg.backend == 'auto' and k > 1)
        path = ('mpi, %d ranks, topology %s' % (k, TOPOLOGY_TEXT.get(cfg.topology, cfg.topology))
                if mpi else 'local (one rank: nothing leaves the process)')
    momentum = '%g, %s, Nesterov %s, weight decay %g' % (
        cfg.momentum, FORMS_TEXT.get(cfg.momentum_form, cfg.momentum_form),
        'on' if cfg.nesterov else 'off', cfg.weight_decay)
    plan = RunPlan(
        model=cfg.model, data=cfg.data, n_train=int(n_train), workers=k, batch_per_worker=n,
        total_batch=k * n, iters_per_epoch=ipe, epochs=cfg.epochs, total_iters=total,
        base_lr=cfg.base_lr, ref_batch=cfg.ref_batch, target_lr=sched.target_lr,
        warmup=cfg.warmup, warmup_iters=sched.warmup_iters,
        lr_points=lr_points(sched, total), momentum=momentum,
        n_params=int(sum(param_sizes)), n_exchanged=n_exch, exchanged_bytes=4 * n_exch,
        buckets=buckets, chunks=chunks, sync_type=cfg.sync_type,
        exch_strategy=cfg.exch_strategy, path=path,
        device=device or getattr(cfg, 'device', '') or 'cpu', outputs=output_files(cfg))
    if cfg.wire_dtype != 'float32':
        plan.lines.append(('wire', '%s: each bucket travels as 16 bits (%s per iteration), '
                                   'summed in float32' % (cfg.wire_dtype, _mb(2 * n_exch))))
    return plan


def _model_facts(net, exchange_bn):
    """(param sizes in flat order, exchanged count, per-layer scalars) of a network."""
    from ..params import tags_of
    params = net.params
    order, n_exch_params = flat_order(*split_exchanged([tags_of(p) for p in params],
                                                       exchange_bn))
    sizes = [int(params[i].get_value(borrow=True).size) for i in order]
    layers = [sum(int(p.get_value(borrow=True).size) for p in l.params) for l in net.layers]
    return sizes, n_exch_params, layers


def resolve_plan(cfg, workers):
    """The plan of a run not yet started: loads the data set and builds the
    model (Theano graphs, nothing compiled) to count examples and parameters."""
    from ..model import build_model
    from ..data.source import load_dataset
    cfg = cfg.validate()
    data = load_dataset(cfg)
    net = build_model(cfg.model, data.input_shape, data.n_classes, seed=cfg.seed,
                      **cfg.extra.get('model_kw', {}))
    sizes, n_exch_params, layers = _model_facts(net, cfg.exchange_bn)
    return make_plan(cfg, workers, len(data.y_train), sizes, n_exch_params, layers)


def plan_of_trainer(trainer):
    """The plan of a built :class:`~theanompi_ext.train.trainer.Trainer` (its
    communicator names the path)."""
    cfg = trainer.cfg
    _, _, layers = _model_facts(trainer.net, cfg.exchange_bn)
    workers = trainer.total_batch // cfg.batch_per_worker
    plan = make_plan(cfg, workers, len(trainer.data.y_train), list(trainer.layout.sizes),
                     trainer.n_exch_params, layers,
                     path='%s, exchange %s' % (trainer.comm.describe(), trainer.exchange_path))
    # what was built, where the plan only predicted it
    plan.chunks = getattr(trainer.backward, 'n_chunks', plan.chunks)
    if plan.buckets:
        plan.buckets = len(trainer.buckets)
    return plan


def _mb(nbytes):
    return '%.3g MB' % (nbytes / 1e6) if nbytes >= 1e5 else '%.3g KB' % (nbytes / 1e3)


def format_plan(plan):
    """The plan as indented lines (no trailing newline)."""
    p = plan
    out = ['plan: %s on %s (%d training examples)' % (p.model, p.data, p.n_train),
           '  k x n         %d x %d = %d examples per iteration' % (
               p.workers, p.batch_per_worker, p.total_batch),
           '  iterations    %d per epoch, %d in total (%d epochs%s)' % (
               p.iters_per_epoch, p.total_iters, p.epochs,
               '' if p.total_iters == p.epochs * p.iters_per_epoch else ', cut by --max-steps')]
    if p.warmup == 'theanompi':
        warm = "Theano-MPI warm-up: x k^(1/5) per epoch for 5 epochs (no kn scaling)"
    elif p.warmup == 'none' or not p.warmup_iters:
        warm = 'no warm-up'
    else:
        warm = '%s warm-up over %d iterations (%g epochs)' % (
            p.warmup, p.warmup_iters, p.warmup_iters / float(p.iters_per_epoch))
    out.append('  learning rate base %g at ref_batch %d -> %g x %d/%d = %g; %s' % (
        p.base_lr, p.ref_batch, p.base_lr, p.total_batch, p.ref_batch, p.target_lr, warm))
    for it, lr, what in p.lr_points:
        out.append('                iteration %7d  epoch %3d  lr %-10.6g %s' % (
            it, it // p.iters_per_epoch, lr, what))
    out.append('  momentum      %s' % p.momentum)
    what = WHAT_EXCHANGED.get(p.sync_type, p.sync_type)
    exch = 'sync_type %s: %s, %d of %d parameters = %s per iteration' % (
        p.sync_type, what, p.n_exchanged, p.n_params, _mb(p.exchanged_bytes))
    if p.buckets:
        exch += ' in %d bucket%s' % (p.buckets, 's' if p.buckets > 1 else '')
    out.append('  exchange      ' + exch)
    if p.exch_strategy == 'ar-overlap':
        strat = ('ar-overlap: backward in %d chunk%s, each bucket\'s allreduce starts when '
                 'its gradients are final' % (p.chunks, 's' if p.chunks > 1 else ''))
    else:
        strat = 'ar: one backward, then the exchange'
    out.append('                ' + strat)
    out.append('  path          %s; device %s' % (p.path, p.device))
    out.append('  outputs       ' + '; '.join(p.outputs))
    for label, text in p.lines:
        out.append('  %-13s %s' % (label, text))
    return '\n'.join(out)
