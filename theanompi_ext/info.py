"""``theanompi-ext info``: versions and which collective backends work here."""
import platform
import sys


def gather():
    """A list of (label, value) lines."""
    import numpy
    from . import __version__
    rows = [('theanompi_ext', __version__), ('python', platform.python_version()),
            ('numpy', numpy.__version__)]
    try:
        from .engine import version, theano
        rows.append(('theano', '%s (floatX=%s, compiledir=%s)' % (
            version(), theano.config.floatX, theano.config.base_compiledir)))
    except Exception as exc:
        rows.append(('theano', 'UNUSABLE: %s' % exc))
    try:
        import mpi4py
        rows.append(('mpi4py', mpi4py.__version__))
        from .collective.mpi import library_version, thread_level
        rows.append(('MPI library', '%s (thread level %s)' % (library_version(), thread_level())))
    except Exception as exc:
        rows.append(('mpi4py', 'UNUSABLE: %s' % exc))
    from .launch.mpiexec import find_mpiexec
    try:
        rows.append(('mpiexec', find_mpiexec()))
    except RuntimeError as exc:
        rows.append(('mpiexec', str(exc)))
    from .collective.registry import available_backends
    for name, ok, why in available_backends():
        rows.append(('backend %s' % name, '%s - %s' % ('yes' if ok else 'no', why)))
    return rows


def main(args=None):
    """Print the report."""
    for label, value in gather():
        print('%-16s %s' % (label, value))
    return 0


def register(sub):
    """Add the ``info`` sub-command."""
    p = sub.add_parser('info', help='versions and available collective backends')
    p.set_defaults(func=main)
