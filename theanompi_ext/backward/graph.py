"""Symbolic pieces shared by the monolithic and chunked backward passes."""
import numpy as np

from ..engine.core import T, shared, function
from ..model.layers import ForwardContext
from ..model.network import softmax_xent, errors, topk_errors


class TrainGraph(object):
    """The symbolic training forward of ``net``.

    ``loss_sum``/``err_sum`` are per-worker sums (for reporting);
    ``cost = loss_sum * scale`` with ``scale`` a shared scalar set to
    1/(kn), so that summing gradients over ranks gives the kn-mean.
    """

    def __init__(self, net, loss_scale, bn_groups=1):
        self.net = net
        self.x = net.input_var()
        self.y = T.ivector('y')
        self.ctx = ForwardContext(train=True, bn_groups=bn_groups)
        self.logits, self.layer_outputs = net.forward(self.x, self.ctx)
        self.loss_sum = softmax_xent(self.logits, self.y).sum()
        self.err_sum = errors(self.logits, self.y).sum()
        self.scale = shared(np.float32(loss_scale), name='loss_scale')
        self.cost = self.loss_sum * self.scale
        self.stat_updates = self.ctx.updates
        # What the chunked backward needs of any graph (see ContractGraph):
        # the top-level layers as (name, params), the compiled functions'
        # data inputs, and the variables the batch enters through.
        self.layers = [(layer.name, list(layer.params)) for layer in net.layers]
        self.inputs = [self.x, self.y]
        self.data_roots = [self.x, self.y]

    def feed(self, x, y):
        """Values of :attr:`inputs` for a step on batch ``(x, y)``."""
        return [x, y]


class Evaluator(object):
    """Compiled evaluation (BN running statistics): sums of loss, top-1, top-5 errors."""

    def __init__(self, net):
        x, y = net.input_var(), T.ivector('y')
        logits, _ = net.forward(x, ForwardContext(train=False))
        k = min(5, net.n_classes)
        self.fn = function([x, y], [softmax_xent(logits, y).sum(),
                                    errors(logits, y).sum(),
                                    topk_errors(logits, y, k).sum()], name='evaluate')

    def __call__(self, x, y):
        """(loss_sum, top1_err_sum, top5_err_sum) over the batch."""
        return tuple(float(v) for v in self.fn(x, y))
