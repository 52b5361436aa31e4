"""Small helpers: floatX casts, shared parameter creation, expressions."""
import numpy as np
import theano
import theano.tensor as T


def floatX(arr):
    """``arr`` as a numpy array of Theano's floatX."""
    return np.asarray(arr, dtype=theano.config.floatX)


def as_tuple(x, n):
    """``x`` repeated ``n`` times unless it already is a sequence of length ``n``."""
    if isinstance(x, (tuple, list)):
        if len(x) != n:
            raise ValueError('expected %d values, got %r' % (n, x))
        return tuple(x)
    return (x,) * n


def as_theano_expression(value):
    """A Theano variable for ``value`` (a variable stays; an array becomes a constant)."""
    if isinstance(value, theano.Variable):
        return value
    return T.constant(value)


def create_param(spec, shape, name=None):
    """A shared variable of ``shape`` from ``spec``: a shared variable (used as is),
    a numpy array (copied) or an initializer/callable ``spec(shape)``."""
    shape = tuple(int(s) for s in shape)
    if isinstance(spec, theano.compile.SharedVariable):
        if spec.ndim != len(shape):
            raise ValueError('parameter %s: shared variable has %d dimensions, expected %d'
                             % (name, spec.ndim, len(shape)))
        return spec
    if isinstance(spec, np.ndarray):
        if spec.shape != shape:
            raise ValueError('parameter %s: array of shape %s, expected %s'
                             % (name, spec.shape, shape))
        value = spec
    elif callable(spec):
        value = spec(shape)
    else:
        raise TypeError('cannot make parameter %s from %r' % (name, spec))
    return theano.shared(floatX(value), name=name)
