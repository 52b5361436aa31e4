"""Collective layer: one interface (:class:`Communicator`), small backends.

==============  ==========================================  ======================
name            what                                        when
==============  ==========================================  ======================
``local``       world of one rank, collectives are no-ops   one process, references
``mpi``         mpi4py host-memory allreduce                CPU ranks, any MPI
``nccl``        NCCL 2 on GPU buffers (optional ``[gpu]``)  GPU ranks (CuPy arrays)
``pygpu-nccl``  pygpu's GpuComm on its context stream       Theano-MPI's gpucomm
==============  ==========================================  ======================

:func:`create_communicator` picks one by name; ``'auto'`` means ``mpi``
when running under an MPI launcher with more than one rank, else ``local``.
The trainer takes a backend that sums host buffers (``--backend``:
:func:`~.registry.host_backends`). Every MPI call of the package is made
here (and in ``launch/``): the rest reduces with ``allreduce(buf, op=)``,
agrees with ``barrier(timeout_s=)`` and ends the job with ``abort``.
"""
from .base import (Communicator, Handle, CompletedHandle, CollectiveTimeout,  # noqa: F401
                   REDUCE_OPS, check_buffer, drain, wait_all)
from .registry import create_communicator, available_backends  # noqa: F401
