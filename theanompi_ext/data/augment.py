"""Image augmentation in numpy: uint8 NHWC batch in, float32 NCHW batch out.

Training (Goyal et al. 2017, Sec. 5.1, after Szegedy et al.'s Inception):
random-resized crop -- a crop covering a fraction of the image area drawn
uniformly from ``scale`` with an aspect ratio drawn log-uniformly from
``ratio``; after 10 failed tries per image the centre crop (clamped to the
ratio range) is used -- resized bilinearly to ``out_size``, flipped left-right
with probability 0.5, then normalised per colour by ``(x/255 - mean) / std``.

Validation: resize so the shorter side is ``resize`` (default
``round(out_size * 256/224)``) and take the centre ``out_size`` crop, then
normalise. Resize and crop are fused into one bilinear sampling.

Bilinear sampling uses half-pixel centres (``align_corners=False``) and no
anti-aliasing, like ``torch.nn.functional.interpolate``. Randomness comes
only from the ``rng`` passed in (``numpy.random.Generator`` or
``RandomState``); the same rng state gives the same output. The draws are
made in a fixed order: crop areas, aspect ratios, crop positions, flips.
"""
import numpy as np

# Images resampled per block, bounding the float32 temporaries.
_BLOCK = 32
_TRIES = 10


def _size2(size):
    if np.ndim(size) == 0:
        return int(size), int(size)
    h, w = size
    return int(h), int(w)


def as_rng(rng):
    """A ``Generator``/``RandomState`` as is; an int or None seeds a Generator."""
    if isinstance(rng, (np.random.Generator, np.random.RandomState)):
        return rng
    return np.random.default_rng(rng)


def _check_images(images):
    images = np.asarray(images)
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[3] not in (1, 3):
        raise ValueError('images must be uint8 (N, H, W, C) with C in {1, 3}, got %s %r'
                         % (images.dtype, images.shape))
    return images


