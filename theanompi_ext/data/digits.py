"""The embedded default data set: scikit-learn's 8x8 digits (offline).

1797 grey 8x8 images of 10 classes ship inside scikit-learn, so a fresh
machine with no network can train out of the box.
"""
import numpy as np


class ArrayDataset(object):
    """In-memory train/val arrays: x float32 (N, C, H, W), y int32 (N,)."""

    def __init__(self, name, x_train, y_train, x_val, y_val, n_classes):
        self.name = name
        self.x_train, self.y_train = x_train, y_train
        self.x_val, self.y_val = x_val, y_val
        self.n_classes = int(n_classes)
        self.input_shape = tuple(x_train.shape[1:])

    def train_batch(self, idx):
        """Examples ``idx`` of the training split."""
        return self.x_train[idx], self.y_train[idx]

    def val_batch(self, idx):
        """Examples ``idx`` of the validation split."""
        return self.x_val[idx], self.y_val[idx]


def load_digits(val_fraction=0.2, seed=0, repeat=1, train_subset=0):
    """Digits, normalised by the training split's mean/std, split by ``seed``.

    ``repeat`` tiles the training split (for longer benchmark epochs);
    ``train_subset`` > 0 keeps only that many training examples (tests).
    """
    from sklearn.datasets import load_digits as _sk
    d = _sk()
    x = (d.images.astype(np.float32) / 16.0)[:, None, :, :]
    y = d.target.astype(np.int32)
    perm = np.random.RandomState(seed).permutation(len(y))
    n_val = int(round(len(y) * val_fraction))
    val, tr = perm[:n_val], perm[n_val:]
    if train_subset:
        tr = tr[:train_subset]
    mean, std = x[tr].mean(), x[tr].std()
    x = (x - mean) / std
    xt, yt = np.tile(x[tr], (repeat, 1, 1, 1)), np.tile(y[tr], repeat)
    return ArrayDataset('digits', np.ascontiguousarray(xt), yt,
                        np.ascontiguousarray(x[val]), y[val], 10)
