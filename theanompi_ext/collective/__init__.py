"""Collective layer: one interface (:class:`Communicator`), small backends.

=========  ==========================================  ======================
name       what                                        when
=========  ==========================================  ======================
``local``  world of one rank, collectives are no-ops   one process, references
``mpi``    mpi4py host-memory allreduce                CPU ranks, any MPI
``nccl``   NCCL 2 on GPU buffers (optional ``[gpu]``)  GPU ranks
=========  ==========================================  ======================

:func:`create_communicator` picks one by name; ``'auto'`` means ``mpi``
when running under an MPI launcher with more than one rank, else ``local``.
"""
from .base import Communicator, Handle, CompletedHandle, check_buffer  # noqa: F401
from .registry import create_communicator, available_backends  # noqa: F401
