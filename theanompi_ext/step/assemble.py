"""One step's assembly, shared by the trainer and the Theano-MPI contract stepper.

From a model's trainable variables to the parts of a synchronous step, in
this order on every rank:

1. flat order: exchanged parameters first, reversed (the last layers'
   gradients are final first), then the local ones (BN gamma/beta by default);
2. a :class:`~theanompi_ext.params.ParamSet` binding them to one flat vector;
3. the model checked across ranks (names, shapes, dtypes);
4. the number of exchanged entries (:func:`~theanompi_ext.buckets.plan.exchanged_entries`);
5. the bucket plan;
6. the plan and the :class:`Agreed` settings checked across ranks;
7. the exchanger and 8. the rule (``kn``, ``avg``, ``cdd``): on the host a
   :class:`~theanompi_ext.exchange.knsum.KnSumExchanger` and
   :func:`~theanompi_ext.update.rules.make_rule`; when Theano computes on a
   device, the device parts of :func:`~theanompi_ext.step.device.device_parts`
   (chosen here, once: nothing is replaced afterwards);

and 9. the schedule (:func:`make_schedule`), once the caller knows its epoch
length. Steps 3 and 6 are collectives: every rank raises the same
:class:`RankMismatchError` on a mismatch, so none is left waiting. The
step itself runs in :mod:`theanompi_ext.step.run`.

``settings`` is a :class:`~theanompi_ext.train.config.TrainConfig` (the
trainer) or :func:`theanompi_ext.theanompi_compat.stepper.contract_settings`
(a Theano-MPI model): the same attribute names.
"""
from collections import namedtuple

import numpy as np

from ..buckets.plan import check_plan_across_ranks, exchanged_entries, flat_order, plan_buckets
from ..exchange.knsum import KnSumExchanger
from ..exchange.modes import check_mode
from ..update.policy import split_exchanged
from ..update.rules import make_rule
from ..params import ParamLayout, ParamSet
from ..update.schedule import Schedule
from ..errors import RankMismatchError


# What every rank must have alike besides the plan: a rank that differs would
# send other bytes (wire), other buffers (BN exchanged or not) or at another
# moment (overlap), and the collectives would hang or mix numbers.
Agreed = namedtuple('Agreed', 'sync_type exch_strategy exchange_bn wire_dtype')


def agreed_settings(settings):
    """The :class:`Agreed` tuple of ``settings`` (checked by :func:`check_mode` first)."""
    check_mode(settings.sync_type, settings.exch_strategy, settings.wire_dtype)
    return Agreed(settings.sync_type, settings.exch_strategy, bool(settings.exchange_bn),
                  settings.wire_dtype)


def check_models_match(comm, layout):
    """Refuse to train unless every rank has the same parameter names/shapes/dtypes."""
    sigs = comm.allgather(layout.signature())
    for r, s in enumerate(sigs):
        if s != sigs[0]:
            ref = ParamLayout([(n, sh, dt) for n, sh, dt in sigs[0]])
            raise RankMismatchError('the model on rank %d differs from rank 0: %s'
                                    % (r, ref.describe_difference(s)))


def compile_in_turn(comm, build):
    """Rank 0 compiles first; the others then find the shared cache warm
    instead of queueing on its lock one by one; all return together. On a device every rank builds
    at once: there the time goes into building device kernels per process."""
    from ..engine.core import on_device      # imports Theano: only once a model is built
    if on_device():
        return build()
    if comm.rank == 0:
        out = build()
    comm.barrier()
    if comm.rank != 0:
        out = build()
    # Every rank built before the first step: a slow load from the cache (a
    # busy machine) must not count against the first step's collective timeout.
    comm.barrier()
    return out


def flat_params(variables, tags, exchange_bn, names=None):
    """Steps 1-2: (order, n_exch_params, ParamSet) with ``ParamSet.tags`` in flat order.

    ``tags`` and ``names`` are in the model's order (``names`` None: the
    variables' own names).
    """
    order, n_exch_params = flat_order(*split_exchanged(tags, exchange_bn))
    params = ParamSet([variables[i] for i in order],
                      None if names is None else [names[i] for i in order])
    params.tags = [tags[i] for i in order]
    return order, n_exch_params, params


