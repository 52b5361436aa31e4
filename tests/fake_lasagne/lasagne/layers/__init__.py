"""Layers and the helpers that walk a layer graph (Lasagne's names)."""
from .base import Layer, MergeLayer  # noqa: F401
from .input import InputLayer  # noqa: F401
from .dense import DenseLayer, NonlinearityLayer  # noqa: F401
from .conv import Conv2DLayer  # noqa: F401
from .pool import Pool2DLayer, MaxPool2DLayer, GlobalPoolLayer  # noqa: F401
from .merge import ElemwiseSumLayer  # noqa: F401
from .normalization import BatchNormLayer  # noqa: F401
from .noise import DropoutLayer  # noqa: F401
from .helper import (get_all_layers, get_output, get_output_shape,  # noqa: F401
                     get_all_params, count_params)
