"""Launching ranks: mpiexec command lines and MPI-environment detection."""
from .mpiexec import in_mpi_job, find_mpiexec, mpiexec_command, run_mpiexec  # noqa: F401
