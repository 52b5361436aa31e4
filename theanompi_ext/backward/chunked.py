"""The backward pass as separately compiled chunks, output layer first.

Why chunks: a compiled Theano function holds the GIL for its whole run, so
communication cannot be started from Python in the middle of one. Cutting
backprop into one compiled function per group of top-level layers gives
the caller a moment after each group (``on_chunk``) to start the allreduce
of every bucket whose gradients are now final, while a thread parked in
MPI moves it during the next chunk.

How (one model graph, no cloning):

* the *forward* function computes the loss from ``(x, y)``, applies the
  batch-norm running-statistic updates, and also returns every forward
  intermediate that some chunk's gradient reads (its *cut points*);
* chunk ``c`` covers top-level layers ``[first, stop)`` with output ``h_out``
  and input ``h_in``; its gradient graph is
  ``grad(None, wrt=params + [h_in], known_grads={h_out: g_out})`` (the
  output chunk uses the real cost instead of ``known_grads``). A parameter
  of a chunk nearer the input that this chunk's ops also use (a tied
  weight, weight decay inside the loss) is in ``wrt`` too, with the
  gradient stopped at ``h_in``: that part is added to what its own chunk
  gives, which runs later (so its bucket still starts when it is final). Passing
  intermediate variables as inputs of ``theano.function`` cuts the graph
  there, so a chunk function takes ``g_out`` and its cut points and never
  reruns the forward's expensive ops. The cut points are found by walking
  the chunk's gradient graph back to the first forward variables that
  depend on the data and are worth carrying: outputs of expensive ops
  (convolutions, products, reductions) and the chunk boundaries. Cheap
  element-wise ops and views in between are recomputed inside the chunk
  (:data:`CHEAP_OPS`), as is anything that depends only on parameters (a
  dimshuffled gamma, say), and the whole output chunk (a classifier layer
  and the loss), which makes its gradient fuse exactly as in the
  monolithic function.

The gradients are bitwise identical to
:class:`~theanompi_ext.backward.monolithic.MonolithicBackward`'s (tested;
measured on ResNet-20 too). Chunk functions are compiled without Theano's
in-place element-wise optimisation (:data:`DEFAULT_EXCLUDING`): on these
graphs its in-place kernels ran slower, and leaving it out took the
chunked step from +10% to +3% over the monolithic one (docs/overlap.md).

``params`` is in flat-layout order: exchanged parameters in reverse model
order, then the local ones (see :func:`theanompi_ext.buckets.plan.flat_order`).
Chunks run from the output back, so the exchanged parameters become final
as a growing prefix of that layout; after each chunk ``on_chunk(c, n_ready)``
reports the length of the prefix whose gradients are final. The last call
reports ``len(params)``: everything, the local tail included.
"""
import collections
import time

import numpy as np

from ..engine.core import function, grad, toposort
from .graph import TrainGraph

# One chunk per top-level layer that has parameters (a layer without any,
# e.g. global pooling, joins the chunk on its input side). Measured on
# ResNet-20 (docs/overlap.md): finer chunks cost nothing measurable, and
# they start the first buckets earliest.
DEFAULT_MIN_CHUNK_PARAMS = 1


