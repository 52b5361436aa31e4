"""The numpy random generator every initializer and random stream draws from."""
import numpy as np

_rng = np.random.RandomState(1234)


def get_rng():
    """The generator initializers use (a seeded RandomState unless replaced)."""
    return _rng


def set_rng(new_rng):
    """Replace the generator (e.g. ``np.random.RandomState(seed)`` for identical weights)."""
    global _rng
    _rng = new_rng
