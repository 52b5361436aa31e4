"""Scaling simulator: predicted step time and efficiency for k workers.

Pure Python + numpy-free arithmetic (matplotlib only for ``--plot``); it never
imports Theano or MPI, so ``theanompi-ext simulate`` runs anywhere.

``network``  allreduce cost models (ring, recursive halving/doubling,
             hierarchical NCCL-style) on an alpha-beta link model.
``model``    the step-time model: layers, buckets, overlapped vs serial
             exchange, scaling efficiency.
``presets``  ResNet-50 / VGG16 / AlexNet from their architectures, and the
             goyal2017 and theano-mpi scenarios.
``plot``     efficiency vs k figure.
``cli``      the ``simulate`` sub-command.

See docs/simulator.md.
"""
from .network import Network, ring_allreduce, rhd_allreduce, chain_reduce  # noqa: F401
from .model import (Layer, Workload, step_time, scaling, make_messages,  # noqa: F401
                    load_workload, parse_layers)
from .presets import get_preset, PRESETS  # noqa: F401
