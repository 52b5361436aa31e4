"""Forward side: layers, initialisers, networks, and the model zoo.

:func:`build_model` makes a model by name (see :data:`MODELS`).
"""

from .registry import MODELS, register


def build_model(name, input_shape, n_classes, seed=0, **kw):
    """Build model ``name`` for examples of ``input_shape`` and ``n_classes``."""
    _load_zoo()
    try:
        builder = MODELS[name]
    except KeyError:
        raise ValueError('unknown model %r; choose from %s' % (name, sorted(MODELS)))
    return builder(input_shape=input_shape, n_classes=n_classes, seed=seed, **kw)


def _load_zoo():
    from . import small
    register('mlp')(small.mlp)
    register('digits_cnn')(small.digits_cnn)
    import importlib.util
    if importlib.util.find_spec(__name__ + '.zoo') is not None:
        from . import zoo  # noqa: F401  (VGG / ResNet builders register themselves)
