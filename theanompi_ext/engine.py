"""The one module that imports Theano.

Every other module gets Theano through here (``from theanompi_ext.engine
import theano, T``), so that the engine's configuration lives in one place
and no user has to set ``THEANO_FLAGS`` by hand:

* ``floatX=float32`` (the dtype the collectives and buffers assume);
* ``blas.ldflags=`` (empty): Theano 1.0.5 cannot read numpy 1.23's BLAS
  config and would otherwise fail; it then uses its NumPy C-API BLAS,
  measured within 15% of linking OpenBLAS directly;
* ``base_compiledir``: ``$THEANOMPI_EXT_CACHE`` or ``~/.cache/theanompi_ext``
  instead of ``~/.theano``;
* Python 3.11 cannot build the C extension of ``scan``
  (``longintrepr.h`` is gone), so we make Theano fall back to Python scan.

Flags the user did set in ``THEANO_FLAGS`` or in a ``.theanorc`` win over these
defaults (:mod:`theanompi_ext.engine_flags`, which does this without importing
Theano, for the launching side).
"""
import os
import sys
import warnings

from .engine_flags import merged_flags as _merged_flags


def _configure_and_import():
    os.environ['THEANO_FLAGS'] = _merged_flags(os.environ.get('THEANO_FLAGS', ''))
    # Python 3.11: the scan C extension cannot compile; None makes the
    # import fail fast so Theano uses its pure-Python scan.
    sys.modules.setdefault('theano.scan_module.scan_perform_ext', None)
    import logging
    # The NumPy C-API BLAS warning is expected with blas.ldflags empty.
    logging.getLogger('theano.tensor.blas').setLevel(logging.ERROR)
    # Ranks sharing one compile cache wait on its lock; that is expected.
    logging.getLogger('theano.gof.compilelock').setLevel(logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        import theano as _theano
        import theano.tensor as _T
        import theano.tensor.nnet  # noqa: F401  (conv2d, softmax)
        import theano.tensor.signal.pool  # noqa: F401
    return _theano, _T


theano, T = _configure_and_import()
floatX = theano.config.floatX


def version():
    """Theano's version string."""
    return theano.__version__


def function(inputs, outputs, updates=None, name=None, excluding=()):
    """Compile a Theano function (thin wrapper so callers never import theano).

    ``excluding`` names graph optimisations (tags) to leave out of the
    default mode, e.g. ``('inplace_elemwise_optimizer',)``.
    """
    mode = theano.compile.mode.get_default_mode().excluding(*excluding) if excluding else None
    return theano.function(inputs, outputs, updates=updates, name=name, mode=mode,
                           allow_input_downcast=True, on_unused_input='ignore')


def shared(value, name=None, borrow=False):
    """Create a Theano shared variable."""
    return theano.shared(value, name=name, borrow=borrow)


def conv2d(x, w, border_mode, stride):
    """2-D convolution, NCHW input and (out, in, kh, kw) filters."""
    return T.nnet.conv2d(x, w, border_mode=border_mode, subsample=stride,
                         filter_flip=False)


def pool2d(x, size, stride, pad, mode):
    """Max or average pooling (mode 'max' or 'average_exc_pad')."""
    return theano.tensor.signal.pool.pool_2d(
        x, ws=size, stride=stride, pad=pad, ignore_border=True, mode=mode)


def grad(cost, wrt, known_grads=None):
    """Symbolic gradients of ``cost`` (or of ``known_grads`` pushed back when
    ``cost`` is None) with respect to the variables ``wrt``."""
    return theano.grad(cost, wrt, known_grads=known_grads)


def toposort(outputs):
    """Apply nodes computing ``outputs`` from the graph's roots, inputs first."""
    from theano.gof import graph
    return graph.io_toposort(graph.inputs(outputs), outputs)