def plan_chunks(param_counts, min_chunk_params=DEFAULT_MIN_CHUNK_PARAMS, max_chunks=None):
    """Group top-level layers into backward chunks.

    Parameters
    ----------
    param_counts : list of int
        Trainable scalars of each top-level layer, model order.
    min_chunk_params : int
        Walking from the output back, a chunk is closed once it holds at
        least this many scalars (at least 1: a chunk without parameters
        would only add a call). Layers left over at the input end join the
        last chunk.
    max_chunks : int or None
        If set, consecutive chunks are merged into at most this many
        groups of near-equal numbers of chunks.

    Returns
    -------
    list of (first, stop)
        Layer ranges, output chunk first.
    """
    if not param_counts:
        raise ValueError('a network needs at least one layer')
    if max_chunks is not None and int(max_chunks) < 1:
        raise ValueError('max_chunks must be >= 1, got %r' % (max_chunks,))
    need = max(int(min_chunk_params), 1)
    ranges, stop, acc = [], len(param_counts), 0
    for i in range(len(param_counts) - 1, -1, -1):
        acc += int(param_counts[i])
        if acc >= need:
            ranges.append((i, stop))
            stop, acc = i, 0
    if stop > 0:
        if ranges:
            ranges[-1] = (0, ranges[-1][1])
        else:
            ranges.append((0, stop))
    if max_chunks is not None and len(ranges) > max_chunks:
        groups = np.array_split(np.arange(len(ranges)), int(max_chunks))
        ranges = [(ranges[g[-1]][0], ranges[g[0]][1]) for g in groups]
    return ranges


class _Chunk(object):
    """One compiled backward chunk (see module docstring)."""

    def __init__(self, name, fn, param_indices, slots, has_g_out, has_h_in, n_ready):
        self.name = name
        self.label = 'backward:' + name     # its name in the timeline
        self.fn = fn
        self.param_indices = param_indices   # flat-layout index of each grad output
        self.slots = slots                   # where each cut point's value comes from
        self.has_g_out = has_g_out
        self.has_h_in = has_h_in
        self.n_ready = n_ready
        self.release = []                    # slots no later chunk reads
        self.adds = []                       # per gradient output: add to a part already written


# Measured (docs/overlap.md): without it the chunked ResNet-20 step is ~7
# points closer to the monolithic one; results stay bitwise identical.
DEFAULT_EXCLUDING = ('inplace_elemwise_optimizer',)

# Ops whose output a chunk recomputes from the forward values it reads
# rather than receives: element-wise arithmetic and views are cheap next to
# a convolution, and carrying every one of them out of the forward (357
# arrays, 193 MB for ResNet-20) made the forward 75% slower, mostly from
# output copies and lost in-place optimisations.
CHEAP_OPS = frozenset(['Elemwise', 'DimShuffle', 'Reshape', 'Shape', 'Shape_i',
                       'MakeVector', 'Rebroadcast', 'ScalarFromTensor',
                       'TensorFromScalar', 'Subtensor', 'SpecifyShape', 'Join',
                       'ARange'])


