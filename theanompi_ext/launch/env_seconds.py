"""Limits that a job takes from the environment (seconds, megabytes), read by the
launcher and by the ranks, which it passes them on to."""
import os

from ..errors import BadInput


def positive_from_env(var, default, unit, environ=None):
    """``$var`` as a number > 0 (finite) of ``unit``, ``default`` where unset or empty;
    :class:`~theanompi_ext.errors.BadInput` naming the variable otherwise."""
    text = (os.environ if environ is None else environ).get(var, '')
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = float('nan')
    if not 0 < value < float('inf'):
        raise BadInput('%s=%r: not a number of %s > 0' % (var, text, unit))
    return value


def seconds_from_env(var, default, environ=None):
    """``$var`` as seconds (:func:`positive_from_env`)."""
    return positive_from_env(var, default, 'seconds', environ)
