"""Weight initialisers (numpy, seeded by the caller's RandomState).

He (MSRA) normal for convolutions and hidden dense layers; N(0, 0.01) for
the last fully connected layer (Goyal et al. 2017, Sec. 5.1).
"""
import numpy as np


def he_normal(rng, shape):
    """N(0, 2/fan_in), fan_in = prod(shape[1:]) (conv: in*kh*kw; dense: rows)."""
    fan_in = int(np.prod(shape[1:])) if len(shape) > 2 else int(shape[0])
    return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)


def normal(rng, shape, std=0.01):
    """N(0, std^2)."""
    return (rng.standard_normal(shape) * std).astype(np.float32)


def constant(shape, value):
    """An array full of ``value``."""
    return np.full(shape, value, np.float32)
