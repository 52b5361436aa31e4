"""The model zoo's registry: builders by name (filled by :func:`register`)."""

MODELS = {}


def register(name):
    """Decorator adding a model builder to :data:`MODELS`."""
    def deco(fn):
        MODELS[name] = fn
        return fn
    return deco
