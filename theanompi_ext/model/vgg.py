"""VGG networks (Simonyan & Zisserman 2015, configuration D) from :mod:`.layers`.

A VGG is a list of stages of 3x3 convolutions (stride 1, pad 1) each
followed by a 2x2/2 max-pool, then fully connected layers. As in the
original, convolutions and hidden FC layers have biases and there is no
batch normalisation; ``bn=True`` gives the VGG-BN variant (conv -> BN ->
ReLU, conv bias dropped because BN's beta replaces it; the FC layers stay
without BN).

Not reproduced: the original's dropout (0.5) after fc6 and fc7 --
:mod:`.layers` has no dropout layer. It changes neither the architecture's
shapes nor its parameter count.

Initialisation: every convolution and hidden FC layer He-normal, the last
FC layer N(0, 0.01), biases 0 (the original used N(0, 0.01) everywhere
and pre-trained shallower nets; He init trains VGG-16 from scratch).

Chunking: every convolution (with its ReLU, and with the stage's max-pool
after the stage's last convolution) is one top-level layer, and so is
every FC layer, so the chunked backward pass can exchange each layer's
gradients while it computes the layers below.
"""
import numpy as np

from .layers import BatchNorm, Conv2D, Dense, Flatten, Pool, ReLU, Sequence
from .network import Network
from .resnet import check_shapes

#: Convolution widths of VGG-16 (configuration D), one tuple per stage.
VGG16_STAGES = ((64, 64), (128, 128), (256, 256, 256), (512, 512, 512), (512, 512, 512))


def vgg(input_shape, n_classes, stages=VGG16_STAGES, fc=(4096, 4096), seed=0,
        bn=False, name='vgg16'):
    """A VGG network (VGG-16 by default).

    Parameters
    ----------
    input_shape : tuple of int
        (channels, height, width) of one example, e.g. (3, 224, 224). Its
        size after the pools sets the input width of the first FC layer.
    n_classes : int
        Number of output logits.
    stages : sequence of sequence of int
        Output channels of the 3x3 convolutions, one inner sequence per
        stage; each stage ends with a 2x2/2 max-pool.
    fc : sequence of int
        Widths of the hidden fully connected layers (each + ReLU).
    seed : int
        Seed of the weight initialisation.
    bn : bool
        Insert BN between each convolution and its ReLU (and drop the conv
        bias). The FC layers never get BN.
    name : str
        Name of the network.

    Returns
    -------
    Network
        Top-level layers ``conv<stage>_<i>`` (the stage's last one ends with
        the max-pool), ``fc6``-style hidden FC layers (the first flattens
        its input), and the output layer; for VGG-16 those are
        ``conv1_1`` ... ``conv5_3``, ``fc6``, ``fc7``, ``fc8``.
    """
    rng = np.random.RandomState(seed)
    layers = []
    cin = input_shape[0]
    for s, widths in enumerate(stages, start=1):
        for i, cout in enumerate(widths, start=1):
            lname = 'conv%d_%d' % (s, i)
            unit = [Conv2D(lname + '.conv', rng, cin, cout, 3, 1, pad=1, bias=not bn)]
            if bn:
                unit.append(BatchNorm(lname + '.bn', cout))
            unit.append(ReLU(lname + '.relu'))
            if i == len(widths):
                unit.append(Pool(lname + '.pool', size=2, stride=2, mode='max'))
            layers.append(Sequence(lname, unit))
            cin = cout
    # The first FC layer's fan-in is whatever the conv stack leaves of the
    # input (7x7x512 for VGG-16 on 224x224), computed, not assumed.
    feat_shape = check_shapes(layers, input_shape)
    n_in = int(np.prod(feat_shape))
    k = len(stages) + 1   # VGG numbers the FC layers after the conv stages
    for j, width in enumerate(fc):
        lname = 'fc%d' % (k + j)
        unit = [Flatten(lname + '.flat')] if j == 0 else []
        unit += [Dense(lname + '.dense', rng, n_in, width), ReLU(lname + '.relu')]
        layers.append(Sequence(lname, unit))
        n_in = width
    out_name = 'fc%d' % (k + len(fc))
    head = Dense(out_name + '.dense', rng, n_in, n_classes, last=True)
    layers.append(Sequence(out_name, [Flatten(out_name + '.flat'), head]) if not fc else head)
    return Network(name, layers, input_shape, n_classes)


def vgg16(input_shape, n_classes, seed=0, bn=False):
    """VGG-16: 13 conv3x3 layers in 5 stages, FC 4096-4096-``n_classes``.

    138,357,544 parameters for (3, 224, 224) and 1000 classes (138,361,768
    with ``bn=True``: 4,224 conv biases out, 8,448 BN gammas/betas in).
    See :func:`vgg` for the parameters.
    """
    return vgg(input_shape, n_classes, VGG16_STAGES, (4096, 4096), seed, bn,
               'vgg16_bn' if bn else 'vgg16')


def vgg_small(input_shape, n_classes, seed=0, bn=False, width=32, fc=(256, 256)):
    """A CPU-scale VGG: 3 stages of two 3x3 convs (``width``, 2x, 4x), FC layers.

    Same code and layer types as :func:`vgg16`, sized for small inputs:
    three 2x2 pools take 8x8 digits to 1x1 and 32x32 images to 4x4. With the
    defaults: 387,818 parameters for (1, 8, 8) / 10 classes and 879,914
    for (3, 32, 32) / 10 classes.

    Parameters
    ----------
    input_shape : tuple of int
        (channels, height, width), at least 8x8.
    n_classes : int
        Number of output logits.
    seed : int
        Seed of the weight initialisation.
    bn : bool
        VGG-BN variant (see :func:`vgg`).
    width : int
        Channels of the first stage.
    fc : sequence of int
        Hidden FC widths.

    Returns
    -------
    Network
    """
    stages = ((width,) * 2, (2 * width,) * 2, (4 * width,) * 2)
    return vgg(input_shape, n_classes, stages, tuple(fc), seed, bn,
               'vgg_small_bn' if bn else 'vgg_small')
