"""This project's exchange inside Theano-MPI's own BSP worker.

Theano-MPI's worker constructs ``BSP_Exchanger(comm, gpucomm,
exch_strategy, sync_type, ctx, model)`` and, per iteration, calls
``model.train_iter(i, recorder)`` and then ``exchanger.exchange(recorder)``.
:class:`BSP_Exchanger` here has that shape. When it is built (after the
model's ``compile_iter_fns``) it puts our step in place of the model's
``train_iter_fn`` (:mod:`~theanompi_ext.theanompi_compat.train_fn`), so
the model's ``train_iter`` loads the batch and runs one step of ours:
gradient (overlapped with the exchange when ``exch_strategy='ar-overlap'``
and chunks are found in the model's graph), exchange over MPI with the
``kn``, ``avg`` or ``cdd`` rule of this project, update. The model's own
train function never runs. ``exchange(recorder)`` then has nothing left
to do but check that exactly one step ran. ``avg``/``cdd`` follow our
:class:`AvgRule` / :class:`CddRule` semantics (not Theano-MPI's own code).

Hooking in: :func:`install_into_theanompi` replaces ``BSP_Exchanger`` in
Theano-MPI's exchanger module (and in any already imported ``theanompi``
module that imported the name) by a factory that returns ours for
``sync_type='kn'`` (or an ``exch_strategy`` of ours) and Theano-MPI's
original otherwise. Call it at the top of the model file, which every rank
imports before the exchanger is built.

Theano-MPI's worker raises ``model.shared_lr`` by ``k**(1/5)`` per epoch
(``lr_warmup``) for five epochs; our schedule warms up per iteration and
reads ``shared_lr / base_lr`` as the model's own decay, so the install also
turns that worker's ``lr_warmup`` off (else the two warm-ups compound).

NCCL: when Theano-MPI's worker gives a real ``gpucomm`` (its
``pygpu.collectives.GpuComm`` over all ranks) and ``ctx`` (the pygpu
context of the model's device), the gradient buckets are summed through
that ``gpucomm`` (``all_reduce(dev, '+', dev)`` on ``ctx``'s stream,
:class:`~theanompi_ext.collective.gpucomm_host.GpuCommExchange`): a device
bucket in place, a host bucket (the contract stepper's flat gradient is a
host vector) through a device copy on ``ctx``; the barrier, the checks and
the finite-gradient vote stay on host MPI. With ``gpucomm=None`` the whole
exchange is host-memory MPI. Tested against a fake ``GpuComm`` only; not
yet run on a GPU.

"""
import sys

from .stepper import ContractStepper
from .options import resolve_options
from ..exchange.modes import NEW_SYNC_TYPES, OVERLAP, check_mode
from ..errors import NotInstallable

THEANOMPI_EXCHANGER_MODULE = 'theanompi.lib.exchanger'


class BSP_Exchanger(object):  # noqa: N801 (Theano-MPI's name)
    """Theano-MPI's exchanger interface over this project's rules.

    ``comm`` is mpi4py's ``COMM_WORLD`` (or any mpi4py communicator);
    ``gpucomm``/``ctx``: Theano-MPI's ``GpuComm`` and pygpu context, or None
    (see :func:`exchange_communicator`).
    """

    def __init__(self, comm, gpucomm, exch_strategy, sync_type, ctx, model):
        # Before any collective: every rank refuses the same way.
        options = resolve_options(model)
        check_mode(sync_type, exch_strategy, options['wire_dtype'])
        for key in ('checkpoint_signal', 'checkpoint_every_s'):
            if options[key]:
                # Theano-MPI's worker runs the loop and its checkpoints: not ours to add
                raise ValueError('THEANOMPI_EXT_%s=%s: our checkpoints need this project\'s '
                                 'worker (theanompi_ext.BSP or tmxlauncher), not Theano-MPI\'s '
                                 'own' % (key.upper(), options[key]))
        self.mpi_comm = comm
        self.comm = exchange_communicator(comm, gpucomm, ctx)
        from ..train.faults import check_same_software
        from ..launch.same_software import check_same_model_code
        check_same_software(self.comm)      # our first exchange there (launch/same_software.py)
        check_same_model_code(self.comm, type(model))
        self.sync_type, self.exch_strategy = sync_type, exch_strategy
        self.model = model
        from .worker import choose_mode
        mode, why, chunks = choose_mode(model, exch_strategy)
        self.stepper = ContractStepper(model, self.comm, sync_type, options,
                                       overlap=(mode == OVERLAP), chunks=chunks)
        self.train_fn = self.stepper.take_over()
        if self.comm.rank == 0:
            print('theanompi_ext: inside Theano-MPI\'s worker, exchange mode %s: %s; '
                  'model.train_iter_fn runs our step (one step per iteration)' % (mode, why))
        self.last = None
        self.calls = 0

    def exchange(self, recorder):
        """Check that the model's ``train_iter`` just ran exactly one step of ours.

        Theano-MPI's worker calls this after every ``train_iter``; the
        gradient, the exchange and the update already ran inside it, where
        the model called ``train_iter_fn``.
        """
        self.train_fn.expect_one_call(self.calls, 'model.train_iter')
        self.calls = self.train_fn.calls
        self.last = self.train_fn.last
        # Theano-MPI's recorder expects both modes every iteration; the
        # synchronisation and the exchange were timed inside 'calc'.
        for mode in ('sync', 'comm'):
            recorder.start()
            recorder.end(mode)