class _ForwardIndex(object):
    """Which forward variables depend on the batch, and how they connect."""

    def __init__(self, graph):
        roots = [graph.cost, graph.err_sum] + [u for _, u in graph.stat_updates]
        self.nodes = toposort(roots)
        # State the forward moves (a random generator: its default update)
        # counts as data: a chunk must receive what the forward drew, never
        # draw again.
        state = set(v for node in self.nodes for v in node.inputs
                    if getattr(v, 'default_update', None) is not None)
        self.drawn = set(v for node in self.nodes if any(i in state for i in node.inputs)
                         for v in node.outputs)
        self.data_dep = set(graph.data_roots) | state
        for node in self.nodes:
            if any(v in self.data_dep for v in node.inputs):
                self.data_dep.update(node.outputs)
        # Forward variables that are always materialised: the batch and the
        # top-level layers' outputs (the chunk boundaries).
        self.materialised = set(graph.data_roots) | set(graph.layer_outputs)

    def between(self, start, end=None):
        """Data-dependent variables computed from ``start`` that ``end`` needs
        (all of ``start``'s descendants when ``end`` is None)."""
        down = {start}
        for node in self.nodes:
            if any(v in down for v in node.inputs):
                down.update(node.outputs)
        if end is None:
            return down & self.data_dep
        up = {end}
        for node in reversed(self.nodes):
            if any(v in up for v in node.outputs):
                up.update(node.inputs)
        return down & up & self.data_dep

    def recomputable(self, inside, start, everything=False, ops=CHEAP_OPS):
        """The variables of ``inside`` that a chunk starting at ``start``
        recomputes: cheap ops that are not chunk boundaries, or all but
        ``start`` and the batch when ``everything``."""
        if everything:
            return {v for v in inside if v is not start and v.owner is not None
                    and v not in self.drawn}
        return {v for v in inside if v not in self.materialised and v.owner is not None
                and type(v.owner.op).__name__ in ops and v not in self.drawn}

    def params_used(self, region, params):
        """Indices of ``params`` that the ops computing ``region`` read, directly
        or through expressions of parameters only (``W.T``, ``sum(W ** 2)``)."""
        position = {p: i for i, p in enumerate(params)}
        found, seen, stack = set(), set(), []
        for node in self.nodes:
            if any(v in region for v in node.outputs):
                stack.extend(v for v in node.inputs if v not in self.data_dep)
        while stack:
            v = stack.pop()
            if v in seen:
                continue
            seen.add(v)
            if v in position:
                found.add(position[v])
            elif v.owner is not None:
                stack.extend(u for u in v.owner.inputs if u not in self.data_dep)
        return sorted(found)

    def cut_points(self, outputs, recompute):
        """Forward variables the gradient graph ``outputs`` must receive.

        Walks back from ``outputs`` and stops at the first data-dependent
        forward variable that is not in ``recompute``; everything else
        (gradient ops, recomputed forward pieces, pieces that depend only
        on parameters) is compiled into the chunk.
        """
        cuts, seen, stack = [], set(), list(outputs)
        while stack:
            v = stack.pop()
            if v in seen:
                continue
            seen.add(v)
            if v in self.data_dep and v not in recompute:
                # A shared variable holding the batch (a contract model's
                # shared_x) is read by the chunk itself: no input needed.
                if not hasattr(v, 'get_value'):
                    cuts.append(v)
            elif v.owner is not None:
                stack.extend(v.owner.inputs)
        return cuts


# One chunk's symbolic graph, before compiling: the flat-layout indices of the
# gradients it produces, the layer output it starts from (None for the first
# layers) and the gradient it receives (None for the output chunk), its gradient
# outputs, the forward values it reads, and how many leading parameters are
# complete once it has run.
_ChunkGraph = collections.namedtuple(
    '_ChunkGraph', 'param_indices h_in g_out grads cuts n_ready')


def _layer_param_indices(layers, params):
    """Flat-layout indices of each top-level layer's parameters; ValueError unless
    every parameter belongs to exactly one layer."""
    position = {p: i for i, p in enumerate(params)}
    layer_params = []
    for name, lparams in layers:
        missing = [p.name for p in lparams if p not in position]
        if missing:
            raise ValueError('parameters %s of layer %s are not in the flat layout'
                             % (missing, name))
        layer_params.append([position[p] for p in lparams])
    owned = sorted(i for ps in layer_params for i in ps)
    if owned != list(range(len(params))):
        raise ValueError('every parameter must belong to exactly one top-level layer '
                         '(a parameter shared between layers cannot be chunked)')
    return layer_params


def _set_releases(chunks, n_in):
    """Drop each carried value after the last chunk that reads it, so the
    backward's memory shrinks as it goes (as Theano's own GC does)."""
    last_use = {}
    for c, ch in enumerate(chunks):
        for s in ch.slots:
            last_use[s] = c
    for c, ch in enumerate(chunks):
        ch.release = [s for s in ch.slots if last_use[s] == c and s >= n_in]


