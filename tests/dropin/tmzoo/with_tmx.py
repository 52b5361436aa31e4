"""The same models as a Theano-MPI user runs them inside Theano-MPI's own worker:
one line at the top of the model file installs this project's exchanger."""
from theanompi_ext.theanompi_compat import install_into_theanompi

install_into_theanompi(strict=True)

from tmzoo.subbatch import (Cifar10Like, C01bLasagneLike,  # noqa: E402,F401
                            Cifar10LikeLayered, C01bLasagneLikeLayered)
