"""``bench overlap --contract MODULE:CLASS``: the overlap on a Theano-MPI model.

The model is a Theano-MPI model class (``docs/migrating-from-theano-mpi.md``),
imported by module name (or a ``.py`` path) as our worker imports it. Each
rank builds it twice and gives each instance a
:class:`~theanompi_ext.theanompi_compat.stepper.ContractStepper`: serial
(``overlap=False``: one gradient function, the exchange after it) and
overlapped (``overlap=True``, the backward chunks found in the model's graph
by :func:`~theanompi_ext.theanompi_compat.chunks.find_chunks`). The model's
own train functions are not compiled: the steppers take over where the
model calls them (:meth:`ContractStepper.take_over`), so nothing would run
them. The model's own ``train_iter`` (or its hook ``load_train_batch``)
loads file batch 0; then :func:`~theanompi_ext.bench.overlap.measure_pair`
times the modes on its sub-batch 0, exactly as for the zoo models
(``compute``: the serial stepper's backward and update without exchange).
The batch is the model's own (``model.batch_size``, in the row).
"""
import re

from ..exchange.modes import OVERLAP, SERIAL


def parse_contract(text):
    """``'MODULE:CLASS'`` -> ``(module, class)``; ValueError when malformed."""
    module, sep, cls = str(text).rpartition(':')
    if not sep or not module or not re.fullmatch(r'[A-Za-z_]\w*', cls):
        raise ValueError("--contract wants MODULE:CLASS (a Theano-MPI model class; MODULE "
                         "importable or a .py path), got %r" % (text,))
    return module, cls


def _build(comm, module, cls_name, exch_strategy, device):
    """One instance of the model, built on every rank (rank 0 first)."""
    from ..step.assemble import compile_in_turn
    from ..theanompi_compat.worker import import_model_class
    cls = import_model_class(module, cls_name)
    config = {'verbose': False, 'rank': comm.rank, 'size': comm.size, 'mname': cls_name,
              'device': device, 'sync_type': 'kn', 'exch_strategy': exch_strategy}
    return compile_in_turn(comm, lambda: cls(config))


def _options(model, spec):
    """The stepper's options: the model's, the bench's bucket caps and wire, no warm-up."""
    from ..theanompi_compat.options import resolve_options
    opts = resolve_options(model, environ={})
    opts['warmup'] = 'none'
    for key in ('bucket_cap_mb', 'first_bucket_cap_mb', 'wire_dtype'):
        if spec.get(key):
            opts[key] = spec[key]
    return opts


def _load_first_batch(model, stepper):
    """File batch 0 into the model's shared variables, the way our worker loads it."""
    hook = getattr(model, 'load_train_batch', None)
    if hook is not None:
        hook(0)
        return
    from ..theanompi_compat.worker import Recorder
    before = stepper.train_fn.calls
    model.train_iter(0, Recorder())          # loads, then runs our step once
    stepper.train_fn.expect_one_call(before, 'model.train_iter(0)')


def stepper_pair(comm, ref, spec):
    """(serial stepper, overlapped stepper, chunking) of contract model ``ref``
    ('MODULE:CLASS'), each on its own instance with file batch 0 loaded."""
    from ..theanompi_compat.chunks import find_chunks
    from ..theanompi_compat.stepper import ContractStepper
    module, cls = parse_contract(ref)
    devices = spec.get('device', 'cpu').split(',')
    device = devices[comm.rank] if len(devices) > 1 else devices[0]
    steppers, found = {}, None
    for strategy in (SERIAL, OVERLAP):
        model = _build(comm, module, cls, strategy, device)
        chunks = None
        if strategy == OVERLAP:
            found = find_chunks(model)
            if found.entries is None:
                raise ValueError('%s: nothing to overlap: %s' % (ref, found.why))
            chunks = found.entries
        stepper = ContractStepper(model, comm, 'kn', _options(model, spec),
                                  log=lambda *a, **k: None, overlap=strategy == OVERLAP,
                                  chunks=chunks)
        stepper.take_over()
        steppers[strategy] = stepper
    # (compile_in_turn already returns on every rank together.)
    for stepper in steppers.values():
        _load_first_batch(stepper.model, stepper)
    return steppers[SERIAL], steppers[OVERLAP], found


def measure_contract(comm, ref, spec):
    """Time the modes for contract model ``ref`` (every rank); the row on rank 0, else None."""
    from .overlap_pair import measure_pair
    serial, overlap, found = stepper_pair(comm, ref, spec)
    return measure_pair(comm, ref, spec, serial, overlap, (0, None), (0,), dict(
        source='contract', batch=serial.n, chunks_found=found.why,
        bucket_cap_mb=serial.opts['bucket_cap_mb'],
        first_bucket_cap_mb=serial.opts['first_bucket_cap_mb']))
