"""Exchange: what the ranks communicate each step, and the update rule around it.

``kn``   (new) each worker's loss over kn, gradients allreduce-summed in
         buckets, one global momentum-SGD update (optionally overlapped
         with backprop).
``avg``  (Theano-MPI) local SGD step, then parameters averaged.
``cdd``  (Theano-MPI) local momentum over n, momenta summed, w -= lr*sum/k.

:func:`make_rule` builds one by ``sync_type``; :class:`BSP_Exchanger`
is the Theano-MPI-shaped front door.
"""
from .rules import make_rule  # noqa: F401
from .modes import SYNC_TYPES, EXCH_STRATEGIES, check_mode  # noqa: F401
