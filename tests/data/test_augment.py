"""numpy augmentation: shapes, values, determinism, flip, crop geometry."""
import numpy as np
import pytest

from theanompi_ext.data import augment as A


def _batch(n=6, h=20, w=30, c=3, seed=0):
    return np.random.RandomState(seed).randint(0, 256, (n, h, w, c)).astype(np.uint8)


MEAN, STD = [0.4, 0.5, 0.6], [0.2, 0.25, 0.3]


@pytest.mark.parametrize('train', [True, False])
def test_shapes_and_dtype(train):
    aug = A.Augmenter(16, MEAN, STD, train=train, seed=0)
    out = aug(_batch())
    assert out.shape == (6, 3, 16, 16) and out.dtype == np.float32
    assert out.flags['C_CONTIGUOUS']
    lo = (0 - np.array(MEAN)) / STD
    hi = (1 - np.array(MEAN)) / STD
    for ch in range(3):
        assert out[:, ch].min() >= lo[ch] - 1e-5 and out[:, ch].max() <= hi[ch] + 1e-5
    rect = A.Augmenter((12, 8), [0.5], [0.5], train=train)(_batch(c=1), np.random.RandomState(1))
    assert rect.shape == (6, 1, 12, 8)


@pytest.mark.parametrize('train', [True, False])
def test_constant_image_normalised(train):
    img = np.empty((3, 17, 23, 3), np.uint8)
    img[...] = [51, 128, 204]
    out = A.Augmenter(8, MEAN, STD, train=train)(img, np.random.default_rng(0))
    expect = (np.array([51, 128, 204]) / 255.0 - MEAN) / STD
    for ch in range(3):
        np.testing.assert_allclose(out[:, ch], expect[ch], atol=1e-5)
    # Standardised with its own statistics a batch has mean ~0 and std ~1.
    x = _batch(n=4, h=8, w=8)
    m = x.reshape(-1, 3).mean(0) / 255.0
    s = (x.reshape(-1, 3) / 255.0).std(0)
    out = A.val_transform(x, 8, m, s, resize=8)  # identity geometry
    np.testing.assert_allclose(out.mean(axis=(0, 2, 3)), 0, atol=1e-5)
    np.testing.assert_allclose(out.std(axis=(0, 2, 3)), 1, atol=1e-4)


@pytest.mark.parametrize('make', [np.random.default_rng, np.random.RandomState])
def test_deterministic_under_seed(make):
    x = _batch()
    aug = A.Augmenter(16, MEAN, STD, scale=(0.35, 1))
    a, b = aug(x, make(7)), aug(x, make(7))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, aug(x, make(8)))
    # The constructor seed drives calls without an rng.
    np.testing.assert_array_equal(A.Augmenter(16, MEAN, STD, seed=3)(x),
                                  A.Augmenter(16, MEAN, STD, seed=3)(x))


def test_flip_flips():
    x = _batch(n=64, h=10, w=10)
    aug_flip = A.Augmenter(10, MEAN, STD, scale=(1, 1), ratio=(1, 1), flip_p=1.0)
    aug_none = A.Augmenter(10, MEAN, STD, scale=(1, 1), ratio=(1, 1), flip_p=0.0)
    plain = aug_none(x, np.random.default_rng(0))
    # scale=ratio=1 on a square image: the crop is the whole image.
    np.testing.assert_allclose(plain, A.normalize(x.astype(np.float32), MEAN, STD), atol=1e-5)
    np.testing.assert_allclose(aug_flip(x, np.random.default_rng(0)), plain[..., ::-1],
                               atol=1e-6)
    half = A.Augmenter(10, MEAN, STD, scale=(1, 1), ratio=(1, 1))(x, np.random.default_rng(0))
    flipped = np.array([np.allclose(h, p[..., ::-1]) and not np.allclose(h, p)
                        for h, p in zip(half, plain)])
    same = np.array([np.allclose(h, p) for h, p in zip(half, plain)])
    assert np.all(flipped | same) and 15 < flipped.sum() < 49


def test_center_crop_geometry_by_hand():
    img = np.arange(6 * 8, dtype=np.uint8).reshape(1, 6, 8, 1)
    # Shorter side already 6: no scaling, crop rows 1..4 and columns 2..5.
    out = A.val_transform(img, 4, [0.0], [1.0], resize=6)
    np.testing.assert_allclose(out[0, 0] * 255, img[0, 1:5, 2:6, 0], atol=1e-4)
    assert A.center_crop_params(6, 8, 4, resize=6) == (1.0, 1.0, 1, 2)
    # Shorter side 6 -> 3: image halves to 3x4, the 2x2 centre crop starts at
    # (0, 1) of it; each output pixel is the mean of a 2x2 block of the input.
    out = A.val_transform(img, 2, [0.0], [1.0], resize=3)
    blocks = img[0, :, :, 0].reshape(3, 2, 4, 2).mean(axis=(1, 3))
    np.testing.assert_allclose(out[0, 0] * 255, blocks[0:2, 1:3], atol=1e-4)
    # Default resize is out_size * 256/224.
    assert A.default_resize(224) == 256 and A.default_resize(32) == 37


def test_random_resized_crop_params():
    rng = np.random.default_rng(0)
    top, left, h, w = A.random_resized_crop_params(rng, 500, 40, 60, (0.08, 1.0))
    assert np.all((top >= 0) & (left >= 0) & (top + h <= 40) & (left + w <= 60))
    area = h * w / 2400.0
    assert area.min() >= 0.07 and area.max() <= 1.0
    ratio = w / h.astype(float)
    assert ratio.min() > 0.7 and ratio.max() < 1.4
    # scale (0.35, 1) keeps larger crops.
    _, _, h2, w2 = A.random_resized_crop_params(rng, 500, 40, 60, (0.35, 1.0))
    assert (h2 * w2 / 2400.0).min() >= 0.34
    # An impossible request falls back to the centre crop (ratio clamped).
    top, left, h, w = A.random_resized_crop_params(rng, 3, 10, 100, (0.9, 1.0))
    assert list(h) == [10] * 3 and list(w) == [13] * 3
    assert list(left) == [43] * 3 and list(top) == [0] * 3


def test_bilinear_upscale_is_interpolation():
    img = np.array([[0, 100]], np.uint8).reshape(1, 1, 2, 1)
    ys = np.zeros((1, 1))
    xs = np.array([[0.0, 0.25, 0.5, 1.0]])
    np.testing.assert_allclose(A.bilinear_sample(img, ys, xs)[0, 0, :, 0], [0, 25, 50, 100])


def test_bad_arguments():
    with pytest.raises(ValueError):
        A.Augmenter(8, MEAN, STD, scale=(0, 1))
    with pytest.raises(ValueError):
        A.Augmenter(8, MEAN, [0.1, 0, 0.1])
    with pytest.raises(ValueError):
        A.Augmenter(8, MEAN, STD, train=False, resize=4)
    with pytest.raises(ValueError, match='uint8'):
        A.Augmenter(8, MEAN, STD)(np.zeros((1, 8, 8, 3), np.float32))
    with pytest.raises(ValueError, match='per channel'):
        A.Augmenter(8, [0.5], [0.5])(_batch())
