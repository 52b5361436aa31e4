"""The model zoo: architectures, parameter counts, tags and initialisation.

The ImageNet models are only built (never compiled): their parameter
counts are checked against the published architectures and against an
independent count from the architecture's description. One small model
(ResNet-20 on 8x8 inputs) is compiled and run forward through Theano.
"""
import gc

import numpy as np
import pytest

from theanompi_ext.model import MODELS, build_model
from theanompi_ext.model.layers import (BatchNorm, Conv2D, Dense, ForwardContext,
                                        Residual, Sequence)
from theanompi_ext.params import tags_of

SMALL = ['resnet20', 'resnet20_wide', 'vgg_small']
SMALL_INPUTS = [(1, 8, 8), (3, 32, 32)]


# -- independent parameter counts, from the architectures' descriptions ----

def conv_count(cin, cout, k, bias=False):
    return k * k * cin * cout + (cout if bias else 0)


def bn_count(c):
    return 2 * c   # gamma and beta; running statistics are not parameters


def dense_count(n_in, n_out):
    return n_in * n_out + n_out


def bottleneck_resnet_count(stages, widths, n_classes, in_channels=3):
    total = conv_count(in_channels, 64, 7) + bn_count(64)
    cin = 64
    for n_blocks, w in zip(stages, widths):
        for j in range(n_blocks):
            total += (conv_count(cin, w, 1) + bn_count(w) + conv_count(w, w, 3) + bn_count(w)
                      + conv_count(w, 4 * w, 1) + bn_count(4 * w))
            if j == 0:   # every stage's first block changes the shape
                total += conv_count(cin, 4 * w, 1) + bn_count(4 * w)
            cin = 4 * w
    return total + dense_count(cin, n_classes)


def cifar_resnet_count(n, width, n_classes, in_channels, projection=True):
    total = conv_count(in_channels, width, 3) + bn_count(width)
    cin = width
    for i in range(3):
        cout = width * 2 ** i
        for j in range(n):
            total += 2 * bn_count(cout) + conv_count(cin, cout, 3) + conv_count(cout, cout, 3)
            if projection and (i > 0 and j == 0):
                total += conv_count(cin, cout, 1) + bn_count(cout)
            cin = cout
    return total + dense_count(cin, n_classes)


def vgg_count(stages, fc, n_classes, input_shape, bn=False):
    c, h, w = input_shape
    total = 0
    for widths in stages:
        for cout in widths:
            total += conv_count(c, cout, 3, bias=not bn) + (bn_count(cout) if bn else 0)
            c = cout
        h, w = h // 2, w // 2
    n_in = c * h * w
    for width in fc:
        total += dense_count(n_in, width)
        n_in = width
    return total + dense_count(n_in, n_classes)


# -- structure helpers: find layers by type, never by name -----------------

def walk(layer):
    """Every layer inside ``layer`` (itself included), depth first."""
    yield layer
    children = []
    if isinstance(layer, Sequence):
        children = layer.layers
    elif isinstance(layer, Residual):
        children = [p for p in (layer.branch, layer.shortcut) if p is not None]
    for child in children:
        for sub in walk(child):
            yield sub


def all_layers(net):
    return [sub for top in net.layers for sub in walk(top)]


def of_type(net, cls):
    return [l for l in all_layers(net) if isinstance(l, cls)]


# -- fixtures: the big models are built once per module --------------------

@pytest.fixture(scope='module')
def resnet50():
    net = build_model('resnet50', (3, 224, 224), 1000, seed=0)
    yield net
    del net
    gc.collect()


@pytest.fixture(scope='module')
def vgg16():
    net = build_model('vgg16', (3, 224, 224), 1000, seed=0)   # ~550 MB
    yield net
    del net
    gc.collect()


@pytest.fixture(params=['resnet50', 'vgg16'] + SMALL)
def any_net(request):
    """Every zoo model: the big ones shared, the small ones on 32x32 inputs."""
    if request.param in ('resnet50', 'vgg16'):
        return request.getfixturevalue(request.param)
    return build_model(request.param, (3, 32, 32), 10, seed=0)


# -- registry ---------------------------------------------------------------

def test_zoo_registers_its_builders():
    build_model('mlp', (1, 8, 8), 10)   # triggers the zoo import
    for name in ['resnet50', 'vgg16'] + SMALL:
        assert name in MODELS


# -- parameter counts --------------------------------------------------------

def test_resnet50_count(resnet50):
    n = resnet50.count_params()
    assert n == bottleneck_resnet_count((3, 4, 6, 3), (64, 128, 256, 512), 1000)
    assert n == 25557032
    assert abs(n - 25.557e6) / 25.557e6 < 0.005


def test_resnet50_v1_stride_same_count():
    # Stride placement moves no parameter; a small input keeps this quick.
    a = build_model('resnet50', (3, 64, 64), 10, stride_on='1x1').count_params()
    b = build_model('resnet50', (3, 64, 64), 10, stride_on='3x3').count_params()
    assert a == b == bottleneck_resnet_count((3, 4, 6, 3), (64, 128, 256, 512), 10)


