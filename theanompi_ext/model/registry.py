"""The model zoo's registry: builders by name (filled by :func:`register`)."""

MODELS = {}

# The zoo's names, known without importing Theano: a rank checks ``--model``
# before it opens its device, and Theano loads on one device per process
# (tests/model/test_registry_names.py holds this list to the registered one).
BUILTIN_NAMES = ('digits_cnn', 'mlp', 'resnet20', 'resnet20_wide', 'resnet50', 'vgg16',
                 'vgg_small')


def register(name):
    """Decorator adding a model builder to :data:`MODELS`."""
    def deco(fn):
        MODELS[name] = fn
        return fn
    return deco