def random_resized_crop_params(rng, n, height, width, scale=(0.08, 1.0),
                               ratio=(3.0 / 4.0, 4.0 / 3.0)):
    """Crop boxes ``(top, left, h, w)`` (int arrays of length n) for n images.

    Parameters
    ----------
    rng : numpy Generator or RandomState
    n, height, width : int
        Number of images and their size.
    scale : (float, float)
        Range of the crop's area as a fraction of the image area.
    ratio : (float, float)
        Range of the crop's aspect ratio w/h (sampled log-uniformly).
    """
    if not 0 < scale[0] <= scale[1] <= 1:
        raise ValueError('scale must satisfy 0 < lo <= hi <= 1, got %r' % (scale,))
    if not 0 < ratio[0] <= ratio[1]:
        raise ValueError('ratio must satisfy 0 < lo <= hi, got %r' % (ratio,))
    area = float(height * width)
    target = area * rng.uniform(scale[0], scale[1], (n, _TRIES))
    aspect = np.exp(rng.uniform(np.log(ratio[0]), np.log(ratio[1]), (n, _TRIES)))
    w = np.rint(np.sqrt(target * aspect)).astype(np.int64)
    h = np.rint(np.sqrt(target / aspect)).astype(np.int64)
    ok = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    first = np.argmax(ok, axis=1)  # first successful try per image
    found = ok[np.arange(n), first]
    h = h[np.arange(n), first]
    w = w[np.arange(n), first]
    # Fallback: the centre crop with the aspect ratio clamped to the range.
    fh, fw = _fallback_crop(height, width, ratio)
    h = np.where(found, h, fh)
    w = np.where(found, w, fw)
    # Position drawn for every image (also fallbacks) so the number of
    # draws does not depend on the outcome.
    u = rng.uniform(0.0, 1.0, (2, n))
    top = np.minimum((u[0] * (height - h + 1)).astype(np.int64), height - h)
    left = np.minimum((u[1] * (width - w + 1)).astype(np.int64), width - w)
    top = np.where(found, top, (height - h) // 2)
    left = np.where(found, left, (width - w) // 2)
    return top, left, h, w


def _fallback_crop(height, width, ratio):
    in_ratio = width / float(height)
    if in_ratio < ratio[0]:
        w = width
        h = int(round(w / ratio[0]))
    elif in_ratio > ratio[1]:
        h = height
        w = int(round(h * ratio[1]))
    else:
        h, w = height, width
    return min(max(h, 1), height), min(max(w, 1), width)


def center_crop_params(height, width, out_size, resize=None):
    """Geometry of the validation transform for an image of height x width.

    Returns ``(scale_y, scale_x, top, left)``: the image is resized to
    ``(round(height*scale_y), round(width*scale_x))`` -- shorter side
    ``resize``, enlarged if needed so the crop fits -- and the ``out_size``
    crop starts at ``(top, left)`` of the resized image.
    """
    oh, ow = _size2(out_size)
    if resize is None:
        resize = default_resize(out_size)
    if resize < min(oh, ow):
        raise ValueError('resize (%d) must be >= the output size %r' % (resize, (oh, ow)))
    s = max(resize / float(min(height, width)), oh / float(height), ow / float(width))
    rh = max(oh, int(round(height * s)))
    rw = max(ow, int(round(width * s)))
    return rh / float(height), rw / float(width), (rh - oh) // 2, (rw - ow) // 2


def default_resize(out_size):
    """Validation resize for ``out_size``: the 256/224 ratio of ImageNet."""
    return int(round(min(_size2(out_size)) * 256.0 / 224.0))


def _axis_coords(start, length, n_out, lo, hi):
    """Source coordinates (B, n_out) sampling [start, start+length) at n_out
    half-pixel centres, clamped to [lo, hi] (per image)."""
    step = (np.asarray(length, np.float64) / n_out)[:, None]
    pos = np.asarray(start, np.float64)[:, None] + (np.arange(n_out) + 0.5) * step - 0.5
    return np.clip(pos, np.asarray(lo, np.float64)[:, None], np.asarray(hi, np.float64)[:, None])


def _split(coords):
    i0 = np.floor(coords).astype(np.int64)
    frac = (coords - i0).astype(np.float32)
    # i0 + 1 stays in bounds: where frac == 0 its weight is 0 anyway.
    i1 = i0 + (frac > 0)
    return i0, i1, frac


def bilinear_sample(images, ys, xs):
    """Sample uint8 NHWC ``images`` at per-image coordinates.

    Parameters
    ----------
    images : ndarray uint8 (B, H, W, C)
    ys : ndarray float (B, OH)
        Row coordinates (pixel centres at integers), already within [0, H-1].
    xs : ndarray float (B, OW)
        Column coordinates, within [0, W-1].

    Returns
    -------
    ndarray float32 (B, OH, OW, C) in [0, 255]
    """
    b = images.shape[0]
    y0, y1, fy = _split(ys)
    x0, x1, fx = _split(xs)
    bi = np.arange(b)[:, None]
    # Separable: rows first (B, OH, W, C), then columns (B, OH, OW, C).
    top = images[bi, y0].astype(np.float32)
    bot = images[bi, y1].astype(np.float32)
    fy = fy[:, :, None, None]
    rows = top + (bot - top) * fy
    bi3 = bi[:, :, None]
    oh = rows.shape[1]
    ri = np.arange(oh)[None, :, None]
    left = rows[bi3, ri, x0[:, None, :]]
    right = rows[bi3, ri, x1[:, None, :]]
    return left + (right - left) * fx[:, None, :, None]


def normalize(x, mean, std, out=None):
    """float32 NHWC in [0, 255] -> ``(x/255 - mean) / std`` as float32 NCHW."""
    mean = np.asarray(mean, np.float32).reshape(-1)
    std = np.asarray(std, np.float32).reshape(-1)
    c = x.shape[-1]
    if mean.shape != (c,) or std.shape != (c,):
        raise ValueError('mean and std need %d values (one per channel), got %d and %d'
                         % (c, mean.size, std.size))
    # One multiply-add: x * (1/(255 std)) - mean/std.
    scale = (1.0 / (255.0 * std)).astype(np.float32)
    shift = (mean / std).astype(np.float32)
    if out is None:
        out = np.empty((x.shape[0], c) + x.shape[1:3], np.float32)
    # Written straight into the NCHW output: no NHWC temporary.
    np.multiply(x.transpose(0, 3, 1, 2), scale[None, :, None, None], out=out)
    out -= shift[None, :, None, None]
    return out


def train_transform(images, rng, out_size, mean, std, scale=(0.08, 1.0),
                    ratio=(3.0 / 4.0, 4.0 / 3.0), flip_p=0.5):
    """Random-resized crop, horizontal flip, normalisation.

    Parameters
    ----------
    images : ndarray uint8 (N, H, W, C)
    rng : numpy Generator or RandomState
    out_size : int or (int, int)
    mean, std : sequence of C floats
        Per-channel statistics of images scaled to [0, 1].
    scale, ratio : (float, float)
        See :func:`random_resized_crop_params`.
    flip_p : float
        Probability of a left-right flip.

    Returns
    -------
    ndarray float32 (N, C, OH, OW)
    """
    images = _check_images(images)
    rng = as_rng(rng)
    n, height, width, c = images.shape
    oh, ow = _size2(out_size)
    top, left, h, w = random_resized_crop_params(rng, n, height, width, scale, ratio)
    flip = rng.uniform(0.0, 1.0, n) < flip_p
    out = np.empty((n, c, oh, ow), np.float32)
    for s in range(0, n, _BLOCK):
        e = min(n, s + _BLOCK)
        # Clamped to the crop itself, as if it were cut out and then resized.
        ys = _axis_coords(top[s:e], h[s:e], oh, top[s:e], top[s:e] + h[s:e] - 1)
        xs = _axis_coords(left[s:e], w[s:e], ow, left[s:e], left[s:e] + w[s:e] - 1)
        # Flipping the sampling grid flips the output at no cost.
        xs = np.where(flip[s:e, None], xs[:, ::-1], xs)
        normalize(bilinear_sample(images[s:e], ys, xs), mean, std, out=out[s:e])
    return out


def val_transform(images, out_size, mean, std, resize=None):
    """Resize the shorter side to ``resize``, centre crop, normalise.

    Parameters
    ----------
    images : ndarray uint8 (N, H, W, C)
    out_size : int or (int, int)
    mean, std : sequence of C floats
    resize : int, optional
        Shorter side after resizing; default ``round(out_size * 256/224)``.

    Returns
    -------
    ndarray float32 (N, C, OH, OW)
    """
    images = _check_images(images)
    n, height, width, c = images.shape
    oh, ow = _size2(out_size)
    sy, sx, top, left = center_crop_params(height, width, (oh, ow), resize)
    ones = np.ones(1)
    # Output pixel (i, j) is resized pixel (top+i, left+j); map it back.
    ys = _axis_coords(ones * top / sy, ones * oh / sy, oh, ones * 0, ones * (height - 1))
    xs = _axis_coords(ones * left / sx, ones * ow / sx, ow, ones * 0, ones * (width - 1))
    out = np.empty((n, c, oh, ow), np.float32)
    for s in range(0, n, _BLOCK):
        e = min(n, s + _BLOCK)
        k = e - s
        normalize(bilinear_sample(images[s:e], np.repeat(ys, k, 0), np.repeat(xs, k, 0)),
                  mean, std, out=out[s:e])
    return out


class Augmenter(object):
    """The train or validation transform with its settings bound.

    Parameters
    ----------
    out_size : int or (int, int)
    mean, std : sequence of floats
        Per-channel statistics (e.g. ``Dataset.mean`` / ``Dataset.std``).
    train : bool
        Random-resized crop + flip if True, resize + centre crop otherwise.
    scale, ratio : (float, float)
        Random-resized crop ranges (training only).
    resize : int, optional
        Validation shorter side; default ``round(out_size * 256/224)``.
    flip_p : float
        Flip probability (training only).
    seed : int or None
        Seeds the generator used when ``__call__`` gets no ``rng``.
    """

    def __init__(self, out_size, mean, std, train=True, scale=(0.08, 1.0),
                 ratio=(3.0 / 4.0, 4.0 / 3.0), resize=None, flip_p=0.5, seed=None):
        self.out_size = _size2(out_size)
        self.mean = np.asarray(mean, np.float32).reshape(-1)
        self.std = np.asarray(std, np.float32).reshape(-1)
        if self.mean.shape != self.std.shape or not np.all(self.std > 0):
            raise ValueError('mean and std must have the same length and std > 0')
        self.train = bool(train)
        self.scale = tuple(float(v) for v in scale)
        self.ratio = tuple(float(v) for v in ratio)
        if not 0 < self.scale[0] <= self.scale[1] <= 1:
            raise ValueError('scale must satisfy 0 < lo <= hi <= 1, got %r' % (scale,))
        if not 0 < self.ratio[0] <= self.ratio[1]:
            raise ValueError('ratio must satisfy 0 < lo <= hi, got %r' % (ratio,))
        self.resize = default_resize(self.out_size) if resize is None else int(resize)
        if self.resize < min(self.out_size):
            raise ValueError('resize (%d) must be >= the output size %r'
                             % (self.resize, self.out_size))
        self.flip_p = float(flip_p)
        self.rng = as_rng(seed)

    def __call__(self, images, rng=None):
        """Transform a uint8 NHWC batch to float32 NCHW."""
        if not self.train:
            return val_transform(images, self.out_size, self.mean, self.std, self.resize)
        return train_transform(images, self.rng if rng is None else as_rng(rng),
                               self.out_size, self.mean, self.std, self.scale,
                               self.ratio, self.flip_p)

    def __repr__(self):
        return ('Augmenter(out_size=%r, train=%r, scale=%r, ratio=%r, resize=%r)'
                % (self.out_size, self.train, self.scale, self.ratio, self.resize))
