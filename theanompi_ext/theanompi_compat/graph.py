"""A Theano-MPI model's own graph as this project's backward reads it.

:class:`GradientFunction` (one compiled function: cost, error, gradients)
and :class:`ContractGraph` (the layers, for the chunked backward).
"""
import numpy as np



class GradientFunction(object):
    """``fn(subb) -> (cost, error, [grad values])`` on sub-batch ``subb`` of the loaded batch.

    ``device_scale`` (on a device): the gradients come scaled by it and stay
    device arrays.

    Compiled from the model's own graph with the model's own feed
    (:class:`~theanompi_ext.theanompi_compat.feed.ModelFeed`: ``subb_ind`` as input,
    ``shared_x_slice``/``shared_y_slice``/``shared_lr`` given for
    ``x``/``y``/``lr``), so inputs transformed inside the graph are seen
    as the model's train function sees them.
    """

    def __init__(self, model, params_order, feed, device_scale=None):
        from ..engine.core import theano
        err = getattr(model, 'error', None)
        self.has_error = err is not None
        outs = [model.cost] + ([err] if self.has_error else [])
        grads = [model.grads[i] for i in params_order]
        self.feed = feed
        self.n_out = len(outs)
        if device_scale is not None:
            self.fn = self._device_fn(outs, grads, device_scale)
            return
        self.fn = theano.function(list(feed.inputs), outs + grads, givens=feed.givens or None,
                                  on_unused_input='ignore', name='tmx_contract_grads')

    def _device_fn(self, outs, grads, scale):
        """On a device: the gradients times ``scale`` (1/k), returned as device
        arrays (the stepper copies them into the flat device gradient)."""
        from ..engine.core import function
        scaled = [g * np.float32(scale) for g in grads]
        fed, updates = self.feed.clone_with_state(outs + scaled)
        return function(list(self.feed.inputs), fed, updates=updates, name='tmx_contract_grads',
                        device_outputs=fed[self.n_out:])

    def __call__(self, subb=0):
        res = self.fn(*self.feed.values(subb))
        cost = float(res[0])
        error = float(res[1]) if self.has_error else float('nan')
        return cost, error, res[self.n_out:]


class ContractBackward(object):
    """A :class:`GradientFunction` with the backward interface the step runs
    (:class:`~theanompi_ext.step.run.Step`): ``run(subb, None, grads, layout)``
    fills the flat gradient with the model's gradients times ``1/k`` (the
    loss over kn) and returns (cost, error) of this worker; error 0 when the
    model has none (:attr:`has_error`).
    """

    def __init__(self, gradfn, k, on_device):
        self.gradfn, self.on_device = gradfn, bool(on_device)
        self.inv_k = np.float32(1.0 / k)
        self.has_error = gradfn.has_error

    def run(self, subb, y, grads, layout, on_chunk=None):
        """Gradients of sub-batch ``subb`` into ``grads`` (``y`` is unused: the
        batch is in the model's shared variables)."""
        cost, error, gvals = self.gradfn(subb)
        for i, g in enumerate(gvals):
            if self.on_device:       # already times 1/k; a copy on the device
                layout.view(grads, i)[...] = g
                continue
            np.multiply(np.asarray(g, np.float32).reshape(-1), self.inv_k,
                        out=grads[layout.slice(i)])
        if on_chunk is not None:
            on_chunk(0, len(layout))
        return cost, (error if self.has_error else 0.0)


class ContractGraph(object):
    """A contract model's own symbolic graph, as the chunked backward reads it.

    Gives :class:`~theanompi_ext.backward.chunked.ChunkedBackward` what
    :class:`~theanompi_ext.backward.graph.TrainGraph` gives it for our own
    networks: ``cost`` (the model's cost times a shared ``scale`` = 1/k,
    i.e. the loss over kn), ``loss_sum``/``err_sum`` (here the model's own
    per-worker means), the chunk boundaries (``entries``: (name, output,
    params) in forward order, from :func:`~.chunks.find_chunks`: the
    model's ``tmx_layers`` or the cuts found in its graph), and the data inputs. The graph is the model's own,
    rewritten with the model's feed (:class:`~theanompi_ext.theanompi_compat.feed.ModelFeed`)
    to read the shared file batch; its one input, if any, is the sub-batch
    index ``model.subb_ind``. BN running statistics that are default
    updates (Lasagne's) move in the forward function only.
    """

    def __init__(self, model, loss_scale, feed=None, entries=None):
        from ..engine.core import T, shared, toposort
        from .feed import ModelFeed
        if entries is None:
            from .chunks import find_chunks
            entries = find_chunks(model).entries
        if entries is None:
            raise ValueError('no backward chunks in the model (see chunks.find_chunks)')
        self.layers = [(name, params) for name, _, params in entries]
        self.data_roots = [v for v in (getattr(model, 'shared_x', None),
                                       getattr(model, 'shared_y', None)) if hasattr(v, 'get_value')]
        if not self.data_roots:
            raise ValueError('the model has neither model.x/model.y nor model.shared_x/'
                             'shared_y: cannot tell where the batch enters its graph')
        err = getattr(model, 'error', None)
        self.has_error = err is not None
        # The outputs must be on the cost's graph, each computed from the one before.
        ancestors = set(v for node in toposort([model.cost]) for v in node.outputs)
        for i, (name, output, _) in enumerate(entries):
            if output not in ancestors:
                raise ValueError('chunk %d (%s): its output is not part of '
                                 'model.cost\'s graph' % (i, name))
            if i and not any(entries[i - 1][1] in node.inputs
                             for node in toposort([output])):
                raise ValueError('the chunks must be in forward order: the output of '
                                 'chunk %d (%s) is not computed from that of chunk %d (%s)'
                                 % (i, name, i - 1, entries[i - 1][0]))
        self.model_feed = feed if feed is not None else ModelFeed(model)
        # The model's graph as its own train function runs it: read from the
        # shared file batch through the model's givens (slice, dimshuffle, ...).
        outs, self.stat_updates = self.model_feed.clone_with_state(
            [model.cost] + ([err] if err is not None else []) +
            [output for _, output, _ in entries])
        cost = outs[0]
        self.layer_outputs = outs[1 + self.has_error:]
        self.inputs = list(self.model_feed.inputs)
        self.data_roots += self.inputs
        self.loss_sum = cost
        # No error output: 0 in the loss statistics (the stepper reports NaN).
        self.err_sum = outs[1] if self.has_error else T.constant(np.float32(0))
        self.scale = shared(np.float32(loss_scale), name='loss_scale')
        self.cost = cost * self.scale

    def feed(self, x=None, y=None):
        """Values of :attr:`inputs`: ``x`` is the sub-batch index (the batch
        itself is already in the model's shared variables)."""
        return self.model_feed.values(x or 0)
