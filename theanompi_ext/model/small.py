"""Small models for this machine and for tests (built from the same layers)."""
import numpy as np

from .layers import Dense, ReLU, Flatten, GlobalAvgPool, BatchNorm, conv_bn_relu
from .network import Network


def mlp(input_shape=(1, 8, 8), n_classes=10, hidden=(32,), bn=False, seed=0):
    """Flatten -> [Dense -> (BN) -> ReLU]* -> Dense (last layer N(0, 0.01))."""
    rng = np.random.RandomState(seed)
    n_in = int(np.prod(input_shape))
    layers = [Flatten('flat')]
    for i, h in enumerate(hidden):
        block = [Dense('fc%d' % i, rng, n_in, h)]
        if bn:
            block.append(BatchNorm('fc%d.bn' % i, h))
        block.append(ReLU('fc%d.relu' % i))
        from .layers import Sequence
        layers.append(Sequence('hidden%d' % i, block))
        n_in = h
    layers.append(Dense('out', rng, n_in, n_classes, last=True))
    return Network('mlp', layers, input_shape, n_classes)


def digits_cnn(input_shape=(1, 8, 8), n_classes=10, width=16, seed=0):
    """A 3-conv BN net for the 8x8 digits: the demo's and the tests' model."""
    from .layers import Sequence
    rng = np.random.RandomState(seed)
    c = input_shape[0]
    layers = [
        Sequence('stage1', conv_bn_relu('c1', rng, c, width)),
        Sequence('stage2', conv_bn_relu('c2', rng, width, 2 * width, stride=2)),
        Sequence('stage3', conv_bn_relu('c3', rng, 2 * width, 2 * width)),
        GlobalAvgPool('gap'),
        Dense('fc', rng, 2 * width, n_classes, last=True),
    ]
    return Network('digits_cnn', layers, input_shape, n_classes)
