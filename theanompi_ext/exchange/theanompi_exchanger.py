"""Alias kept for model files that import the documented path: see
:mod:`theanompi_ext.theanompi_compat.exchanger`."""
from ..theanompi_compat.exchanger import BSP_Exchanger, install_into_theanompi  # noqa: F401
