"""The math of the update, as plain numpy functions (no MPI; only ``device``
compiles, through the engine).

``schedule``  linear scaling rule, warm-up (gradual / constant / none /
              Theano-MPI's geometric per-epoch), step decay.
``momentum``  momentum SGD in the forms of eqs. (9) and (10), momentum
              correction, Nesterov, weight decay.
``policy``    which parameters are exchanged, which get weight decay, and
              how a locally updated parameter's gradient is rescaled.
``rules``     the updates of the sync rules kn, avg, cdd (and kn's on a device):
              they only update; the step (:mod:`theanompi_ext.step`) exchanges.
``device``    the same momentum SGD compiled for the device's flat buffers.
"""
from .schedule import Schedule  # noqa: F401
from .momentum import Optimizer  # noqa: F401
