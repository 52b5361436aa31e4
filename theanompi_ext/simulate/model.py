"""Step-time model: one synchronous SGD iteration on ``k`` workers.

A workload is a forward time plus, per layer in backward order (output layer
first), the layer's backward time, its gradient size and how many parameter
tensors it holds. Two ways to exchange the gradients:

overlapped (DDP-style buckets)
    Layers are packed into buckets in backward order; a bucket is closed
    once it holds at least ``bucket_cap_bytes`` (so it exceeds the cap by at
    most its last layer), as PyTorch DDP does. A bucket's allreduce starts
    when its last gradient is ready *and* the previous bucket's allreduce has
    finished (one communication stream, first in first out). Step time is
    ``forward + max(backward, end of the last allreduce)``.
serial (Theano-MPI's exchange)
    All allreduces run after the whole backward pass, one after another:
    ``forward + backward + sum of allreduces`` (optionally plus a barrier).

Without bucketing (``bucket_cap_bytes`` None or 0) every parameter tensor
is its own allreduce, which is what Theano-MPI does (one per shared
variable) and what Goyal et al.'s Caffe2 does (one per parameter blob, each
started as soon as its layer's backward is done).

Scaling efficiency for ``k`` workers is weak scaling (per-worker batch
fixed): ``step_time(1 worker, no communication) / step_time(k)``.
"""
import json
import math
from dataclasses import dataclass, field
from typing import List, Optional, Tuple


@dataclass(frozen=True)
class Layer:
    """One layer's share of backprop: seconds, gradient bytes, tensor count."""
    name: str
    backward_s: float
    grad_bytes: float
    tensors: int = 1

    def __post_init__(self):
        if not (isinstance(self.backward_s, (int, float))
                and math.isfinite(self.backward_s) and self.backward_s >= 0):
            raise ValueError('layer %r: backward_s must be a finite number >= 0, '
                             'got %r' % (self.name, self.backward_s))
        if not (isinstance(self.grad_bytes, (int, float))
                and math.isfinite(self.grad_bytes) and self.grad_bytes >= 0):
            raise ValueError('layer %r: grad_bytes must be a finite number >= 0, '
                             'got %r' % (self.name, self.grad_bytes))
        if (isinstance(self.tensors, bool) or not isinstance(self.tensors, int)
                or self.tensors < 1):
            raise ValueError('layer %r: tensors must be an integer >= 1, got %r'
                             % (self.name, self.tensors))


@dataclass(frozen=True)
class Workload:
    """A model on a device: forward seconds and layers in backward order."""
    layers: Tuple[Layer, ...]
    forward_s: float
    name: str = 'custom'
    per_worker_batch: Optional[int] = None

    def __post_init__(self):
        object.__setattr__(self, 'layers', tuple(self.layers))
        if not self.layers:
            raise ValueError('workload %r has no layers' % (self.name,))
        if not (isinstance(self.forward_s, (int, float))
                and math.isfinite(self.forward_s) and self.forward_s >= 0):
            raise ValueError('forward time must be a finite number >= 0 s, got %r'
                             % (self.forward_s,))
        b = self.per_worker_batch
        if b is not None and (isinstance(b, bool) or not isinstance(b, int) or b < 1):
            raise ValueError('per_worker_batch must be an integer >= 1, got %r' % (b,))

    @property
    def backward_s(self):
        """Total backward seconds (sum over layers)."""
        return sum(l.backward_s for l in self.layers)

    @property
    def compute_s(self):
        """Forward plus backward seconds: the step time of one worker."""
        return self.forward_s + self.backward_s

    @property
    def grad_bytes(self):
        """Total gradient bytes exchanged per step."""
        return sum(l.grad_bytes for l in self.layers)

    @property
    def tensors(self):
        """Number of parameter tensors with a gradient."""
        return sum(l.tensors for l in self.layers if l.grad_bytes > 0)


