"""The contract model as a Theano-MPI user would use it with our exchanger:
one line at the top of the model file registers it for sync_type='kn'."""
from theanompi_ext.exchange.theanompi_exchanger import install_into_theanompi

install_into_theanompi()

from digits_contract import DigitsMLP  # noqa: E402,F401
