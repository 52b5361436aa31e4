"""A small stand-in for Lasagne (tests only), written for this project.

Same module layout and public names as Lasagne for the subset Theano-MPI's
Lasagne zoo uses, so a model file written for Lasagne (``import lasagne``,
``from lasagne.layers import ...``) runs on it unchanged: ``lasagne.layers``
(layers, ``get_output``, ``get_all_layers``, ``get_all_params``,
``get_output_shape``), ``lasagne.init``, ``lasagne.nonlinearities``,
``lasagne.objectives``, ``lasagne.random``. Behaviour follows Lasagne's
documentation (parameter tags, naming, batch-norm running statistics
updated through ``default_update``, dropout through a random stream).
"""
from . import random  # noqa: F401
from . import utils  # noqa: F401
from . import init  # noqa: F401
from . import nonlinearities  # noqa: F401
from . import objectives  # noqa: F401
from . import layers  # noqa: F401

__version__ = '0.2.dev1+fake'