def test_vgg16_count(vgg16):
    n = vgg16.count_params()
    assert n == 138357544
    assert n == vgg_count(((64,) * 2, (128,) * 2, (256,) * 3, (512,) * 3, (512,) * 3),
                          (4096, 4096), 1000, (3, 224, 224))


def test_vgg16_fc6_fan_in_from_shapes(vgg16):
    dense = of_type(vgg16, Dense)
    assert [d.W.get_value(borrow=True).shape for d in dense] == [
        (7 * 7 * 512, 4096), (4096, 4096), (4096, 1000)]
    # The original VGG: biases on every conv, no BN.
    convs = of_type(vgg16, Conv2D)
    assert len(convs) == 13 and all(c.b is not None for c in convs)
    assert not of_type(vgg16, BatchNorm)


@pytest.mark.parametrize('shape', SMALL_INPUTS)
def test_small_model_counts(shape):
    c = shape[0]
    assert build_model('resnet20', shape, 10).count_params() == cifar_resnet_count(3, 16, 10, c)
    assert build_model('resnet20_wide', shape, 10).count_params() == \
        cifar_resnet_count(3, 64, 10, c)
    stages = ((32, 32), (64, 64), (128, 128))
    for bn in (False, True):
        assert build_model('vgg_small', shape, 10, bn=bn).count_params() == \
            vgg_count(stages, (256, 256), 10, shape, bn=bn)


def test_resnet20_counts_match_paper():
    net = build_model('resnet20', (3, 32, 32), 10)
    # Option-B shortcuts cost 2,752 parameters over the paper's option A.
    assert net.count_params() == 272474
    assert cifar_resnet_count(3, 16, 10, 3, projection=False) == 269722
    assert abs(net.count_params() - 0.27e6) / 0.27e6 < 0.02
    wide = build_model('resnet20_wide', (3, 32, 32), 10).count_params()
    assert wide == 4327754 and abs(wide - 4.3e6) / 4.3e6 < 0.02


# -- structure ----------------------------------------------------------------

def test_resnet50_units(resnet50):
    kinds = [type(l).__name__ for l in resnet50.layers]
    assert kinds == ['Sequence'] + ['Residual'] * 16 + ['GlobalAvgPool', 'Dense']
    # Projection shortcuts exactly where the shape changes: first block of each stage.
    proj = [l.shortcut is not None for l in resnet50.layers if isinstance(l, Residual)]
    assert proj == [True, False, False, True, False, False, False,
                    True] + [False] * 5 + [True, False, False]


def test_resnet50_stride_on_3x3(resnet50):
    # v1.5: in every down-sampling block the 3x3 conv carries the stride.
    for block in resnet50.layers:
        if isinstance(block, Residual) and block.shortcut is not None:
            convs = [l for l in walk(block.branch) if isinstance(l, Conv2D)]
            assert [c.ksize for c in convs] == [1, 3, 1]
            assert convs[0].stride == 1 and convs[2].stride == 1
    strides = [c.stride for c in of_type(resnet50, Conv2D) if c.ksize == 3]
    assert strides.count(2) == 3
    assert resnet50.layers[-1].W.get_value(borrow=True).shape == (2048, 1000)
    shapes, s = [], (3, 224, 224)
    for layer in resnet50.layers:
        s = layer.output_shape(s)
        shapes.append(s)
    assert shapes[0] == (64, 56, 56)   # 7x7/2 conv, 3x3/2 pool with pad 1
    assert [shapes[i] for i in (3, 7, 13, 16)] == [
        (256, 56, 56), (512, 28, 28), (1024, 14, 14), (2048, 7, 7)]
    assert shapes[-1] == (1000,)


@pytest.mark.parametrize('name', SMALL)
@pytest.mark.parametrize('shape', SMALL_INPUTS)
def test_small_models_shapes(name, shape):
    net = build_model(name, shape, 7)
    s = tuple(shape)
    for layer in net.layers:
        s = layer.output_shape(s)
    assert s == (7,)


def test_too_small_input_fails_early():
    with pytest.raises(ValueError):
        build_model('vgg_small', (1, 4, 4), 10)


# -- tags, names, state ---------------------------------------------------------

def test_tags_and_stats(any_net):
    net = any_net
    params, stats = net.params, net.stats
    bns = of_type(net, BatchNorm)
    affine = {id(p) for b in bns for p in (b.gamma, b.beta)}
    weights = {id(l.W) for l in of_type(net, Conv2D) + of_type(net, Dense)}
    biases = {id(l.b) for l in of_type(net, Conv2D) + of_type(net, Dense) if l.b is not None}
    assert len(affine) + len(weights) + len(biases) == len(params)
    for p in params:
        t = tags_of(p)
        assert 'trainable' in t and 'bn_stat' not in t
        assert ('bn_affine' in t) == (id(p) in affine)
        assert ('bias' in t) == (id(p) in biases)
        assert p.get_value(borrow=True).dtype == np.float32
    # BN running statistics: tagged, per-worker, never trainable parameters.
    assert len(stats) == 2 * len(bns)
    assert {id(s) for s in stats} == {id(v) for b in bns for v in (b.mean, b.var)}
    assert not {id(s) for s in stats} & {id(p) for p in params}
    for s in stats:
        assert tags_of(s) == frozenset(['bn_stat'])


