"""Data side of the step: data sets, per-epoch shards, augmentation, prefetch.

``digits``    the embedded default data set (scikit-learn's 8x8 digits).
``shards``    one shuffle per epoch with a seed shared by all ranks, split
              into k shards (Goyal et al., Remark 4).
``hdf5``      the HDF5 layout for image classification, reader and writer.
``convert``   image folder -> HDF5.
``augment``   random-resized crop, flip, per-colour normalisation.
``prefetch``  the next batch is prepared while the current one trains.
"""
