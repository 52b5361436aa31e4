"""HDF5 layout for image classification: writer, reader and validation.

Layout (``format_version`` 1)::

    /                      attrs: format_version = 1 (int), layout = 'NHWC'
    /class_names           str (K,)            variable-length UTF-8
    /mean                  float32 (C,)        per-channel, train images / 255
    /std                   float32 (C,)        per-channel, train images / 255
    /train/images          uint8 (N, H, W, C)  C in {1, 3}
    /train/labels          int64 (N,)          values in [0, K)
    /val/images            uint8 (M, H, W, C)  same H, W, C as train
    /val/labels            int64 (M,)

Images are stored NHWC (the order images are decoded in); augmentation
turns them into float32 NCHW. ``train`` must hold at least one image, ``val``
may be empty. ``mean`` and ``std`` are population statistics (ddof=0) of the
train images scaled to [0, 1]; a channel that is constant over the whole
train split gets ``std = 1/255`` (one grey level) instead of 0.

Every problem found while opening a file is a :class:`DataError` whose
message starts with the file name and names the field, e.g.
``data.h5: missing dataset 'train/labels'``.
"""
import os
import tempfile

import h5py
import numpy as np

from ..files.atomic import fsync_dir
from ..errors import DataError

FORMAT_VERSION = 1
SPLITS = ('train', 'val')
# Labels are range-checked this many at a time so huge files need no big read.
_LABEL_CHUNK = 1 << 20
# Target bytes per HDF5 chunk of images: a few images per chunk keeps random
# minibatch reads cheap without a huge chunk index.
_CHUNK_BYTES = 1 << 18
# Errors h5py / numpy raise on malformed content; wrapped into DataError.
_READ_ERRORS = (OSError, KeyError, TypeError, ValueError, RuntimeError,
                AttributeError, IndexError, OverflowError)


def _name(path):
    return os.fspath(path)


# --------------------------------------------------------------------------- writer

def _channel_hist(images):
    """Per-channel histogram (C, 256) of a uint8 NHWC array (exact, int64)."""
    c = images.shape[-1]
    flat = images.reshape(-1, c)
    return np.stack([np.bincount(flat[:, i], minlength=256) for i in range(c)])


def stats_from_hist(hist):
    """mean and std (float32, (C,)) of pixels / 255 given per-channel counts.

    Parameters
    ----------
    hist : ndarray (C, 256)
        Count of each uint8 value per channel.
    """
    hist = np.asarray(hist, dtype=np.float64)
    values = np.arange(256, dtype=np.float64) / 255.0
    n = hist.sum(axis=1)
    mean = (hist * values).sum(axis=1) / n
    var = (hist * (values[None, :] - mean[:, None]) ** 2).sum(axis=1) / n
    std = np.maximum(np.sqrt(var), 1.0 / 255.0)
    return mean.astype(np.float32), std.astype(np.float32)