def exchange_communicator(comm, gpucomm=None, ctx=None, to_device=None):
    """The communicator of the exchange inside Theano-MPI's worker.

    ``gpucomm`` None: our MPI communicator over mpi4py ``comm``. Else the
    gradient sums go through ``gpucomm`` on ``ctx`` and the rest over MPI
    (:class:`~theanompi_ext.collective.gpucomm_host.GpuCommExchange`;
    ``to_device`` as there).
    """
    from ..collective.mpi import MPICommunicator
    if gpucomm is not None and ctx is None:
        raise ValueError('BSP_Exchanger was given a gpucomm but ctx=None: the pygpu context '
                         'the gpucomm was built on is needed for the device copies')
    host = MPICommunicator(comm)
    if gpucomm is None:
        return host
    from ..collective.gpucomm_host import GpuCommExchange
    try:
        return GpuCommExchange(gpucomm, ctx, host, to_device)
    except Exception:
        host.close()
        raise


def _factory(original):
    def make(comm, gpucomm, exch_strategy, sync_type, ctx, model):
        if sync_type in NEW_SYNC_TYPES or original is None:
            return BSP_Exchanger(comm, gpucomm, exch_strategy, sync_type, ctx, model)
        return original(comm, gpucomm, exch_strategy, sync_type, ctx, model)
    make.theanompi_ext_original = original
    return make


def _theanompi_exchanger_module():
    """Theano-MPI's exchanger module, or NotInstallable saying why not."""
    import importlib
    try:
        importlib.import_module('theanompi')
    except ImportError as exc:
        raise NotInstallable('Theano-MPI is not importable (%s): install it (pip install '
                             '--no-deps from its source tree) or use theanompi_ext.BSP' % exc)
    try:
        mod = importlib.import_module(THEANOMPI_EXCHANGER_MODULE)
    except ImportError as exc:
        missing = getattr(exc, 'name', None) or str(exc)
        raise NotInstallable('Theano-MPI is installed but its exchanger module %s cannot be '
                             'imported: %s is missing (%s). Theano-MPI\'s own worker needs '
                             'pygpu and a GPU; without them use theanompi_ext.BSP or the '
                             'tmxlauncher' % (THEANOMPI_EXCHANGER_MODULE, missing, exc))
    if not isinstance(getattr(mod, 'BSP_Exchanger', None), type) and \
            not hasattr(getattr(mod, 'BSP_Exchanger', None), 'theanompi_ext_original'):
        raise NotInstallable('%s has no BSP_Exchanger class: a Theano-MPI version this '
                             'project does not recognise (it fits the 2017 master: '
                             'BSP_Exchanger(comm, gpucomm, exch_strategy, sync_type, ctx, '
                             'model))' % THEANOMPI_EXCHANGER_MODULE)
    return mod


def _no_lr_warmup(original):
    """Theano-MPI's ``BSP_Worker.lr_warmup`` replaced: our schedule already warms up."""
    def lr_warmup(self, model, epoch):
        if epoch == 0 and getattr(self, 'rank', 0) == 0:
            print('theanompi_ext: Theano-MPI\'s lr_warmup is off; theanompi_ext\'s '
                  'schedule (linear per-iteration warm-up, lr scaled by kn) replaces it')
    lr_warmup.theanompi_ext_original = original
    return lr_warmup


def _replace_worker_warmup():
    """Turn off Theano-MPI's per-epoch warm-up in its running worker (if any).

    Its worker multiplies ``model.shared_lr`` by ``k**(1/5)`` at the start of
    epochs 1..5 while our schedule (which reads ``shared_lr / base_lr`` as the
    model's own decay) warms up too: the two would compound. Returns how
    many worker classes were changed.
    """
    changed = 0
    for name in ('__main__', 'theanompi.worker'):
        mod = sys.modules.get(name)
        cls = getattr(mod, 'BSP_Worker', None) if mod is not None else None
        current = getattr(cls, 'lr_warmup', None)
        if current is not None and not hasattr(current, 'theanompi_ext_original'):
            cls.lr_warmup = _no_lr_warmup(current)
            changed += 1
    return changed


def install_into_theanompi(strict=False):
    """Register our exchanger for ``sync_type='kn'`` in an importable Theano-MPI.

    Also turns off the per-epoch ``lr_warmup`` of Theano-MPI's running BSP
    worker (our schedule replaces it; see :func:`_replace_worker_warmup`).
    Returns True when installed. When it cannot install (Theano-MPI not
    importable, its exchanger module not importable, e.g. pygpu missing,
    or a version it does not recognise) it writes why to stderr and
    returns False, or raises :class:`NotInstallable` with that message
    when ``strict``. Idempotent.
    """
    try:
        mod = _theanompi_exchanger_module()
    except NotInstallable as exc:
        if strict:
            raise
        sys.stderr.write('theanompi_ext: install_into_theanompi: not installed: %s\n' % exc)
        return False
    _replace_worker_warmup()
    current = getattr(mod, 'BSP_Exchanger', None)
    if hasattr(current, 'theanompi_ext_original'):
        return True
    patched = _factory(current)
    mod.BSP_Exchanger = patched
    # Modules that did `from theanompi.lib.exchanger import BSP_Exchanger` hold their own name.
    for name, other in list(sys.modules.items()):
        # '__main__': Theano-MPI's worker runs as a script.
        if (name.startswith('theanompi') or name == '__main__') and other is not None and \
                getattr(other, 'BSP_Exchanger', None) is current and current is not None:
            other.BSP_Exchanger = patched
    return True