def parse_layers(entries, source='layers'):
    """Validate a decoded layers list (dicts with name/backward_s/grad_bytes).

    ``tensors`` is optional (default 1). Raises ValueError naming the entry
    and field at fault.
    """
    if not isinstance(entries, list):
        raise ValueError('%s: expected a JSON list of layers, got %s'
                         % (source, type(entries).__name__))
    if not entries:
        raise ValueError('%s: the list of layers is empty' % (source,))
    layers = []
    for i, e in enumerate(entries):
        where = '%s: layer %d' % (source, i)
        if not isinstance(e, dict):
            raise ValueError('%s: expected an object, got %r' % (where, e))
        missing = [f for f in ('name', 'backward_s', 'grad_bytes') if f not in e]
        if missing:
            raise ValueError('%s: missing field(s) %s' % (where, ', '.join(missing)))
        unknown = set(e) - {'name', 'backward_s', 'grad_bytes', 'tensors'}
        if unknown:
            raise ValueError('%s: unknown field(s) %s' % (where, ', '.join(sorted(unknown))))
        if not isinstance(e['name'], str):
            raise ValueError('%s: name must be a string, got %r' % (where, e['name']))
        for f in ('backward_s', 'grad_bytes'):
            v = e[f]
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ValueError('%s (%s): %s must be a number, got %r'
                                 % (where, e['name'], f, v))
        try:
            layers.append(Layer(e['name'], float(e['backward_s']),
                                float(e['grad_bytes']), e.get('tensors', 1)))
        except ValueError as exc:
            raise ValueError('%s: %s' % (where, exc)) from None
    return layers


def load_workload(path, forward_s=None):
    """Read a layers JSON file into a :class:`Workload`.

    The file is either a list of layers, an object ``{"layers": [...],
    "forward_s": ..., "per_worker_batch": ..., "name": ...}``, or the Chrome
    trace of ``train --timeline`` (see :mod:`.trace`). ``forward_s``
    given here wins over the file's; with neither, forward is taken as half
    the backward time (the ratio the goyal2017 preset uses) and the returned
    workload's name says so.
    """
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as exc:
        raise ValueError('cannot read layers file %r: %s' % (path, exc.strerror)) from None
    except json.JSONDecodeError as exc:
        raise ValueError('layers file %r is not valid JSON: %s' % (path, exc)) from None
    name, batch, file_fwd = str(path), None, None
    from .trace import is_trace, layers_from_trace
    if is_trace(doc):    # a training timeline: its chunks are the layers
        doc = layers_from_trace(doc, source='timeline %r' % (path,))
    if isinstance(doc, dict):
        unknown = set(doc) - {'layers', 'forward_s', 'per_worker_batch', 'name'}
        if unknown:
            raise ValueError('layers file %r: unknown key(s) %s'
                             % (path, ', '.join(sorted(unknown))))
        name = doc.get('name', name)
        batch = doc.get('per_worker_batch')
        file_fwd = doc.get('forward_s')
        if file_fwd is not None and (isinstance(file_fwd, bool)
                                     or not isinstance(file_fwd, (int, float))):
            raise ValueError('layers file %r: forward_s must be a number, got %r'
                             % (path, file_fwd))
        doc = doc.get('layers')
    layers = parse_layers(doc, source='layers file %r' % (path,))
    fwd = forward_s if forward_s is not None else file_fwd
    if fwd is None:
        fwd = 0.5 * sum(l.backward_s for l in layers)
        name += ' (forward assumed = backward/2)'
    return Workload(layers, fwd, name=name, per_worker_batch=batch)