def _image_chunks(shape):
    n, h, w, c = shape
    if n == 0:
        return None
    per = max(1, min(n, _CHUNK_BYTES // max(1, h * w * c)))
    return (per, h, w, c)


class DatasetWriter(object):
    """Streams a data set into the layout, atomically.

    The file is written under a temporary name in the destination folder;
    on a clean exit of the ``with`` block mean/std are computed from what
    was written, the file is flushed, fsync'ed and renamed over ``path``.
    On an exception the temporary file is removed and ``path`` is untouched.

    Parameters
    ----------
    path : str
        Destination file.
    image_shape : tuple (H, W, C)
    class_names : sequence of str
    sizes : dict
        Number of images per split, e.g. ``{'train': 900, 'val': 100}``.
    compression : str or None
        h5py compression filter for the images (``'gzip'``, ``'lzf'``).
    """

    def __init__(self, path, image_shape, class_names, sizes, compression=None):
        self.path = _name(path)
        h, w, c = (int(v) for v in image_shape)
        if h < 1 or w < 1 or c not in (1, 3):
            raise DataError('%s: image shape must be (H, W, C) with C in {1, 3}, got %r'
                            % (self.path, tuple(image_shape)))
        self.image_shape = (h, w, c)
        self.class_names = [str(s) for s in class_names]
        if not self.class_names:
            raise DataError('%s: class_names is empty' % self.path)
        if len(set(self.class_names)) != len(self.class_names):
            raise DataError('%s: class_names has duplicates' % self.path)
        self.sizes = {s: int(sizes.get(s, 0)) for s in SPLITS}
        if self.sizes['train'] < 1:
            raise DataError('%s: the train split needs at least one image' % self.path)
        self.compression = compression
        self._hist = np.zeros((c, 256), dtype=np.int64)
        self._rows = dict.fromkeys(SPLITS, 0)
        self._file = None
        self._tmp = None

    def __enter__(self):
        folder = os.path.dirname(os.path.abspath(self.path))
        if not self.compression:
            # the size is known: refuse before writing rather than fill the disk
            from ..files.atomic import check_space
            h, w, c = self.image_shape
            check_space(self.path, sum(self.sizes.values()) * (h * w * c + 8),
                        'the data set')
        fd, self._tmp = tempfile.mkstemp(
            dir=folder, prefix='.%s.' % os.path.basename(self.path), suffix='.tmp')
        os.close(fd)
        try:
            self._file = h5py.File(self._tmp, 'w')
            f = self._file
            f.attrs['format_version'] = FORMAT_VERSION
            f.attrs['layout'] = 'NHWC'
            f.create_dataset('class_names', data=np.array(self.class_names, dtype=object),
                             dtype=h5py.string_dtype('utf-8'))
            for split in SPLITS:
                shape = (self.sizes[split],) + self.image_shape
                g = f.create_group(split)
                g.create_dataset('images', shape=shape, dtype=np.uint8,
                                 chunks=_image_chunks(shape),
                                 compression=self.compression if shape[0] else None)
                g.create_dataset('labels', shape=(shape[0],), dtype=np.int64)
        except BaseException:
            self._abort()
            raise
        return self

    def write(self, split, start, images, labels):
        """Write ``images`` (uint8 (n, H, W, C)) and ``labels`` at ``start``.

        Every row of every split must be written exactly once (mean/std are
        accumulated from the train rows as they arrive).
        """
        images = np.asarray(images)
        labels = np.asarray(labels)
        where = '%s: %s' % (self.path, split)
        if images.dtype != np.uint8:
            raise DataError('%s/images: dtype must be uint8, got %s' % (where, images.dtype))
        if images.ndim != 4 or images.shape[1:] != self.image_shape:
            raise DataError('%s/images: shape must be (n,) + %r, got %r'
                            % (where, self.image_shape, images.shape))
        if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
            raise DataError('%s/labels: shape must be (%d,), got %r'
                            % (where, images.shape[0], labels.shape))
        if labels.size and labels.dtype.kind not in 'iu':
            raise DataError('%s/labels: dtype must be integer, got %s' % (where, labels.dtype))
        if labels.size and (labels.min() < 0 or labels.max() >= len(self.class_names)):
            raise DataError('%s/labels: values must be in [0, %d), got [%d, %d]'
                            % (where, len(self.class_names), labels.min(), labels.max()))
        stop = start + images.shape[0]
        if start < 0 or stop > self.sizes[split]:
            raise DataError('%s: rows [%d, %d) outside the split of %d'
                            % (where, start, stop, self.sizes[split]))
        g = self._file[split]
        g['images'][start:stop] = images
        g['labels'][start:stop] = labels.astype(np.int64)
        self._rows[split] += images.shape[0]
        if split == 'train':
            self._hist += _channel_hist(images)

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self._abort()
            return False
        try:
            for split in SPLITS:
                if self._rows[split] != self.sizes[split]:
                    raise DataError('%s: %d of %d %s images were written'
                                    % (self.path, self._rows[split], self.sizes[split], split))
            mean, std = stats_from_hist(self._hist)
            self._file.create_dataset('mean', data=mean)
            self._file.create_dataset('std', data=std)
            self._file.flush()
            self._file.close()
            self._file = None
            # fsync before the rename so a crash never leaves a renamed but
            # empty/partial file behind.
            fd = os.open(self._tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(self._tmp, self.path)
            self._tmp = None
            fsync_dir(os.path.dirname(os.path.abspath(self.path)))
        except BaseException:
            self._abort()
            raise
        return False

    def _abort(self):
        if self._file is not None:
            try:
                self._file.close()
            except Exception:
                pass
            self._file = None
        if self._tmp is not None:
            try:
                os.remove(self._tmp)
            except OSError:
                pass
            self._tmp = None


def write_dataset(path, train_images, train_labels, val_images, val_labels,
                  class_names, compression=None):
    """Write a whole data set (in-memory arrays) to ``path`` in the layout.

    Parameters
    ----------
    path : str
        Destination; replaced atomically.
    train_images, val_images : ndarray uint8 (N, H, W, C)
        C in {1, 3}; both splits share H, W, C. ``val`` may be empty.
    train_labels, val_labels : ndarray of int (N,)
        Values in ``[0, len(class_names))``.
    class_names : sequence of str
    compression : str or None
        Optional h5py filter for the images.

    Returns
    -------
    str
        ``path``.
    """
    path = _name(path)
    train_images = np.asarray(train_images)
    val_images = np.asarray(val_images)
    if val_images.size == 0 and np.size(val_labels) == 0 and train_images.ndim == 4:
        # An empty val split may be given in any shape.
        val_images = np.zeros((0,) + train_images.shape[1:], train_images.dtype)
        val_labels = np.zeros(0, np.int64)
    for split, arr in (('train', train_images), ('val', val_images)):
        if arr.ndim != 4:
            raise DataError('%s: %s/images must be 4-D (N, H, W, C), got shape %r'
                            % (path, split, arr.shape))
    if val_images.shape[1:] != train_images.shape[1:]:
        raise DataError('%s: val/images shape %r does not match train/images %r'
                        % (path, val_images.shape[1:], train_images.shape[1:]))
    sizes = {'train': train_images.shape[0], 'val': val_images.shape[0]}
    with DatasetWriter(path, train_images.shape[1:], class_names, sizes,
                       compression=compression) as w:
        w.write('train', 0, train_images, np.asarray(train_labels))
        w.write('val', 0, val_images, np.asarray(val_labels))
    return path


# --------------------------------------------------------------------------- reader

class Split(object):
    """One split of an opened data set.

    Attributes
    ----------
    name : str
        ``'train'`` or ``'val'``.
    images : h5py.Dataset or ndarray
        uint8 (N, H, W, C); lazy unless opened with ``in_memory=True``.
    labels : ndarray int64 (N,)
        Always in memory.
    """

    def __init__(self, path, name, images, labels):
        self.path = path
        self.name = name
        self.images = images
        self.labels = labels

    def __len__(self):
        return int(self.labels.shape[0])

    def get_batch(self, indices):
        """Images (uint8 NHWC) and labels (int64) of the examples ``indices``.

        Indices may be in any order and repeat; HDF5 reads are done in
        sorted order (h5py's fancy indexing needs it) and reordered.
        """
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = len(self)
        if idx.size and (idx.min() < -n or idx.max() >= n):
            raise IndexError('%s: index out of range for %s split of %d'
                             % (self.path, self.name, n))
        idx = np.where(idx < 0, idx + n, idx)
        labels = self.labels[idx]
        if isinstance(self.images, np.ndarray):
            return self.images[idx], labels
        if idx.size == 0:
            return np.zeros((0,) + self.images.shape[1:], np.uint8), labels
        uniq, inverse = np.unique(idx, return_inverse=True)
        lo, hi = int(uniq[0]), int(uniq[-1]) + 1
        try:
            if hi - lo <= 2 * uniq.size:
                # Dense enough: one contiguous read beats point selection.
                block = self.images[lo:hi]
                images = block[uniq - lo]
            else:
                images = self.images[uniq]
        except _READ_ERRORS as exc:
            raise DataError('%s: cannot read %s/images: %s' % (self.path, self.name, exc))
        return images[inverse], labels


class Dataset(object):
    """An opened, validated data set; see the module docstring for the layout.

    Attributes
    ----------
    path : str
    train, val : Split
    class_names : list of str
    mean, std : ndarray float32 (C,)
    image_shape : tuple (H, W, C)
    n_classes : int
    format_version : int
    """

    def __init__(self, path, file, train, val, class_names, mean, std, format_version):
        self.path = path
        self._file = file
        self.train = train
        self.val = val
        self.class_names = class_names
        self.mean = mean
        self.std = std
        self.format_version = format_version
        self.image_shape = tuple(int(v) for v in train.images.shape[1:])
        self.n_classes = len(class_names)

    def split(self, name):
        """The ``'train'`` or ``'val'`` split."""
        if name not in SPLITS:
            raise KeyError(name)
        return getattr(self, name)

    def close(self):
        """Close the underlying file (lazy images become unreadable)."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        return ('Dataset(%r, train=%d, val=%d, image_shape=%r, n_classes=%d)'
                % (self.path, len(self.train), len(self.val), self.image_shape,
                   self.n_classes))


def open_dataset(path, in_memory=False):
    """Open and validate a data set written in the layout.

    Parameters
    ----------
    path : str
    in_memory : bool
        Load the images into numpy arrays and close the file; otherwise the
        images stay lazy h5py datasets and the file stays open until
        :meth:`Dataset.close`.

    Returns
    -------
    Dataset

    Raises
    ------
    DataError
        The file is missing, not HDF5, corrupt or truncated, or a field is
        missing or has the wrong type, shape or values. The message names
        the file and the field.
    """
    name = _name(path)
    if not os.path.exists(name):
        raise DataError('%s: no such file' % name)
    if os.path.isdir(name):
        raise DataError('%s: is a directory, not an HDF5 file' % name)
    try:
        f = h5py.File(name, 'r')
    except _READ_ERRORS as exc:
        raise DataError('%s: not a readable HDF5 file (corrupt or truncated?): %s'
                        % (name, exc))
    try:
        ds = _Validator(name, f).run(in_memory)
    except DataError:
        f.close()
        raise
    except _READ_ERRORS as exc:
        # A read failing below the checks (damaged chunk, bad metadata).
        f.close()
        raise DataError('%s: unreadable content (corrupt or truncated?): %s' % (name, exc))
    except BaseException:
        f.close()
        raise
    if in_memory:
        f.close()
        ds._file = None
    return ds


class _Validator(object):
    """Checks one open file field by field, raising DataError at the first problem."""

    def __init__(self, path, f):
        self.path = path
        self.f = f

    def fail(self, field, what):
        raise DataError("%s: %s %s" % (self.path, field, what))

    def get(self, key, kind):
        try:
            # getlink first: a dangling soft/external link raises on access.
            present = key in self.f
        except _READ_ERRORS as exc:
            self.fail("'%s'" % key, 'cannot be read: %s' % exc)
        if not present:
            raise DataError("%s: missing %s '%s'" % (
                self.path, 'group' if kind is h5py.Group else 'dataset', key))
        try:
            obj = self.f[key]
        except _READ_ERRORS as exc:
            self.fail("'%s'" % key, 'cannot be read: %s' % exc)
        if not isinstance(obj, kind):
            self.fail("'%s'" % key, 'must be a %s' % (
                'group' if kind is h5py.Group else 'dataset'))
        return obj

    def read(self, key, dset):
        try:
            return dset[()]
        except _READ_ERRORS as exc:
            self.fail("'%s'" % key, 'cannot be read: %s' % exc)

    def run(self, in_memory):
        version = self.format_version()
        class_names = self.class_names()
        k = len(class_names)
        splits = {}
        for split in SPLITS:
            splits[split] = self.split(split, k, in_memory)
        shape_t = splits['train'].images.shape[1:]
        shape_v = splits['val'].images.shape[1:]
        if shape_v != shape_t:
            self.fail("'val/images'", 'has image shape %r but train/images has %r'
                      % (tuple(shape_v), tuple(shape_t)))
        if len(splits['train']) < 1:
            self.fail("'train/images'", 'is empty')
        c = shape_t[-1]
        mean = self.stat('mean', c, positive=False)
        std = self.stat('std', c, positive=True)
        return Dataset(self.path, self.f, splits['train'], splits['val'],
                       class_names, mean, std, version)

    def format_version(self):
        try:
            attrs = self.f.attrs
            present = 'format_version' in attrs
            raw = attrs['format_version'] if present else None
        except _READ_ERRORS as exc:
            self.fail("attribute 'format_version'", 'cannot be read: %s' % exc)
        if not present:
            raise DataError("%s: missing attribute 'format_version'" % self.path)
        val = np.asarray(raw)
        if val.shape not in ((), (1,)) or val.dtype.kind not in 'iu':
            self.fail("attribute 'format_version'", 'must be an integer, got %r' % (raw,))
        version = int(val.reshape(()))
        if version != FORMAT_VERSION:
            self.fail("attribute 'format_version'", 'is %d; this reader supports %d'
                      % (version, FORMAT_VERSION))
        return version

    def class_names(self):
        d = self.get('class_names', h5py.Dataset)
        if h5py.check_string_dtype(d.dtype) is None:
            self.fail("dataset 'class_names'", 'must hold strings, got dtype %s' % d.dtype)
        if d.ndim != 1:
            self.fail("dataset 'class_names'", 'must be 1-D, got shape %r' % (d.shape,))
        try:
            names = [str(s) for s in d.asstr()[()]]
        except _READ_ERRORS as exc:
            self.fail("dataset 'class_names'", 'cannot be read as UTF-8: %s' % exc)
        if not names:
            self.fail("dataset 'class_names'", 'is empty')
        if len(set(names)) != len(names):
            self.fail("dataset 'class_names'", 'has duplicate names')
        return names

    def split(self, split, n_classes, in_memory):
        self.get(split, h5py.Group)
        ikey, lkey = split + '/images', split + '/labels'
        images = self.get(ikey, h5py.Dataset)
        labels = self.get(lkey, h5py.Dataset)
        if images.dtype != np.uint8:
            self.fail("dataset '%s'" % ikey, 'must be uint8, got dtype %s' % images.dtype)
        if images.ndim != 4:
            self.fail("dataset '%s'" % ikey, 'must be 4-D (N, H, W, C), got shape %r'
                      % (images.shape,))
        if images.shape[3] not in (1, 3) or images.shape[1] < 1 or images.shape[2] < 1:
            self.fail("dataset '%s'" % ikey, 'must be (N, H, W, C) with H, W >= 1 and '
                      'C in {1, 3}, got shape %r' % (images.shape,))
        if labels.dtype.kind not in 'iu':
            self.fail("dataset '%s'" % lkey, 'must be int64, got dtype %s' % labels.dtype)
        if labels.ndim != 1:
            self.fail("dataset '%s'" % lkey, 'must be 1-D, got shape %r' % (labels.shape,))
        if labels.shape[0] != images.shape[0]:
            self.fail("dataset '%s'" % lkey, 'has %d entries but %s has %d'
                      % (labels.shape[0], ikey, images.shape[0]))
        lab = self.labels(lkey, labels, n_classes)
        if in_memory:
            imgs = self.read(ikey, images)
        else:
            imgs = images
        return Split(self.path, split, imgs, lab)

    def labels(self, key, dset, n_classes):
        n = dset.shape[0]
        out = np.empty(n, dtype=np.int64)
        for start in range(0, n, _LABEL_CHUNK):
            try:
                part = dset[start:start + _LABEL_CHUNK]
            except _READ_ERRORS as exc:
                self.fail("dataset '%s'" % key, 'cannot be read: %s' % exc)
            lo, hi = int(part.min()), int(part.max())
            if lo < 0 or hi >= n_classes:
                bad = int(np.flatnonzero((part < 0) | (part >= n_classes))[0]) + start
                self.fail("dataset '%s'" % key, 'has values outside [0, %d) '
                          '(n_classes): e.g. %d at index %d'
                          % (n_classes, int(dset[bad]), bad))
            out[start:start + part.shape[0]] = part
        return out

    def stat(self, key, channels, positive):
        d = self.get(key, h5py.Dataset)
        if d.dtype.kind != 'f':
            self.fail("dataset '%s'" % key, 'must be float32, got dtype %s' % d.dtype)
        if d.shape != (channels,):
            self.fail("dataset '%s'" % key, 'must have shape (%d,) (one per channel), '
                      'got %r' % (channels, d.shape))
        val = np.asarray(self.read(key, d), dtype=np.float32)
        if not np.all(np.isfinite(val)):
            self.fail("dataset '%s'" % key, 'has non-finite values %r' % (val.tolist(),))
        if positive and not np.all(val > 0):
            self.fail("dataset '%s'" % key, 'must be > 0, got %r' % (val.tolist(),))
        return val
