"""The model zoo: ImageNet ResNet-50 and VGG-16, and CPU-scale relatives.

Importing this module registers the builders in
:data:`theanompi_ext.model.MODELS` (``build_model`` imports it). Each
builder is ``fn(input_shape, n_classes, seed=0, **kw)`` and returns a
:class:`~.network.Network`.

==================  =====================================  ==========================
name                architecture                           parameters
==================  =====================================  ==========================
``resnet50``        bottleneck ResNet [3, 4, 6, 3], v1.5   25,557,032 (224x224, 1000)
``vgg16``           VGG configuration D, no BN             138,357,544 (224x224, 1000)
``resnet20``        CIFAR ResNet-20, widths 16/32/64       272,474 (32x32, 10)
``resnet20_wide``   ResNet-20, widths 64/128/256           4,327,754 (32x32, 10)
``vgg_small``       VGG, 3 stages 32/64/128, FC 256-256    879,914 (32x32, 10)
==================  =====================================  ==========================

The architectures and their choices (stride placement, projection
shortcuts, zero-gamma) are documented in :mod:`.resnet` and :mod:`.vgg`.
"""
from .registry import register
from .resnet import bottleneck_resnet, cifar_resnet
from .vgg import vgg16 as _vgg16, vgg_small as _vgg_small


@register('resnet50')
def resnet50(input_shape=(3, 224, 224), n_classes=1000, seed=0, stride_on='3x3'):
    """ResNet-50 for ImageNet (input (3, 224, 224), 1000 classes).

    ``stride_on='3x3'`` (default) puts each down-sampling stride on the 3x3
    convolution as in the Caffe2/Facebook implementation Goyal et al. used
    ("v1.5"); ``'1x1'`` gives He et al.'s original. 25,557,032 parameters
    for 1000 classes either way. See :func:`.resnet.bottleneck_resnet`.
    """
    return bottleneck_resnet(input_shape, n_classes, (3, 4, 6, 3), (64, 128, 256, 512),
                             seed=seed, stride_on=stride_on, name='resnet50')


@register('vgg16')
def vgg16(input_shape=(3, 224, 224), n_classes=1000, seed=0, bn=False):
    """VGG-16 (configuration D); ``bn=True`` gives VGG-16-BN. See :func:`.vgg.vgg16`."""
    return _vgg16(input_shape, n_classes, seed=seed, bn=bn)


@register('resnet20')
def resnet20(input_shape=(3, 32, 32), n_classes=10, seed=0, width=16):
    """CIFAR ResNet-20 (3 stages x 3 basic blocks, widths 16/32/64).

    Projection (1x1 conv + BN) shortcuts where the shape changes, so
    272,474 parameters for 10 classes where the paper's zero-padding
    shortcuts give 269,722. See :func:`.resnet.cifar_resnet`.
    """
    return cifar_resnet(input_shape, n_classes, depth=20, width=width, seed=seed,
                        name='resnet20')


@register('resnet20_wide')
def resnet20_wide(input_shape=(3, 32, 32), n_classes=10, seed=0, multiplier=4):
    """ResNet-20 with every width times ``multiplier`` (4: widths 64/128/256).

    4,327,754 parameters for 10 classes with the default multiplier 4.
    """
    return cifar_resnet(input_shape, n_classes, depth=20, width=16 * multiplier,
                        seed=seed, name='resnet20_wide')


@register('vgg_small')
def vgg_small(input_shape=(3, 32, 32), n_classes=10, seed=0, bn=False, width=32,
              fc=(256, 256)):
    """A CPU-scale VGG for 8x8 or 32x32 inputs. See :func:`.vgg.vgg_small`."""
    return _vgg_small(input_shape, n_classes, seed=seed, bn=bn, width=width, fc=fc)
