"""Chunk boundaries found in a Theano graph (backward/cuts.py, theanompi_compat/chunks.py).

Every boundary found is checked with an independent brute-force test: cut
the graph at that variable and the loss must be unreachable from the batch.
The chunked backward on the found boundaries must give the monolithic
gradients, and state the forward draws (a random mask) must not be drawn
again by a chunk.
"""
import numpy as np
import pytest

from theanompi_ext.engine.core import T, theano, toposort
from theanompi_ext.backward.cuts import find_cuts
from theanompi_ext.theanompi_compat.chunks import find_chunks


def shared(name, *shape, seed=0):
    rng = np.random.RandomState(seed + len(name))
    return theano.shared((rng.randn(*shape) * 0.3).astype(np.float32), name=name)


def reachable_without(cost, source, removed):
    """True when some path from ``source`` to ``cost`` avoids ``removed`` (brute force)."""
    seen = {source}
    for node in toposort([cost]):
        if any(v in seen and v is not removed for v in node.inputs):
            seen.update(o for o in node.outputs if o is not removed)
    return cost in seen


def uses(p, var):
    """True when ``var`` is computed from parameter ``p``."""
    return any(p in node.inputs for node in toposort([var]))


class Net(object):
    """x -> relu(x W1 + b1) = h1 -> [h2 = relu(h1 W2 + b2); h3 = relu(h1 + h2 W3 + b3)]
    -> softmax(h3 W4 + b4): a layer, a residual block, a classifier."""

    def __init__(self, cost_extra=None):
        self.x, self.y = T.matrix('x'), T.ivector('y')
        self.W1, self.b1 = shared('W1', 5, 4), shared('b1', 4)
        self.W2, self.b2 = shared('W2', 4, 4), shared('b2', 4)
        self.W3, self.b3 = shared('W3', 4, 4), shared('b3', 4)
        self.W4, self.b4 = shared('W4', 4, 3), shared('b4', 3)
        self.params = [self.W1, self.b1, self.W2, self.b2, self.W3, self.b3, self.W4, self.b4]
        self.h1 = T.nnet.relu(T.dot(self.x, self.W1) + self.b1)
        h2 = T.nnet.relu(T.dot(self.h1, self.W2) + self.b2)
        self.h3 = T.nnet.relu(self.h1 + T.dot(h2, self.W3) + self.b3)
        p = T.nnet.softmax(T.dot(self.h3, self.W4) + self.b4)
        self.cost = T.nnet.categorical_crossentropy(p, self.y).mean()
        if cost_extra is not None:
            self.cost = self.cost + cost_extra(self)
        self.error = T.mean(T.neq(T.argmax(p, axis=1), self.y))


def test_layer_block_classifier_found_and_every_boundary_dominates():
    net = Net()
    groups = find_cuts(net.cost, net.x, net.params)
    names = [[p.name for p in g.params] for g in groups]
    # The residual block stays one chunk: nothing inside it is on every path.
    assert names == [['W1', 'b1'], ['W2', 'b2', 'W3', 'b3'], ['W4', 'b4']]
    assert groups[-1].output is None
    for g in groups[:-1]:
        assert not reachable_without(net.cost, net.x, g.output), g.output
    # The boundaries are the layer and block outputs (the next group's input).
    assert uses(net.b1, groups[0].output) and not uses(net.W2, groups[0].output)
    assert uses(net.b3, groups[1].output) and not uses(net.W4, groups[1].output)


def test_preferred_boundary_is_taken():
    net = Net()
    groups = find_cuts(net.cost, net.x, net.params, preferred=[net.h1, net.h3])
    assert groups[0].output is net.h1 and groups[1].output is net.h3


def test_inside_a_skip_connection_is_never_a_cut():
    # The brute-force check on every candidate: none of the block's inner
    # variables dominates the loss, and the finder never returns one.
    net = Net()
    outputs = [g.output for g in find_cuts(net.cost, net.x, net.params, units=[
        [p] for p in net.params])]
    # The block's branch before it joins the skip connection.
    inner = [v for node in toposort([net.h3]) for v in node.outputs
             if uses(net.W2, v) and not uses(net.W3, v)]
    assert inner and all(reachable_without(net.cost, net.x, v) for v in inner)
    assert not any(o in inner for o in outputs if o is not None)
    # One parameter per unit: still W2, b2 and W3 (used inside the block) go together.
    flat = [set(p.name for p in g.params) for g in find_cuts(
        net.cost, net.x, net.params, units=[[p] for p in net.params])]
    assert any({'W2', 'b2', 'W3'} <= f for f in flat)