@dataclass(frozen=True)
class Message:
    """A group of allreduces issued together: ``count`` tensors, ``nbytes`` total."""
    ready_s: float
    nbytes: float
    count: int = 1
    layers: Tuple[str, ...] = ()

    def cost(self, net, k, wire_scale=1.0, cast_s_per_byte=0.0, shared_link=False):
        """Seconds the allreduces of this message occupy the comm stream.

        ``wire_scale``: bytes on the wire per float32 byte (0.5 for a 16-bit
        wire); ``cast_s_per_byte``: seconds per float32 byte of the wire
        casts (encode, float32 sum, decode), which run on the comm stream.
        ``shared_link`` True: the latency terms are the ranks' CPU work and
        the byte terms one link that all ranks' traffic queues on (a shaped
        loopback); the queue drains while the ranks compute their steps, so
        the message costs the larger of the two, not their sum.
        """
        # Unbucketed tensors are separate allreduces, each paying latency.
        per = wire_scale * self.nbytes / self.count
        cast = cast_s_per_byte * self.nbytes
        if not shared_link:
            return self.count * net.allreduce(per, k) + cast
        latency = net.allreduce(0.0, k)
        return max(self.count * latency + cast, self.count * (net.allreduce(per, k) - latency))


def make_messages(workload, bucket_cap_bytes=None, buckets=None):
    """The allreduces of one step, in issue order, with their ready times.

    ``bucket_cap_bytes`` None or 0: one allreduce per parameter tensor (a
    layer's tensors are all ready when its backward ends). Otherwise layers
    with a gradient are packed into DDP-style buckets in backward order.
    ``buckets`` (a list of bytes, in issue order) gives a plan made
    elsewhere instead (e.g. the trainer's, read from its timeline); see
    :func:`planned_messages`.
    """
    if buckets is not None:
        return planned_messages(workload, buckets)
    if bucket_cap_bytes is not None and not (bucket_cap_bytes >= 0):
        raise ValueError('bucket cap must be >= 0 bytes, got %r' % (bucket_cap_bytes,))
    out, t = [], 0.0
    pending, pending_bytes, pending_count = [], 0.0, 0
    for layer in workload.layers:
        t += layer.backward_s
        if layer.grad_bytes <= 0:
            continue                       # e.g. pooling: time, no gradient
        if not bucket_cap_bytes:
            out.append(Message(t, layer.grad_bytes, layer.tensors, (layer.name,)))
            continue
        pending.append(layer.name)
        pending_bytes += layer.grad_bytes
        pending_count += layer.tensors
        if pending_bytes >= bucket_cap_bytes:
            # A bucket is one fused allreduce, whatever its tensor count.
            out.append(Message(t, pending_bytes, 1, tuple(pending)))
            pending, pending_bytes, pending_count = [], 0.0, 0
    if pending:
        out.append(Message(t, pending_bytes, 1, tuple(pending)))
    return out


def planned_messages(workload, buckets):
    """One fused allreduce per bucket of a given plan, each ready when its bytes are.

    ``buckets`` are byte sizes in issue order covering the layers' gradients
    in backward order (a bucket never splits a parameter, and a layer holds
    whole parameters, so cumulative bytes tell where each bucket ends): a
    bucket is ready when the first layer whose cumulative gradient bytes
    reach the bucket's cumulative bytes has finished its backward.
    """
    sizes = [float(b) for b in buckets]
    if not sizes or any(not (b > 0 and math.isfinite(b)) for b in sizes):
        raise ValueError('bucket plan: sizes must be finite numbers > 0 bytes, got %r'
                         % (buckets,))
    total = workload.grad_bytes
    if abs(sum(sizes) - total) > 1e-6 * max(total, 1.0):
        raise ValueError('bucket plan: the buckets hold %g bytes, the layers %g'
                         % (sum(sizes), total))
    out, layers = [], list(workload.layers)
    done = covered = t = 0.0
    i = 0
    for b in sizes:
        done += b
        names = []
        while i < len(layers) and covered < done * (1 - 1e-9):
            covered += layers[i].grad_bytes
            t += layers[i].backward_s
            names.append(layers[i].name)
            i += 1
        out.append(Message(t, b, 1, tuple(names)))
    return out


