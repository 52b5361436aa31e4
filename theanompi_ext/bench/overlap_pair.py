"""Inside each rank of ``bench overlap``: time a serial/overlapped pair, make its row.

The pair is two trainers (:class:`~theanompi_ext.train.trainer.Trainer`, a
zoo model) or two :class:`~theanompi_ext.theanompi_compat.stepper.ContractStepper`
(a Theano-MPI model, :mod:`.overlap_contract`) of the same model, one with
the serial exchanger and one with the overlapped one; both kinds have
``backward``, ``grads``, ``layout``, ``rule``, ``params``, ``exchanger``,
``buckets``, ``n_exch``, ``step`` and a settable ``timeline``.
:func:`measure_pair` times the modes of :data:`MODES` alternately
(:func:`~.timing.time_modes`) and returns the slower rank's figures on rank 0
(the fields are described in :mod:`.overlap`).
"""
import json
import re

import numpy as np

MODES = ('compute', 'compute_chunked', 'serial', 'overlap', 'allreduce')


def hidden_fraction(compute, serial, overlap):
    """(serial - overlap) / (serial - compute); None when the exchange costs under
    :data:`.compare_stats.MIN_COST` of compute (the ratio would be noise)."""
    from .compare_stats import MIN_COST
    cost = serial - compute
    if cost <= MIN_COST * compute:
        return None
    return (serial - overlap) / cost


def compute_step(trainer, x, y, lr):
    """Forward + backward + update of ``trainer``, without any exchange.

    ``trainer`` is a :class:`~theanompi_ext.train.trainer.Trainer` (``x``,
    ``y``: the batch) or a :class:`~theanompi_ext.theanompi_compat.stepper.ContractStepper`
    (``x``: the sub-batch index of the loaded batch, ``y`` None): both have
    ``backward``, ``grads``, ``layout``, ``rule``, ``params``.
    """
    trainer.backward.run(x, y, trainer.grads, trainer.layout)
    # the rule's update alone (a device rule reads no host values)
    values = None if trainer.device_grads is not None else trainer.params.values
    trainer.rule.update(values, trainer.grads, lr)
    trainer.params.push()


def measure_pair(comm, name, spec, serial, overlap, batch, step_args, fields):
    """Time the modes of a serial/overlapped pair (every rank); the row on rank 0, else None.

    ``serial``/``overlap``: two trainers, or two contract steppers, of the same
    model; ``batch``: the ``(x, y)`` their backward runs on; ``step_args``: what
    their ``step`` takes; ``fields``: more entries of the row.
    """
    from .timing import time_modes
    run = _mode_steps(serial, overlap, batch, step_args)

    def fresh_timelines():
        serial.timeline, overlap.timeline = serial.make_timeline(), overlap.make_timeline()
    cpu = {}
    # warm-up: first calls allocate and fault pages
    times = time_modes(run, MODES, spec['steps'], spec['reps'], comm.barrier,
                       after_warmup=fresh_timelines, cpu=cpu)
    mine = dict((m + '_s', float(np.median(times[m]))) for m in MODES)
    mine['exposed_comm_rank_s'] = float(np.median(overlap.timeline.exposed_comm()))
    mine.update(('cpu_per_wall_' + m, cpu[m][0] / max(cpu[m][1], 1e-9)) for m in MODES)
    everyone = comm.allgather(json.dumps(mine))
    traces = {label: tr.timeline.gather(comm) for label, tr in (('serial', serial),
                                                                 ('overlap', overlap))}
    saved = _saved_bytes(overlap.backward, batch)
    if comm.rank != 0:
        return None
    if spec.get('timeline'):
        from ..exchange.timeline import write_trace
        for label, trace in traces.items():
            write_trace(trace, '%s-%s-%s' % (spec['timeline'], re.sub(r'[^\w.-]', '_', name),
                                             label))
    row = _overlap_row([json.loads(e) for e in everyone], traces, serial, overlap, saved,
                       name, spec, comm.size)
    row.update(fields)
    return row


def _mode_steps(serial, overlap, batch, step_args):
    """``{mode: one step of it}`` for :data:`MODES`."""
    lr = np.float32(0.001)
    if serial.device_grads is not None:
        from ..engine.core import device_zeros
        zeros = device_zeros(serial.layout.total)
    else:
        zeros = np.zeros_like(serial.grads)
    return {
        'compute': lambda: compute_step(serial, batch[0], batch[1], lr),
        'compute_chunked': lambda: compute_step(overlap, batch[0], batch[1], lr),
        'serial': lambda: serial.step(*step_args),
        'overlap': lambda: overlap.step(*step_args),
        'allreduce': lambda: serial.exchanger.reduce(zeros),
    }


def _extra_bytes(overlap):
    """Memory the overlapped exchange adds: the host staging buffer on a device,
    else the bucket buffers that are not views of the gradients."""
    if overlap.device_grads is not None:
        return overlap.exchanger.host.nbytes
    grads = overlap.grads
    return sum(h.buf.nbytes for h in overlap.exchanger.last_handles
               if not np.shares_memory(h.buf, grads))


def _overlap_row(ranks, traces, serial, overlap, saved, name, spec, k):
    """The table row of model ``name``: the slower rank's figures and the job's."""
    row = {key: max(r[key] for r in ranks) for key in ranks[0]}   # the slower rank
    # Exposed communication of the job: after the last rank's backward pass
    # (a rank's own figure also counts waiting for a slower rank's compute).
    job = {label: t['otherData']['job_exposed_comm_median_us'] / 1e6
           for label, t in traces.items()}
    row.update(exposed_comm_s=job['overlap'], serial_exposed_comm_s=job['serial'])
    row.update(model=name, network=spec['network'], extra_bytes=int(_extra_bytes(overlap)),
               hidden_fraction=hidden_fraction(row['compute_s'], row['serial_s'],
                                               row['overlap_s']),
               chunk_overhead=row['compute_chunked_s'] / row['compute_s'] - 1.0,
               grad_bytes=4 * int(serial.n_exch), n_buckets=len(serial.buckets),
               n_chunks=overlap.backward.n_chunks, chunk_saved_bytes=saved,
               workers=k, batch=spec['batch'], steps=spec['steps'], reps=spec['reps'],
               comm_thread=spec['comm_thread'])
    return row


def _saved_bytes(backward, batch):
    """Bytes of forward intermediates the chunked backward carries to its chunks."""
    out = backward.forward_fn(*backward.graph.feed(*batch))
    return int(sum(np.asarray(v).nbytes for v in out[2:]))