WD = 1e-3


def weight_decay(n):
    return WD * sum((p ** 2).sum() for p in n.params)


def test_weight_decay_over_every_parameter_keeps_the_cuts():
    # The decay term uses every parameter at the loss: each parameter stays in
    # the chunk of its first use; the output chunk sends the rest of its gradient.
    net = Net(cost_extra=weight_decay)
    names = [[p.name for p in g.params] for g in find_cuts(net.cost, net.x, net.params)]
    assert names == [['W1', 'b1'], ['W2', 'b2', 'W3', 'b3'], ['W4', 'b4']]


def tied_net():
    x, y = T.matrix('x'), T.ivector('y')
    W1, b1, W2, b2 = shared('W1', 5, 4), shared('b1', 4), shared('W2', 5, 3), shared('b2', 3)
    h1 = T.tanh(T.dot(x, W1) + b1)
    h2 = T.tanh(T.dot(h1, W1.T))                  # W1 again, transposed
    cost = T.nnet.categorical_crossentropy(T.nnet.softmax(T.dot(h2, W2) + b2), y).mean()
    return x, y, [W1, b1, W2, b2], cost


def test_tied_weights_stay_with_their_first_use():
    x, y, params, cost = tied_net()
    groups = find_cuts(cost, x, params)
    assert [[p.name for p in g.params] for g in groups] == [['W1', 'b1'], ['W2', 'b2']]
    assert not reachable_without(cost, x, groups[0].output)
    # The boundary is the input of W2's layer, after the second use of W1.
    assert uses(params[0], groups[0].output) and not uses(params[2], groups[0].output)


def test_a_loss_that_ignores_the_batch_is_refused():
    x = T.matrix('x')
    W = shared('W', 3, 3)
    with pytest.raises(ValueError, match='does not depend on the batch'):
        find_cuts((W ** 2).sum(), x, [W])


# -- a Theano-MPI model's chunks (chunks.find_chunks) ------------------------------------


class _Layer(object):
    def __init__(self, name, output, params=None, input_layer=None):
        self.name, self.output = name, output
        if params is not None:
            self.params = params
        if input_layer is not None:
            self.input_layer = input_layer


class NativeModel(object):
    """Theano-MPI's native style: ``model.layers`` (some without params)."""

    def __init__(self, cost_extra=None):
        net = Net(cost_extra)
        self.net, self.x, self.y, self.cost, self.error = net, net.x, net.y, net.cost, net.error
        self.params = net.params
        inp = _Layer('Input\t', net.x)
        l1 = _Layer('FC\t', net.h1, [net.W1, net.b1], inp)
        blk = _Layer('Block\t', net.h3, [net.W2, net.b2, net.W3, net.b3], l1)
        self.layers = [inp, l1, blk, _Layer('Softmax\t', net.cost, [net.W4, net.b4], blk)]


def test_native_layers_name_the_chunks_and_give_the_boundaries():
    m = NativeModel()
    found = find_chunks(m)
    assert found.source.startswith('the Theano graph from model.x')
    assert [e[0] for e in found.entries] == ['FC1', 'Block2', 'Softmax3']
    assert found.entries[0][1] is m.net.h1 and found.entries[1][1] is m.net.h3
    assert found.entries[-1][1] is m.cost
    assert '3 chunks found' in found.why and 'FC1 | Block2 | Softmax3' in found.why


class LasagneShaped(object):
    """Lasagne's shape: ``output_layer`` with ``input_layer(s)`` and ``params``
    dicts; the layers' outputs are not kept (get_output builds them)."""

    def __init__(self):
        net = Net()
        self.net, self.x, self.y, self.cost = net, net.x, net.y, net.cost
        self.params = net.params

        class L(object):
            def __init__(self, name, params, parents):
                self.name = name
                self.params = dict((p, {'trainable'}) for p in params)
                if len(parents) == 1:
                    self.input_layer = parents[0]
                else:
                    self.input_layers = parents
        inp = L(None, [], [None])
        d1 = L('dense1', [net.W1, net.b1], [inp])
        d2 = L(None, [net.W2, net.b2], [d1])
        d3 = L(None, [net.W3, net.b3], [d2])
        s = L(None, [], [d1, d3])
        self.output_layer = L('out', [net.W4, net.b4], [s])