def test_unique_names(any_net):
    names = [v.name for v in any_net.params + any_net.stats]
    assert all(names) and len(set(names)) == len(names)


# -- initialisation -------------------------------------------------------------

def check_zero_gamma(net):
    """gamma 0 on each residual branch's last BN, 1 on every other BN."""
    zero = set()
    for block in net.layers:
        if isinstance(block, Residual):
            branch_bns = [l for l in walk(block.branch) if isinstance(l, BatchNorm)]
            zero.add(id(branch_bns[-1]))
    assert len(zero) == sum(isinstance(l, Residual) for l in net.layers) > 0
    for bn in of_type(net, BatchNorm):
        assert 'bn_affine' in tags_of(bn.gamma) and 'bn_affine' in tags_of(bn.beta)
        gamma = bn.gamma.get_value(borrow=True)
        assert np.all(gamma == (0.0 if id(bn) in zero else 1.0))
        assert np.all(bn.beta.get_value(borrow=True) == 0.0)


def test_zero_gamma_resnet50(resnet50):
    check_zero_gamma(resnet50)
    assert sum(np.all(b.gamma.get_value() == 0) for b in of_type(resnet50, BatchNorm)) == 16


@pytest.mark.parametrize('name', ['resnet20', 'resnet20_wide'])
def test_zero_gamma_small(name):
    net = build_model(name, (1, 8, 8), 10)
    check_zero_gamma(net)
    assert sum(np.all(b.gamma.get_value() == 0) for b in of_type(net, BatchNorm)) == 9


def fan_in(w):
    return int(np.prod(w.shape[1:])) if w.ndim == 4 else w.shape[0]


def test_he_init_big_conv(resnet50):
    convs = of_type(resnet50, Conv2D)
    big = max(convs, key=lambda c: c.W.get_value(borrow=True).size)
    w = big.W.get_value(borrow=True)
    assert w.shape == (512, 512, 3, 3)
    expected = np.sqrt(2.0 / fan_in(w))
    assert abs(w.std() / expected - 1) < 0.02
    assert abs(w.mean()) < 0.01 * expected


def test_he_init_every_conv(any_net):
    for conv in of_type(any_net, Conv2D):
        w = conv.W.get_value(borrow=True)
        if w.size >= 4096:   # enough samples for a 10% check
            assert abs(w.std() / np.sqrt(2.0 / fan_in(w)) - 1) < 0.1, conv.name


def test_last_fc_init(any_net):
    last = any_net.layers[-1]
    fc = [l for l in walk(last) if isinstance(l, Dense)][-1]
    w = fc.W.get_value(borrow=True)
    if w.size >= 10000:
        assert abs(w.std() / 0.01 - 1) < 0.05
    assert np.abs(w).max() < 0.1   # N(0, 0.01): nothing near He scale
    assert np.all(fc.b.get_value(borrow=True) == 0)


def test_vgg16_hidden_fc_he(vgg16):
    fc6 = of_type(vgg16, Dense)[0]
    w = fc6.W.get_value(borrow=True)
    assert abs(w.std() / np.sqrt(2.0 / w.shape[0]) - 1) < 0.02


def test_seed_determines_weights():
    a = build_model('resnet20', (1, 8, 8), 10, seed=3)
    b = build_model('resnet20', (1, 8, 8), 10, seed=3)
    c = build_model('resnet20', (1, 8, 8), 10, seed=4)
    wa, wb, wc = (n.params[0].get_value() for n in (a, b, c))
    assert np.array_equal(wa, wb) and not np.array_equal(wa, wc)


# -- the one compiled forward pass ---------------------------------------------------

def test_resnet20_forward_compiles():
    # Evaluation mode (BN from running statistics) compiles in about half
    # the cold-cache time of training mode; the training-mode BN graph is
    # the layers' and the trainer's tests' business.
    from theanompi_ext.engine.core import function
    net = build_model('resnet20', (1, 8, 8), 10, seed=0)
    x = net.input_var()
    ctx = ForwardContext(train=False)
    logits, outs = net.forward(x, ctx)
    assert len(outs) == len(net.layers) and not ctx.updates
    # The chunk boundaries' run-time shapes come back too, to check that
    # Layer.output_shape (used to size layers) agrees with Theano.
    f = function([x], [logits] + [o.shape for o in outs])
    xb = np.random.RandomState(0).standard_normal((4, 1, 8, 8)).astype(np.float32)
    res = f(xb)
    out, shapes = res[0], res[1:]
    s = net.input_shape
    for layer, got in zip(net.layers, shapes):
        s = layer.output_shape(s)
        assert tuple(got) == (4,) + tuple(s), layer.name
    assert out.shape == (4, 10)
    assert np.all(np.isfinite(out))
    assert out.std() > 0
