"""Residual networks (He et al. 2016) built from :mod:`.layers`.

Two families share the block code here:

* :func:`bottleneck_resnet` -- the ImageNet ResNets (ResNet-50 with
  ``stages=(3, 4, 6, 3)``): a 7x7/2 stem, bottleneck blocks, global
  average pooling and one fully connected layer.
* :func:`cifar_resnet` -- the CIFAR ResNets of He et al. Sec. 4.2
  (ResNet-20 with ``depth=20``): a 3x3 stem, three stages of basic
  blocks, global average pooling and one fully connected layer.

Where published implementations differ, the choices made here:

* **Stride placement.** In a down-sampling bottleneck block the stride 2
  sits on the 3x3 convolution (``stride_on='3x3'``, the default), as in
  the Facebook Torch / Caffe2 ResNet-50 that Goyal et al. 2017 trained
  (often called "ResNet v1.5"). He et al.'s original puts it on the first
  1x1 convolution (``stride_on='1x1'``, "v1"), which throws away 3/4 of the
  positions before any 3x3 filter sees them. The parameter count is the
  same either way.
* **Shortcuts.** Identity when input and output shapes agree; otherwise a
  projection, 1x1 convolution (with the block's stride) followed by BN
  ("option B"), for both families. The CIFAR paper's ResNet-20 uses
  parameter-free zero-padding shortcuts ("option A"); ours therefore has
  2,752 more parameters (272,474 instead of 269,722 for 10 classes).
* **Zero-gamma.** The last BN of every residual branch starts with
  gamma = 0, so each block starts as the identity (Goyal et al. Sec. 5.1);
  the shortcut's BN keeps gamma = 1.
* Convolutions have no bias (the BN after each one has a beta); every
  convolution is He-initialised, the final fully connected layer is
  N(0, 0.01) (see :mod:`.layers`).

Every residual block is one top-level layer of the returned
:class:`~.network.Network` (one unit of the chunked backward pass); the
stem is one unit, and global pooling and the classifier are one each.
"""
import numpy as np

from .layers import Dense, GlobalAvgPool, Pool, Residual, Sequence, conv_bn_relu
from .network import Network


def check_shapes(layers, input_shape):
    """Propagate ``input_shape`` through ``layers``; fail early on collapse.

    Returns the output shape (without batch). Raises ``ValueError`` naming
    the first layer whose output has a non-positive size, which is what a
    too-small input does to a strided network; Theano would otherwise fail
    much later with an obscure shape error.
    """
    shape = tuple(input_shape)
    for layer in layers:
        shape = layer.output_shape(shape)
        if any(int(d) <= 0 for d in shape):
            raise ValueError('input shape %s is too small: layer %r would output %s'
                             % (tuple(input_shape), layer.name, shape))
    return shape


def projection_shortcut(name, rng, cin, cout, stride):
    """The option-B shortcut: 1x1 convolution (stride ``stride``) then BN.

    Returns ``None`` (identity shortcut) when the block keeps the shape,
    i.e. ``stride == 1`` and ``cin == cout``.
    """
    if stride == 1 and cin == cout:
        return None
    # gamma 1 here: only the residual branch starts switched off.
    return Sequence(name, conv_bn_relu(name, rng, cin, cout, ksize=1, stride=stride,
                                       relu=False))


def basic_block(name, rng, cin, cout, stride=1):
    """Two 3x3 conv-BN layers plus a shortcut: the CIFAR ResNet block.

    Parameters
    ----------
    name : str
        Prefix of every parameter name in the block.
    rng : numpy.random.RandomState
        Source of the He-normal initial weights.
    cin, cout : int
        Input and output channels.
    stride : int
        Stride of the first 3x3 convolution (2 at the start of a stage).

    Returns
    -------
    Residual
        ``relu(bn(conv(relu(bn(conv(x))))) + shortcut(x))`` with the second
        BN's gamma initialised to 0.
    """
    branch = (conv_bn_relu(name + '.a', rng, cin, cout, 3, stride)
              + conv_bn_relu(name + '.b', rng, cout, cout, 3, 1, relu=False,
                             gamma_init=0.0))
    return Residual(name, Sequence(name + '.branch', branch),
                    projection_shortcut(name + '.proj', rng, cin, cout, stride))


def bottleneck_block(name, rng, cin, width, stride=1, expansion=4, stride_on='3x3'):
    """1x1 reduce, 3x3, 1x1 expand (each with BN) plus a shortcut.

    Parameters
    ----------
    name : str
        Prefix of every parameter name in the block.
    rng : numpy.random.RandomState
        Source of the He-normal initial weights.
    cin : int
        Input channels.
    width : int
        Channels of the 1x1-reduce and 3x3 convolutions; the block outputs
        ``expansion * width`` channels.
    stride : int
        Down-sampling stride of the block.
    expansion : int
        Output / inner channel ratio (4 in ResNet-50).
    stride_on : {'3x3', '1x1'}
        Which convolution carries ``stride``: '3x3' is ResNet v1.5 (the
        Facebook/Caffe2 implementation of Goyal et al.), '1x1' is He et
        al.'s original v1.

    Returns
    -------
    Residual
        The block; the expanding 1x1's BN starts with gamma = 0.
    """
    if stride_on not in ('3x3', '1x1'):
        raise ValueError("stride_on must be '3x3' or '1x1', not %r" % (stride_on,))
    s1, s3 = (1, stride) if stride_on == '3x3' else (stride, 1)
    cout = expansion * width
    branch = (conv_bn_relu(name + '.a', rng, cin, width, 1, s1)
              + conv_bn_relu(name + '.b', rng, width, width, 3, s3)
              + conv_bn_relu(name + '.c', rng, width, cout, 1, 1, relu=False,
                             gamma_init=0.0))
    return Residual(name, Sequence(name + '.branch', branch),
                    projection_shortcut(name + '.proj', rng, cin, cout, stride))


