"""The exchange's vocabulary, ``sync_type`` x ``exch_strategy``, and its one check.

Every entry point (``TrainConfig.validate``, the ``train`` options, ``BSP.init``,
the session-file reader, the Theano-MPI exchanger, the contract worker and
stepper) asks :func:`check_mode`, so a combination is refused everywhere with
the same words.

Two vocabularies share the option name ``exch_strategy``:

* **ours** (:data:`EXCH_STRATEGIES`) says *when* the gradients travel:
  ``ar`` one allreduce after the whole backward pass, ``ar-overlap`` each
  bucket's allreduce started during it;
* **Theano-MPI's** (:data:`THEANOMPI_STRATEGY_BACKENDS`) says *how* they
  travel: its ``ar`` is the MPI backend, ``nccl32`` NCCL. Only
  :mod:`theanompi_ext.theanompi_compat.strategy` reads these.

This module imports only ``errors.py``: the launching side (``BSP``) uses it before
any rank starts.
"""

from ..errors import ModeError

SYNC_TYPES = ('kn', 'avg', 'cdd')
# Ours: when the gradients travel (see the module docstring).
SERIAL, OVERLAP = 'ar', 'ar-overlap'
EXCH_STRATEGIES = (SERIAL, OVERLAP)
# Rules whose exchange is a sum of gradients: only there can a bucket start
# during the backward pass, and only there is a 16-bit wire summed in float32
# (avg and cdd exchange parameters or momenta after the local step).
GRADIENT_SUM_SYNC_TYPES = ('kn',)
# Rules Theano-MPI does not have: inside Theano-MPI's worker only these go to
# our exchanger, avg and cdd stay with Theano-MPI's own.
NEW_SYNC_TYPES = ('kn',)

# Modes of Theano-MPI's BSP we do not offer under the option that names them.
THEANOMPI_ONLY = {
    'exch_strategy': {'nccl32': 'pygpu NCCL within one node',
                      'nccl16': 'pygpu NCCL in float16',
                      'asa32': 'alltoall-sum-allgather over CUDA-aware MPI',
                      'asa16': 'alltoall-sum-allgather in float16'},
    'sync_type': {'swap': 'parameter swapping'},
}
CHOICES = {'sync_type': SYNC_TYPES, 'exch_strategy': EXCH_STRATEGIES}

# Theano-MPI's exch_strategy names -> our collective backend (its 'ar' is MPI).
THEANOMPI_STRATEGY_BACKENDS = {'ar': 'mpi', 'nccl32': 'nccl'}
# Theano-MPI strategy names we know but did not build, with what to use instead.
THEANOMPI_STRATEGIES_NOT_BUILT = {
    'nccl16': "exch_strategy 'nccl16' (fp16-compressed NCCL allreduce) is not "
              "implemented as a strategy; use 'nccl32' with the option "
              "wire_dtype='float16' (NCCL's half sum), or 'ar' (MPI)",
    'asa32': "exch_strategy 'asa32' (alltoall-sum-allgather over CUDA-aware MPI) is not "
             "implemented; use 'nccl32' for GPU buffers or 'ar' for host buffers",
    'asa16': "exch_strategy 'asa16' (fp16 alltoall-sum-allgather) is not implemented as "
             "a strategy; use 'ar' with the option wire_dtype='float16' (host buffers: "
             "alltoall, float32 sum, allgather) or 'nccl32'",
}


def default_strategy(sync_type):
    """Our ``exch_strategy`` when none is given: overlap wherever it exists."""
    return OVERLAP if sync_type in GRADIENT_SUM_SYNC_TYPES else SERIAL


def check_choice(option, value):
    """Refuse a ``sync_type`` or ``exch_strategy`` outside our vocabulary (ModeError)."""
    choices = ', '.join(CHOICES[option])
    theirs = THEANOMPI_ONLY[option].get(value)
    if theirs:
        raise ModeError(option, value, "Theano-MPI's %s, which theanompi_ext does not offer "
                        "(run it in Theano-MPI itself); choose from %s" % (theirs, choices))
    if value not in CHOICES[option]:
        raise ModeError(option, value, 'choose from %s' % choices)
    return value


def check_mode(sync_type, exch_strategy, wire_dtype='float32'):
    """Refuse a bad ``(sync_type, exch_strategy, wire_dtype)`` with a :class:`ModeError`.

    ``exch_strategy`` is ours (``ar``/``ar-overlap``, not empty: see
    :func:`default_strategy`). ``wire_dtype`` is assumed a known name (the
    callers check it against :data:`~theanompi_ext.collective.wire.WIRE_DTYPES`);
    here only its combination with the rule is checked.
    Returns the triple unchanged.
    """
    check_choice('sync_type', sync_type)
    check_choice('exch_strategy', exch_strategy)
    if exch_strategy == OVERLAP and sync_type not in GRADIENT_SUM_SYNC_TYPES:
        raise ModeError('exch_strategy', exch_strategy,
                        'overlap exists only for sync_type=kn, not %s (avg and cdd exchange '
                        'parameters or momenta after the local step)' % sync_type)
    if wire_dtype != 'float32' and sync_type not in GRADIENT_SUM_SYNC_TYPES:
        raise ModeError('wire_dtype', wire_dtype,
                        "a 16-bit wire exists only for sync_type=kn's gradient sums (avg and "
                        "cdd exchange parameters and momenta in float32)")
    return sync_type, exch_strategy, wire_dtype


def theanompi_backend(exch_strategy):
    """Our backend name ('mpi', 'nccl') for a *Theano-MPI* ``exch_strategy``.

    Raises ``NotImplementedError`` for its strategies we did not build
    (``nccl16``, ``asa32``, ``asa16``) and ``ValueError`` for unknown names.
    """
    key = str(exch_strategy).lower()
    if key in THEANOMPI_STRATEGY_BACKENDS:
        return THEANOMPI_STRATEGY_BACKENDS[key]
    if key in THEANOMPI_STRATEGIES_NOT_BUILT:
        raise NotImplementedError(THEANOMPI_STRATEGIES_NOT_BUILT[key])
    raise ValueError('unknown exch_strategy %r; choose from %s'
                     % (exch_strategy, sorted(THEANOMPI_STRATEGY_BACKENDS)))
