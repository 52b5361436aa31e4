"""Parameter tags: what a parameter is, attached where a layer creates it.

Parameters are tagged where a layer creates them (Lasagne's idea), so the
exchanger and weight decay select them structurally, never by name:

``trainable``      updated by the optimiser.
``bn_affine``      a batch-norm gamma or beta (no weight decay; by default
                   updated locally and never exchanged).
``bn_stat``        a batch-norm running mean/variance (per-worker state,
                   never trainable, never exchanged).
``bias``           a bias (Theano-MPI's weight type ``'b'``).
"""

TAGS = ('trainable', 'bn_affine', 'bn_stat', 'bias')
_ATTR = 'theanompi_ext_tags'


def tag(var, *tags):
    """Attach tags to a shared variable (returns it, for chaining)."""
    bad = [t for t in tags if t not in TAGS]
    if bad:
        raise ValueError('unknown parameter tag(s) %s; known: %s' % (bad, TAGS))
    current = set(getattr(var.tag, _ATTR, ()))
    current.update(tags)
    setattr(var.tag, _ATTR, frozenset(current))
    return var


def tags_of(var):
    """The tags of a shared variable (empty frozenset when untagged)."""
    return getattr(var.tag, _ATTR, frozenset())
