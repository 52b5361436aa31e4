"""This project's exchange inside Theano-MPI's own BSP worker.

Theano-MPI's worker constructs ``BSP_Exchanger(comm, gpucomm,
exch_strategy, sync_type, ctx, model)`` and, per iteration, calls
``model.train_iter(i, recorder)`` and then ``exchanger.exchange(recorder)``.
:class:`BSP_Exchanger` here has that shape. On ``exchange`` it times a
``Barrier`` as ``'sync'``, then (as ``'comm'``): restores the parameters of
our last step (discarding the local step the model's own train function
just took), computes the gradient of the model's cost on the batch the
model just loaded (see :mod:`theanompi_ext.contract`), exchanges it over
MPI with the ``kn``, ``avg`` or ``cdd`` rule of this project and applies
the update. ``avg``/``cdd`` therefore follow our :class:`AvgRule` /
:class:`CddRule` semantics (not Theano-MPI's own code).

Hooking in: :func:`install_into_theanompi` replaces ``BSP_Exchanger`` in
Theano-MPI's exchanger module (and in any already imported ``theanompi``
module that imported the name) by a factory that returns ours for
``sync_type='kn'`` (or an ``exch_strategy`` of ours) and Theano-MPI's
original otherwise. Call it at the top of the model file, which every rank
imports before the exchanger is built.

What it cannot do there: overlap (Theano-MPI's worker runs the whole
iteration before calling ``exchange``), NCCL (``gpucomm``/``ctx`` are
ignored; the exchange is a host-memory MPI allreduce), and every iteration
costs one extra forward/backward (the model's own step, then ours).
"""
import sys

from ..contract import ContractStepper, resolve_options

NEW_SYNC_TYPES = ('kn',)
OUR_STRATEGIES = ('ar', 'ar-overlap')
THEANOMPI_EXCHANGER_MODULE = 'theanompi.lib.exchanger'


class BSP_Exchanger(object):  # noqa: N801 (Theano-MPI's name)
    """Theano-MPI's exchanger interface over this project's rules.

    ``comm`` is mpi4py's ``COMM_WORLD`` (or any mpi4py communicator);
    ``gpucomm`` and ``ctx`` are accepted and ignored (host MPI only).
    """

    def __init__(self, comm, gpucomm, exch_strategy, sync_type, ctx, model):
        from ..collective.mpi import MPICommunicator
        if exch_strategy not in OUR_STRATEGIES:
            raise ValueError('exch_strategy %r is not available in theanompi_ext; use %s'
                             % (exch_strategy, OUR_STRATEGIES))
        self.mpi_comm = comm
        self.comm = MPICommunicator(comm)
        self.sync_type, self.exch_strategy = sync_type, exch_strategy
        self.model = model
        self.stepper = ContractStepper(model, self.comm, sync_type, resolve_options(model))
        if self.comm.rank == 0 and exch_strategy != 'ar':
            print('theanompi_ext: exch_strategy=%s inside Theano-MPI runs the serial '
                  'exchange (its worker calls exchange() after the whole iteration)'
                  % exch_strategy)
        self.last = None

    def exchange(self, recorder):
        """Synchronise the ranks ('sync'), then gradient + exchange + update ('comm')."""
        recorder.start()
        self.mpi_comm.Barrier()
        recorder.end('sync')
        recorder.start()
        self.last = self.stepper.step()
        recorder.end('comm')


def _factory(original):
    def make(comm, gpucomm, exch_strategy, sync_type, ctx, model):
        if sync_type in NEW_SYNC_TYPES or original is None:
            return BSP_Exchanger(comm, gpucomm, exch_strategy, sync_type, ctx, model)
        return original(comm, gpucomm, exch_strategy, sync_type, ctx, model)
    make.theanompi_ext_original = original
    return make


def install_into_theanompi():
    """Register our exchanger for ``sync_type='kn'`` in an importable Theano-MPI.

    Returns True when installed, False when Theano-MPI is not importable.
    Idempotent.
    """
    import importlib
    try:
        mod = importlib.import_module(THEANOMPI_EXCHANGER_MODULE)
    except ImportError:
        return False
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