def test_lasagne_layer_graph_names_the_chunks():
    found = find_chunks(LasagneShaped())
    assert 'model.output_layer (Lasagne layers)' in found.source
    assert [e[0] for e in found.entries] == ['dense11', 'L2..L3', 'out5']


class OneBlock(object):
    """The input also reaches the classifier directly: no variable is on every path."""

    def __init__(self):
        self.x, self.y = T.matrix('x'), T.ivector('y')
        W1, W2, W3 = shared('W1', 5, 4), shared('W2', 4, 3), shared('W3', 5, 3)
        h = T.nnet.relu(T.dot(self.x, W1))
        p = T.nnet.softmax(T.dot(h, W2) + T.dot(self.x, W3))
        self.cost = T.nnet.categorical_crossentropy(p, self.y).mean()
        self.params = [W1, W2, W3]


def test_tmx_layers_override_and_no_cut_reason():
    m = NativeModel()
    m.tmx_layers = [(m.net.h3, m.params[:6]), (m.cost, m.params[6:])]
    found = find_chunks(m)
    assert found.source == 'model.tmx_layers' and len(found.entries) == 2
    one_block = find_chunks(OneBlock())
    assert one_block.entries is None and 'no cut in the Theano graph from model.x' in \
        one_block.why and 'one block' in one_block.why


class _Graph(object):
    """What ChunkedBackward reads of a graph, for a plain (x, y) model."""

    def __init__(self, x, y, cost, entries):
        self.layers = [(n, ps) for n, _, ps in entries]
        self.layer_outputs = [o for _, o, _ in entries]
        self.inputs = self.data_roots = [x, y]
        self.loss_sum = self.err_sum = self.cost = cost
        self.stat_updates = []

    def feed(self, x, y):
        return [x, y]


def chunked_vs_grad(x, y, cost, params, entries, n_chunks):
    from theanompi_ext.backward.chunked import ChunkedBackward
    from theanompi_ext.params.layout import ParamLayout
    rng = np.random.RandomState(3)
    xv = rng.randn(6, 5).astype(np.float32)
    yv = rng.randint(0, 3, 6).astype(np.int32)
    order = list(reversed(params))
    reports = []
    bw = ChunkedBackward(None, order, 1.0, graph=_Graph(x, y, cost, entries))
    assert bw.n_chunks == n_chunks
    layout = ParamLayout([(str(i), p.get_value().shape, 'float32') for i, p in enumerate(order)])
    grads = np.full(layout.total, np.nan, np.float32)
    bw.run(xv, yv, grads, layout, on_chunk=lambda c, n: reports.append(n))
    assert reports[-1] == len(order) and reports == sorted(reports)
    want = theano.function([x, y], T.grad(cost, order))(xv, yv)
    for i, w in enumerate(want):
        np.testing.assert_allclose(layout.view(grads, i), w, rtol=2e-6, atol=1e-7)


def test_chunked_gradients_on_found_boundaries_equal_the_monolithic_ones():
    m = NativeModel()
    chunked_vs_grad(m.x, m.y, m.cost, m.params, find_chunks(m).entries, 3)


def test_chunked_gradients_with_weight_decay_in_the_loss():
    # Every parameter's decay part comes from the output chunk, added to its own.
    m = NativeModel(cost_extra=weight_decay)
    chunked_vs_grad(m.x, m.y, m.cost, m.params, find_chunks(m).entries, 3)


def test_chunked_gradients_with_tied_weights():
    x, y, params, cost = tied_net()
    entries = [('l%d' % i, g.output if g.output is not None else cost, g.params)
               for i, g in enumerate(find_cuts(cost, x, params))]
    chunked_vs_grad(x, y, cost, params, entries, 2)


def test_a_parameter_listed_after_its_first_use_is_refused():
    # tmx_layers that put the tied W1 in the later layer: its gradient would be
    # sent before the earlier layer adds its part.
    from theanompi_ext.backward.chunked import ChunkedBackward
    x, y, (W1, b1, W2, b2), cost = tied_net()
    out = find_cuts(cost, x, [W1, b1, W2, b2])[0].output
    entries = [('first', out, [b1]), ('second', cost, [W1, W2, b2])]
    with pytest.raises(ValueError, match="W1.*first layer .from the input. that uses it"):
        ChunkedBackward(None, [b2, W2, b1, W1], 1.0, graph=_Graph(x, y, cost, entries))
