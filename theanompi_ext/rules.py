"""Alias kept for ``from theanompi_ext.rules import BSP`` (Theano-MPI's
``theanompi.rules``): see :mod:`theanompi_ext.theanompi_compat.rule`."""
from .theanompi_compat.rule import BSP  # noqa: F401
