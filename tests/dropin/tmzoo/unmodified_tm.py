"""The unmodified models as a Theano-MPI user runs them inside Theano-MPI's own
worker: one line at the top of the model file installs this project's exchanger."""
from theanompi_ext.theanompi_compat import install_into_theanompi

install_into_theanompi(strict=True)

from tmzoo.unmodified import (NativeLayers, NativeLayersDropout,  # noqa: E402,F401
                              LasagneVGG, LasagneResNet)
