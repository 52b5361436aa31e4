"""An HDF5 data set (``docs/data.md``) as the trainer's data source.

Training batches go through the paper's augmentation (random-resized crop
over scale and aspect ratio, flip, per-colour normalisation); validation
batches through resize + centre crop. The augmentation of a batch is drawn
from a generator seeded by (seed, the batch's indices), so a batch is the
same whether a run is resumed or not, and differs between epochs because
the shuffle does.
"""
import zlib

import numpy as np

from .augment import Augmenter
from .hdf5 import open_dataset


class HDF5Source(object):
    """Train/val batches from an HDF5 file, same interface as ``ArrayDataset``.

    Parameters
    ----------
    path : str
    crop : int
        Output side length; 0 means the stored image size.
    scale_min : float
        Lower end of the random-resized crop's area range (upper end 1).
    seed : int
    in_memory : bool
        Load the images into memory (small data sets).
    """

    def __init__(self, path, crop=0, scale_min=0.08, seed=0, in_memory=False):
        self.ds = open_dataset(path, in_memory=in_memory)
        h, w, c = self.ds.image_shape
        size = int(crop) or min(h, w)
        self.name = path
        self.n_classes = self.ds.n_classes
        self.input_shape = (c, size, size)
        self.y_train = self.ds.train.labels.astype(np.int32)
        self.y_val = self.ds.val.labels.astype(np.int32)
        self.seed = int(seed)
        self._train_aug = Augmenter(size, self.ds.mean, self.ds.std, train=True,
                                    scale=(scale_min, 1.0))
        # Stored images at the crop size are only normalised at validation.
        self._val_aug = Augmenter(size, self.ds.mean, self.ds.std, train=False,
                                  resize=size if size == min(h, w) else None)

    def train_batch(self, idx):
        """Augmented float32 NCHW images and int32 labels of ``idx``."""
        images, labels = self.ds.train.get_batch(idx)
        key = zlib.crc32(np.asarray(idx, np.int64).tobytes()) ^ self.seed
        rng = np.random.default_rng(key)
        return self._train_aug(images, rng), labels.astype(np.int32)

    def val_batch(self, idx):
        """Centre-cropped, normalised validation images and labels."""
        images, labels = self.ds.val.get_batch(idx)
        return self._val_aug(images), labels.astype(np.int32)


def load_hdf5_dataset(path, cfg):
    """The source for ``cfg.data`` (crop, scale_min and seed from ``cfg``)."""
    return HDF5Source(path, crop=cfg.crop, scale_min=cfg.scale_min, seed=cfg.data_seed,
                      in_memory=bool(cfg.extra.get('in_memory', False)))


def load_dataset(cfg):
    """The data set named by ``cfg.data``."""
    if cfg.data == 'digits':
        from .digits import load_digits
        return load_digits(repeat=int(cfg.extra.get('repeat', 1)),
                           train_subset=int(cfg.extra.get('train_subset', 0)))
    return load_hdf5_dataset(cfg.data, cfg)
