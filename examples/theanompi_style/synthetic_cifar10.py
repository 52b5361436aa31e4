"""CIFAR-10-shaped synthetic data with the interface of Theano-MPI's
``Cifar10_data`` (``theanompi/models/data/cifar10.py``): no download.

Images are (3, 32, 32) float32 in about [0, 1]: a smooth pattern per class
plus noise, so a network can learn them. The whole set is generated from
one seed, the same on every rank; ``batch_data`` cuts it into file batches
(b01c -> kept as (b, c, 0, 1), the model rolls the batch axis last to get
c01b), ``shuffle_data`` reorders the file batches with a seed common to
the ranks, and ``shard_data`` gives rank r every size-th file batch.
``rawdata[4]`` is the mean image (c01), which the model subtracts in its
graph.
"""
import numpy as np


class SyntheticCifar10Data(object):
    channels, width, height, n_class = 3, 32, 32, 10

    def __init__(self, n_train, n_val, seed=1234, verbose=False):
        rng = np.random.RandomState(seed)
        protos = self._prototypes(rng)
        img, labels = self._draw(rng, protos, n_train + n_val)
        self.verbose = verbose
        self.rawdata = [img[:n_train], labels[:n_train], img[n_train:], labels[n_train:],
                        img[:n_train].mean(axis=0)]
        self.batched = False

    def _prototypes(self, rng):
        """One smooth (3, 32, 32) pattern per class: low-frequency cosines."""
        u = np.linspace(0.0, np.pi, self.width)
        out = []
        for _ in range(self.n_class):
            fx, fy = rng.randint(1, 4, size=2)
            phase = rng.uniform(0, np.pi, size=(self.channels, 1, 1))
            pattern = np.cos(fy * u[:, None] + phase) * np.cos(fx * u[None, :])
            out.append(0.5 + 0.25 * pattern)
        return np.asarray(out, np.float32)

    def _draw(self, rng, protos, n):
        labels = rng.randint(0, self.n_class, size=n)
        noise = rng.normal(0.0, 0.2, size=(n, self.channels, self.height, self.width))
        return (protos[labels] + noise).astype(np.float32), labels.astype(np.int64)

    def batch_data(self, file_batch_size):
        """Cut the training and validation sets into file batches (a list each)."""
        def cut(img, labels):
            n = len(labels) // file_batch_size
            return ([img[i * file_batch_size:(i + 1) * file_batch_size] for i in range(n)],
                    [labels[i * file_batch_size:(i + 1) * file_batch_size] for i in range(n)])
        self.train_img, self.train_labels = cut(self.rawdata[0], self.rawdata[1])
        self.val_img, self.val_labels = cut(self.rawdata[2], self.rawdata[3])
        self.batched = True

    def shuffle_data(self, mode, common_seed=1234):
        """Reorder the file batches of ``mode`` (the same order on every rank)."""
        if mode == 'train':
            order = np.random.RandomState(common_seed).permutation(len(self.train_img))
            self.train_img_shuffle = [self.train_img[i] for i in order]
            self.train_labels_shuffle = [self.train_labels[i] for i in order]
        else:
            self.val_img_shuffle, self.val_labels_shuffle = self.val_img, self.val_labels

    def shard_data(self, mode, rank, size):
        """Rank ``rank``'s file batches of ``mode``: every ``size``-th, from ``rank``."""
        if mode == 'train':
            self.train_img_shard = self.train_img_shuffle[rank::size]
            self.train_labels_shard = self.train_labels_shuffle[rank::size]
            self.n_batch_train = len(self.train_img_shard)
        else:
            self.val_img_shard = self.val_img_shuffle[rank::size]
            self.val_labels_shard = self.val_labels_shuffle[rank::size]
            self.n_batch_val = len(self.val_img_shard)