def agree_on_plan(comm, buckets, layout, agreed):
    """Step 6: every rank planned the same buckets over the same layout with
    the same :class:`Agreed` settings (RankMismatchError on every rank if not)."""
    try:
        check_plan_across_ranks(comm, buckets, layout, extra=tuple(agreed))
    except ValueError as exc:
        raise RankMismatchError(str(exc))


class StepParts(object):
    """What :func:`assemble_step` built; :meth:`install` makes them the owner's attributes.

    ``order`` (model indices in flat order), ``params``, ``layout``,
    ``n_exch_params``, ``n_exch`` (exchanged entries), ``grads`` (the flat
    gradient: a numpy vector, or on a device the flat device vector),
    ``buckets``, ``agreed``, ``exchanger``, ``rule``, ``device_grads`` (the
    device gradient's views, None on the host), ``exchange_path`` (in words).
    """
    NAMES = ('order', 'params', 'layout', 'n_exch_params', 'n_exch', 'grads', 'buckets',
             'agreed', 'exchanger', 'rule', 'device_grads', 'exchange_path')

    def __init__(self, **parts):
        for name in self.NAMES:
            setattr(self, name, parts[name])

    def install(self, owner):
        """Set every part as an attribute of ``owner`` (checkpoints, the device
        step and the run plan read them there)."""
        for name in self.NAMES:
            setattr(owner, name, getattr(self, name))


def assemble_step(comm, variables, tags, settings, local_scale, names=None):
    """Steps 1-8 (module docstring) over ``comm``; returns :class:`StepParts`.

    ``local_scale`` multiplies the local (not exchanged) gradients: k, or
    k x groups for a single-process reference of k workers. On a device
    (the engine's), ``settings.exchange_path`` (``auto`` when absent)
    chooses how device buckets travel.
    """
    agreed = agreed_settings(settings)
    order, n_exch_params, params = flat_params(variables, tags, settings.exchange_bn, names)
    layout = params.layout
    check_models_match(comm, layout)
    n_exch = exchanged_entries(layout.sizes, n_exch_params)
    buckets = plan_buckets(layout.sizes, n_exch_params, settings.bucket_cap_mb,
                           settings.first_bucket_cap_mb)
    agree_on_plan(comm, buckets, layout, agreed)
    common = dict(order=order, layout=layout, n_exch_params=n_exch_params, n_exch=n_exch,
                  buckets=buckets, agreed=agreed)
    from ..engine.core import on_device   # the variables are Theano's: loaded already
    if on_device():
        from .device import device_parts
        dparams, dgrads, exchanger, rule, path = device_parts(
            comm, params, buckets, n_exch, settings, local_scale,
            getattr(settings, 'exchange_path', 'auto'))
        return StepParts(params=dparams, grads=dgrads.flat, exchanger=exchanger, rule=rule,
                         device_grads=dgrads, exchange_path=path, **common)
    exchanger = KnSumExchanger(comm, buckets, n_exch, wire=settings.wire_dtype)
    rule = make_rule(settings.sync_type, comm, layout, n_exch, params.tags, settings,
                     local_scale)
    return StepParts(params=params, grads=np.zeros(layout.total, np.float32),
                     exchanger=exchanger, rule=rule, device_grads=None,
                     exchange_path='host MPI', **common)


def make_schedule(settings, total_batch, iters_per_epoch, epochs, workers):
    """Step 9: the learning-rate :class:`~theanompi_ext.update.schedule.Schedule` of ``settings``."""
    return Schedule(settings.base_lr, total_batch, iters_per_epoch, epochs, settings.ref_batch,
                    settings.warmup, settings.warmup_epochs, settings.decay_epochs,
                    settings.decay_factor, workers=workers)
