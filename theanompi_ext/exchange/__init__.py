"""Exchange: the kn-sum of the gradient buckets across ranks (serial or started
during backprop), on the host or for device buffers, and its timeline.

The vocabulary of modes (``sync_type`` x ``exch_strategy`` x wire) is
:mod:`.modes`; the rules' updates (kn, avg, cdd) are in
:mod:`theanompi_ext.update.rules`; the step that starts and finishes an
exchange is :mod:`theanompi_ext.step`.
"""
from .modes import SYNC_TYPES, EXCH_STRATEGIES, check_mode  # noqa: F401
