"""theanompi_ext: large-minibatch synchronous SGD for Theano-MPI models.

Goyal et al. 2017's recipe (kn-normalised loss, summed gradients, linear
learning-rate scaling with per-iteration warm-up, momentum correction,
batch-norm parameters kept out of the exchange) on an exchanger that
overlaps each bucket's allreduce with the rest of backprop.

The package imports Theano lazily: ``import theanompi_ext`` is cheap, and
the engine is configured the first time a module that needs it is imported.
"""
__version__ = '0.1.0'


def __getattr__(name):
    # Lazy so that `import theanompi_ext` (e.g. for `info` or the launcher)
    # does not pay for importing and configuring Theano.
    if name == 'BSP':
        from .theanompi_compat.rule import BSP
        return BSP
    raise AttributeError(name)
