"""Forward + whole backward as one compiled function (the serial path)."""
from ..engine.core import T, function
from .graph import TrainGraph


class MonolithicBackward(object):
    """Computes the kn-normalised gradients of ``params`` into a flat vector.

    ``params`` is the list of shared variables in flat-layout order.
    ``device_io``: on a device, the gradients stay device arrays (``run``
    then fills a device ``grads_flat``).
    """

    def __init__(self, net, params, loss_scale, bn_groups=1, device_io=False):
        self.graph = g = TrainGraph(net, loss_scale, bn_groups)
        grads = T.grad(g.cost, params)
        self.fn = function([g.x, g.y], [g.loss_sum, g.err_sum] + grads,
                           updates=g.stat_updates, name='forward_backward',
                           device_outputs=grads if device_io else ())
        self.n_chunks = 1

    def run(self, x, y, grads_flat, layout, on_chunk=None):
        """Fill ``grads_flat``; call ``on_chunk(0, n_params)`` when done.

        Returns (loss_sum, err_sum) of this worker's batch.
        """
        out = self.fn(x, y)
        for i, gval in enumerate(out[2:]):
            # Conv gradients may be non-contiguous; assignment copies them.
            layout.view(grads_flat, i)[...] = gval
        if on_chunk is not None:
            on_chunk(0, len(layout))
        return float(out[0]), float(out[1])
