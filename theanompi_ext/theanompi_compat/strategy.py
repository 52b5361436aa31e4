"""Theano-MPI's ``exch_strategy`` names (a backend each) -> our communicators, and an automatic choice.

Theano-MPI's ``exch_strategy`` names the transport; ours (``ar``,
``ar-overlap``) says when the gradients travel. Both vocabularies live in
:mod:`theanompi_ext.exchange.modes`.

==============  ===========  ==============================================
exch_strategy   backend      notes
==============  ===========  ==============================================
``ar``          ``mpi``      host-memory MPI allreduce
``nccl32``      ``nccl``     NCCL float32 sum of device buffers
``nccl16``      (refused)    fp16-compressed NCCL exchange: not implemented
``asa32``       (refused)    alltoall-sum-allgather over CUDA-aware MPI:
``asa16``       (refused)    not implemented; ``nccl32`` does the same job
==============  ===========  ==============================================

``nccl16`` and ``asa16`` are refused as strategy names; their 16-bit wire
is the separate option ``wire_dtype`` (``float16``/``bfloat16``, see
:mod:`.wire`), with float32 sums over MPI (alltoall-sum-allgather) and
NCCL's native half/bfloat16 sums over NCCL.
"""
from ..collective.nccl_lib import INSTALL_HINT, NCCLUnavailable
# Theano-MPI's exch_strategy names a backend ('ar': MPI); its table and its
# check live with our own vocabulary (when to send) in exchange/modes.py.
from ..exchange.modes import theanompi_backend as backend_for_strategy  # noqa: F401


def choose_backend(buf=None, probe=None):
    """'nccl' when ``buf`` lives on a GPU and NCCL can run here, else 'mpi'.

    ``buf``: a representative buffer (CuPy/pygpu/``__cuda_array_interface__``
    array, a numpy array, or None when unknown: host memory is assumed).
    A GPU buffer with NCCL unusable raises :class:`NCCLUnavailable` naming
    what to install, since the MPI backend cannot sum device memory.
    ``probe``: injected ``() -> (ok, reason)`` (tests); default
    :func:`theanompi_ext.collective.nccl_probe.probe`.
    """
    from ..collective.nccl_buffers import is_device_array
    if not is_device_array(buf):
        return 'mpi'
    if probe is None:
        from ..collective.nccl_probe import probe
    ok, reason = probe()
    if ok:
        return 'nccl'
    raise NCCLUnavailable('buffers of type %s live on a GPU but the NCCL backend cannot '
                          'run: %s. Install the GPU extra: %s'
                          % (type(buf).__name__, reason, INSTALL_HINT))


def create_for_strategy(exch_strategy, **options):
    """A communicator for a Theano-MPI ``exch_strategy`` name (see module table)."""
    from ..collective.registry import create_communicator
    return create_communicator(backend_for_strategy(exch_strategy), **options)