def bottleneck_resnet(input_shape, n_classes, stages=(3, 4, 6, 3),
                      widths=(64, 128, 256, 512), seed=0, stride_on='3x3',
                      expansion=4, name='resnet50'):
    """An ImageNet-style bottleneck ResNet (ResNet-50 by default).

    Layout: 7x7/2 conv (64 channels, pad 3) + BN + ReLU + 3x3/2 max-pool
    (pad 1) as the stem; ``len(stages)`` stages of bottleneck blocks, the
    first stage at stride 1 and the others starting with a stride-2 block;
    global average pooling; ``Dense(expansion * widths[-1], n_classes)``.
    For a 224x224 input the feature maps are 56, 28, 14 and 7 pixels wide.

    Parameters
    ----------
    input_shape : tuple of int
        (channels, height, width) of one example, e.g. (3, 224, 224).
    n_classes : int
        Number of output logits.
    stages : sequence of int
        Blocks per stage; (3, 4, 6, 3) is ResNet-50, (3, 4, 23, 3) ResNet-101.
    widths : sequence of int
        Inner (bottleneck) channels of each stage.
    seed : int
        Seed of the weight initialisation.
    stride_on : {'3x3', '1x1'}
        See :func:`bottleneck_block`.
    expansion : int
        Output / inner channel ratio of the blocks.
    name : str
        Name of the network.

    Returns
    -------
    Network
        Top-level layers: ``stem``, one per residual block, ``gap``, ``fc``.
    """
    if len(stages) != len(widths):
        raise ValueError('stages and widths must have the same length')
    rng = np.random.RandomState(seed)
    stem_width = 64
    stem = conv_bn_relu('stem', rng, input_shape[0], stem_width, ksize=7, stride=2)
    # Zero padding in the max-pool is harmless: it follows a ReLU (x >= 0).
    stem.append(Pool('stem.pool', size=3, stride=2, pad=1, mode='max'))
    layers = [Sequence('stem', stem)]
    cin = stem_width
    for i, (n_blocks, width) in enumerate(zip(stages, widths)):
        for j in range(n_blocks):
            stride = 2 if (i > 0 and j == 0) else 1
            layers.append(bottleneck_block('stage%d.block%d' % (i + 1, j), rng, cin, width,
                                           stride, expansion, stride_on))
            cin = expansion * width
    layers.append(GlobalAvgPool('gap'))
    layers.append(Dense('fc', rng, cin, n_classes, last=True))
    check_shapes(layers, input_shape)
    return Network(name, layers, input_shape, n_classes)


def cifar_resnet(input_shape, n_classes, depth=20, width=16, seed=0, name=None):
    """A CIFAR-style ResNet of basic blocks (ResNet-20 by default).

    Layout (He et al. 2016, Sec. 4.2): 3x3 conv (``width`` channels) + BN +
    ReLU; three stages of ``n = (depth - 2) / 6`` basic blocks with
    ``width``, ``2 width`` and ``4 width`` channels, stages 2 and 3 starting
    at stride 2; global average pooling; ``Dense(4 width, n_classes)``.
    ``width=16`` is the paper's network; a larger ``width`` gives a wide
    variant with the same depth.

    Meant for small inputs such as (1, 8, 8) digits or (3, 32, 32) CIFAR
    images (feature maps 8/4/2 and 32/16/8 pixels wide).

    Parameters
    ----------
    input_shape : tuple of int
        (channels, height, width) of one example.
    n_classes : int
        Number of output logits.
    depth : int
        Number of weighted layers, ``6 n + 2`` (20, 32, 44, 56, 110, ...).
    width : int
        Channels of the first stage.
    seed : int
        Seed of the weight initialisation.
    name : str, optional
        Name of the network (default ``'resnet<depth>'``).

    Returns
    -------
    Network
        Top-level layers: ``stem``, one per residual block, ``gap``, ``fc``.
    """
    if depth < 8 or (depth - 2) % 6:
        raise ValueError('depth must be 6n + 2 with n >= 1, not %r' % (depth,))
    n = (depth - 2) // 6
    rng = np.random.RandomState(seed)
    layers = [Sequence('stem', conv_bn_relu('stem', rng, input_shape[0], width, 3, 1))]
    cin = width
    for i in range(3):
        cout = width * 2 ** i
        for j in range(n):
            stride = 2 if (i > 0 and j == 0) else 1
            layers.append(basic_block('stage%d.block%d' % (i + 1, j), rng, cin, cout, stride))
            cin = cout
    layers.append(GlobalAvgPool('gap'))
    layers.append(Dense('fc', rng, cin, n_classes, last=True))
    check_shapes(layers, input_shape)
    return Network(name or 'resnet%d' % depth, layers, input_shape, n_classes)