class ChunkedBackward(object):
    """Gradients of the kn-normalised loss, one compiled chunk at a time.

    Same interface as :class:`~theanompi_ext.backward.monolithic.MonolithicBackward`.

    Parameters
    ----------
    net : Network
        Ignored when ``graph`` is given.
    params : list of shared variables
        Flat-layout order (exchanged reversed, then local).
    loss_scale : float
        1/(kn).
    bn_groups : int
        Batch-norm statistics over this many groups of the batch.
    min_chunk_params, max_chunks
        Chunk granularity, see :func:`plan_chunks`.
    recompute_output, recompute_ops
        What chunks recompute instead of receiving (module docstring).
    excluding
        Theano optimisations left out of the compiled functions.
    graph
        The symbolic forward to cut (default ``TrainGraph(net, ...)``);
        anything with the attributes and ``feed`` of
        :class:`~theanompi_ext.backward.graph.TrainGraph`, e.g. a
        Theano-MPI model's :class:`~theanompi_ext.theanompi_compat.graph.ContractGraph`.
    device_io
        On a device: the carried values and the gradients stay device
        arrays between the functions (``run`` then fills a device
        ``grads_flat``); no host copy but the batch and two scalars.

    Attributes
    ----------
    n_chunks : int
    chunk_names : list of str
        Output chunk first.
    times : list of (name, t_start, t_end)
        ``time.perf_counter()`` stamps of the last :meth:`run`: the forward
        (``'forward'``) then each chunk (``'backward:<chunk name>'``), for
        the timeline.
    chunk_params : dict
        ``'backward:<chunk name>'`` -> flat-layout indices of the gradients
        the chunk produces (the timeline records their sizes).
    """

    def __init__(self, net, params, loss_scale, bn_groups=1,
                 min_chunk_params=DEFAULT_MIN_CHUNK_PARAMS, max_chunks=None,
                 recompute_output=True, recompute_ops=CHEAP_OPS,
                 excluding=DEFAULT_EXCLUDING, graph=None, device_io=False):
        self.graph = g = graph if graph is not None else TrainGraph(net, loss_scale, bn_groups)
        self.recompute_output = recompute_output
        self.recompute_ops = frozenset(recompute_ops)
        self.excluding = tuple(excluding)
        params = list(params)
        layer_params = _layer_param_indices(g.layers, params)
        counts = [sum(int(params[i].get_value(borrow=True).size) for i in ps)
                  for ps in layer_params]
        self.ranges = plan_chunks(counts, min_chunk_params, max_chunks)
        self.n_chunks = len(self.ranges)
        index = _ForwardIndex(g)
        built, produced = [], set()
        for c, (first, stop) in enumerate(self.ranges):
            built.append(self._chunk_graph(c, first, stop, layer_params, params, index,
                                           produced))
        slot = self._compile_forward(built, device_io)
        layer_names = [name for name, _ in g.layers]
        self.chunks = []
        for (first, stop), b in zip(self.ranges, built):
            name = layer_names[first] if stop - first == 1 else \
                '%s..%s' % (layer_names[first], layer_names[stop - 1])
            inputs = ([b.g_out] if b.g_out is not None else []) + b.cuts
            # The forward alone moves the state (BN statistics, random generators).
            fn = function(inputs, b.grads, name='backward:' + name, excluding=self.excluding,
                          device_inputs=inputs if device_io else (),
                          device_outputs=b.grads if device_io else (),
                          no_default_updates=True)
            self.chunks.append(_Chunk(name, fn, b.param_indices, [slot[v] for v in b.cuts],
                                      b.g_out is not None, b.h_in is not None, b.n_ready))
        # A gradient with parts from several chunks: the first assigns, the rest add.
        written = set()
        for ch in self.chunks:
            ch.adds = [i in written for i in ch.param_indices]
            written.update(ch.param_indices)
        _set_releases(self.chunks, len(g.inputs))
        self.chunk_names = [ch.name for ch in self.chunks]
        self.chunk_params = dict((ch.label, list(ch.param_indices)) for ch in self.chunks)
        self.times = []

    def _chunk_graph(self, c, first, stop, layer_params, params, index, produced):
        """The symbolic gradient graph of chunk ``c`` (layers ``first:stop``);
        adds its parameters to ``produced``."""
        g, outs = self.graph, self.graph.layer_outputs
        idx = [i for l in range(first, stop) for i in layer_params[l]]
        h_in = outs[first - 1] if first > 0 else None
        start = h_in if h_in is not None else g.data_roots[0]
        region = index.between(start) if c == 0 else index.between(start, outs[stop - 1])
        # Parameters of chunks nearer the input that this chunk's ops also use
        # (a tied weight, a weight-decay term in the loss): their partial
        # gradient through this chunk is added to what their own chunk gives.
        foreign = [i for i in index.params_used(region, params) if i not in idx]
        late = [i for i in foreign if i in produced]
        if late:
            raise ValueError(
                'parameter(s) %s are used by chunk %s but belong to a chunk nearer the output, '
                'whose gradients are sent first: put each parameter in the first layer (from '
                'the input) that uses it' % ([params[i].name for i in late],
                                             g.layers[first][0]))
        wrt = [params[i] for i in idx + foreign] + ([h_in] if h_in is not None else [])
        # A foreign parameter's part from this chunk only: not back through h_in
        # (its own chunk gets that part through dL/dh_in).
        stop_at = [h_in] if foreign else None
        if c == 0:
            g_out = None
            grads = grad(g.cost, wrt, stop_at=stop_at)
        else:
            g_out = outs[stop - 1].type('dL/d' + g.layers[stop - 1][0])
            grads = grad(None, wrt, known_grads={outs[stop - 1]: g_out}, stop_at=stop_at)
        if c == 0:
            # The output chunk (a classifier layer and the loss) is cheap:
            # recomputing it lets Theano see the whole softmax/cross-
            # entropy and fuse its gradient exactly as the monolithic
            # function does (else float32 rounding differs slightly).
            recompute = index.recomputable(region, start,
                                           self.recompute_output and h_in is not None)
        else:
            recompute = index.recomputable(region, start, ops=self.recompute_ops)
        produced.update(idx)
        n_ready = 0
        while n_ready in produced:
            n_ready += 1
        return _ChunkGraph(idx + foreign, h_in, g_out, grads,
                           index.cut_points(grads, recompute), n_ready)

    def _compile_forward(self, built, device_io):
        """Compile the forward, which returns every cut point once (the inputs come
        from the caller); returns ``{variable: slot}`` of the values a chunk reads."""
        g = self.graph
        n_in = len(g.inputs)
        saved = []
        for b in built:
            for v in b.cuts:
                if v not in g.inputs and v not in saved:
                    saved.append(v)
        slot = dict((v, i) for i, v in enumerate(g.inputs))
        slot.update((v, n_in + i) for i, v in enumerate(saved))
        self.n_saved = len(saved)
        self.forward_fn = function(list(g.inputs), [g.loss_sum, g.err_sum] + saved,
                                   updates=g.stat_updates, name='forward',
                                   excluding=self.excluding,
                                   device_outputs=saved if device_io else ())
        return slot

    def run(self, x, y, grads_flat, layout, on_chunk=None):
        """Fill ``grads_flat`` chunk by chunk; ``on_chunk(c, n_ready)`` after each.

        Returns (loss_sum, err_sum) of this worker's batch.
        """
        clock = time.perf_counter
        t0 = clock()
        values = self.graph.feed(x, y)
        out = self.forward_fn(*values)
        loss_sum, err_sum = float(out[0]), float(out[1])
        values += out[2:]
        del out
        times = [('forward', t0, clock())]
        g_out = None
        for c, ch in enumerate(self.chunks):
            t0 = clock()
            args = [values[s] for s in ch.slots]
            res = ch.fn(*([g_out] + args if ch.has_g_out else args))
            for i, add, gval in zip(ch.param_indices, ch.adds, res):
                # Conv gradients may be non-contiguous; assignment copies them.
                if add:
                    layout.view(grads_flat, i)[...] += gval
                else:
                    layout.view(grads_flat, i)[...] = gval
            g_out = res[-1] if ch.has_h_in else None
            for s in ch.release:
                values[s] = None
            del args, res
            times.append((ch.label, t0, clock()))
            if on_chunk is not None:
                on_chunk(c, ch.n_ready)
        self.times = times
        return loss_sum, err_sum