@dataclass(frozen=True)
class StepResult:
    """Predicted time of one step on ``k`` workers, and where it goes."""
    k: int
    overlap: bool
    forward_s: float
    backward_s: float
    comm_s: float          # time the comm stream is busy (sum of allreduces)
    step_s: float
    allreduces: int        # number of allreduce calls per step
    messages: List[Message] = field(default_factory=list, repr=False)

    @property
    def exposed_comm_s(self):
        """Communication not hidden behind backprop: step minus compute."""
        return self.step_s - self.forward_s - self.backward_s

    @property
    def efficiency(self):
        """Weak-scaling efficiency vs one worker without communication."""
        return (self.forward_s + self.backward_s) / self.step_s


WIRE_SCALE = {'float32': 1.0, 'float16': 0.5, 'bfloat16': 0.5}


def step_time(workload, net, k, overlap=True, bucket_cap_bytes=None, barrier=False,
              wire_dtype='float32', buckets=None, cast_s_per_byte=0.0, sync_s=0.0,
              sync_queued=False, shared_link=False):
    """Predict one step's time on ``k`` workers; returns a :class:`StepResult`.

    ``overlap`` True: allreduces start as their bucket becomes ready, on one
    FIFO comm stream. False: they all run after backward (serial), plus a
    barrier if ``barrier``. ``wire_dtype``: what the gradients travel as
    (buckets are still planned on float32 bytes). ``buckets``: a given
    bucket plan (see :func:`planned_messages`). ``cast_s_per_byte``: the
    wire casts' seconds per float32 byte, on the comm stream (0 by default:
    the presets' GPUs cast at memory speed). ``sync_s``: seconds of the
    collectives the training thread runs after backward, before waiting for
    the buckets (e.g. the allreduce of the loss statistics), in both modes;
    ``sync_queued`` True: in the overlapped mode they wait for the buckets
    already on the comm stream (MPI over one TCP stream per pair of ranks
    delivers their messages behind the buckets'), else they run beside them.
    ``shared_link``: see :meth:`Message.cost` (one host's ranks on a shaped
    loopback, as ``bench validate`` runs them).
    """
    k = net.check_workers(k)
    msgs = make_messages(workload, bucket_cap_bytes, buckets)
    bwd = workload.backward_s
    costs = [m.cost(net, k, WIRE_SCALE[wire_dtype], cast_s_per_byte, shared_link)
             for m in msgs]
    comm = sum(costs)
    sync = sync_s
    if overlap:
        free = 0.0                          # when the comm stream is next idle
        for m, c in zip(msgs, costs):
            free = max(m.ready_s, free) + c
        tail = max(bwd, free) + sync if sync_queued else max(bwd + sync, free)
    else:
        if barrier:
            comm += net.barrier(k)
        tail = bwd + sync + comm
    return StepResult(k=k, overlap=overlap, forward_s=workload.forward_s,
                      backward_s=bwd, comm_s=comm, step_s=workload.forward_s + tail,
                      allreduces=sum(m.count for m in msgs), messages=msgs)


def scaling(workload, net, ks, bucket_cap_bytes=None, baseline_k=1, barrier=False,
            wire_dtype='float32'):
    """Step results for every ``k`` in ``ks``, overlapped and serial.

    Returns a list of dicts ``{'k', 'overlap', 'serial'}`` whose values are
    :class:`StepResult`, plus ``'overlap_rel'``/``'serial_rel'``: efficiency
    relative to ``baseline_k`` workers in the same mode, i.e.
    ``step(baseline_k) / step(k)``. The overlapped mode uses the buckets; the
    serial mode is Theano-MPI's, one allreduce per tensor.
    """
    if not ks:
        raise ValueError('no worker counts given')
    base_o = step_time(workload, net, baseline_k, True, bucket_cap_bytes, wire_dtype=wire_dtype)
    base_s = step_time(workload, net, baseline_k, False, None, barrier, wire_dtype)
    rows = []
    for k in ks:
        o = step_time(workload, net, k, True, bucket_cap_bytes, wire_dtype=wire_dtype)
        s = step_time(workload, net, k, False, None, barrier, wire_dtype)
        rows.append({'k': o.k, 'overlap': o, 'serial': s,
                     'overlap_rel': base_o.step_s / o.step_s,
                     'serial_rel': base_s.step_s / s.step_s})
    return rows
