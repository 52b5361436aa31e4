"""``theanompi-ext info``: versions and which collective backends work here."""
import platform


def gather():
    """A list of (label, value) lines."""
    import numpy
    from .. import __version__
    rows = [('theanompi_ext', __version__), ('python', platform.python_version()),
            ('numpy', numpy.__version__)]
    try:
        from ..engine.core import version, theano
        rows.append(('theano', '%s (floatX=%s, compiledir=%s)' % (
            version(), theano.config.floatX, theano.config.base_compiledir)))
    except Exception as exc:
        rows.append(('theano', 'UNUSABLE: %s' % exc))
    try:
        import mpi4py
        rows.append(('mpi4py', mpi4py.__version__))
        from ..collective.mpi import library_version, thread_level
        rows.append(('MPI library', '%s (thread level %s)' % (library_version(), thread_level())))
    except Exception as exc:
        rows.append(('mpi4py', 'UNUSABLE: %s' % exc))
    from ..launch.mpiexec import find_mpiexec
    try:
        rows.append(('mpiexec', find_mpiexec()))
    except RuntimeError as exc:
        rows.append(('mpiexec', str(exc)))
    from ..collective.registry import available_backends
    for name, ok, why in available_backends():
        rows.append(('backend %s' % name, '%s - %s' % ('yes' if ok else 'no', why)))
    rows.extend(device_rows())
    return rows


def openable_devices():
    """(pygpu version or None, [device strings pygpu opens], [(device, why not)])."""
    try:
        import pygpu
        import pygpu.gpuarray as ga
    except ImportError as exc:
        return None, [], [('pygpu', 'not installed (%s); `make gpu-deps` as root' % exc)]
    from ..engine.core import open_failure
    ok, failed = [], []
    for kind in ('cuda', 'opencl'):
        try:
            platforms = ga.count_platforms(kind)
            names = ['cuda%d' % d for d in range(ga.count_devices(kind, 0))] if kind == 'cuda' \
                else ['opencl%d:%d' % (p, d) for p in range(platforms)
                      for d in range(ga.count_devices(kind, p))]
        except Exception as exc:  # noqa: B902 - pygpu raises its own types
            msg = exc.args[0] if exc.args else exc
            failed.append((kind, msg.decode('utf-8', 'replace') if isinstance(msg, bytes)
                           else str(msg)))
            continue
        for dev in names:
            why = open_failure(dev)
            (failed.append((dev, why)) if why else ok.append(dev))
    return pygpu.__version__, ok, failed


def device_rows():
    """pygpu, the devices it opens, and per exchange path whether it works."""
    from ..step.device import nccl_unavailable
    version, ok, failed = openable_devices()
    rows = [('pygpu', version or 'no')]
    rows.append(('devices', ', '.join(['cpu'] + ok)))
    rows.extend(('device %s' % d, 'no - %s' % why) for d, why in failed)
    rows.append(('exchange host', 'yes - host buffers over MPI (--device cpu)'))
    rows.append(('exchange host-staged', 'yes - device buckets copied to host, MPI, copied '
                 'back (%s)' % ', '.join(ok) if ok else 'no - no device opens here'))
    cuda = [d for d in ok if d.startswith('cuda')]
    why = nccl_unavailable(cuda[0] if cuda else 'opencl')
    rows.append(('exchange nccl', 'no - %s' % why if why else 'yes'))
    return rows


def main(args=None):
    """Print the report."""
    for label, value in gather():
        print('%-16s %s' % (label, value))
    return 0


def register(sub):
    """Add the ``info`` sub-command."""
    p = sub.add_parser('info', help='versions, available collective backends, devices '
                       'and device exchange paths')
    p.set_defaults(func=main)
