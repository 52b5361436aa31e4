"""The engine's (Theano's) configuration as flags, computed without importing Theano.

:mod:`theanompi_ext.engine.core` applies these before its ``import theano``; the
launching side (:mod:`theanompi_ext.rules`) applies them before it looks
up a model module, whose package may import Theano itself. Precedence,
lowest first: our defaults, the user's ``.theanorc`` (the files named by
``$THEANORC``, else ``~/.theanorc`` and ``~/.theanorc.txt``), the user's
``THEANO_FLAGS``. A default is left out when the user's ``.theanorc``
sets the same key, because Theano lets ``THEANO_FLAGS`` override it.
``device`` is the exception: it is always the project's own
(:func:`theanompi_ext.engine.devices.configured`, ``cpu`` unless ``--device``
chose one), so a Theano-MPI user's ``device=cuda0`` in a ``.theanorc``
does not put the launching side, or a CPU run, on a GPU.
"""
import configparser
import contextlib
import os

DEFAULT_FLAGS = {
    'floatX': 'float32',
    'blas.ldflags': '',
    'warn_float64': 'ignore',
}


def cache_dir():
    """Return the compile-cache directory, creating it."""
    path = os.environ.get('THEANOMPI_EXT_CACHE') or os.path.join(
        os.path.expanduser('~'), '.cache', 'theanompi_ext')
    os.makedirs(path, exist_ok=True)
    return path


def theanorc_keys(environ=None):
    """Flag names (``floatX``, ``blas.ldflags``, ...) set in the user's .theanorc files."""
    environ = os.environ if environ is None else environ
    default = os.pathsep.join([os.path.join('~', '.theanorc'), os.path.join('~', '.theanorc.txt')])
    paths = [os.path.expanduser(p) for p in environ.get('THEANORC', default).split(os.pathsep) if p]
    parser = configparser.ConfigParser(interpolation=None)
    parser.optionxform = str          # Theano's keys are case-sensitive (floatX)
    try:
        parser.read([p for p in paths if os.path.isfile(p)])
    except configparser.Error:
        return set()                  # Theano will report the broken file itself
    keys = set()
    for section in parser.sections():
        for option in parser.options(section):
            keys.add(option if section == 'global' else '%s.%s' % (section, option))
    return keys

# Theano's fused GPU kernel for crossentropy(softmax) (what -log(softmax(.)[y])
# becomes) does not build on OpenCL ("clBuildProgram: Unknown error", pocl):
# on OpenCL that one op stays on the host, the rest of the graph on the device.
OPENCL_EXCLUDED = ('local_gpua_crossentropysoftmaxargmax1hotwithbias:'
                   'local_gpua_crossentropysoftmax1hotwithbiasdx')


def merged_flags(user_flags, environ=None):
    """Our defaults, minus the keys of the user's .theanorc, overridden by ``user_flags``."""
    rc = theanorc_keys(environ)
    flags = {k: v for k, v in DEFAULT_FLAGS.items() if k not in rc}
    if 'base_compiledir' not in rc:
        flags['base_compiledir'] = cache_dir()
    order = list(flags)
    for item in filter(None, (s.strip() for s in user_flags.split(','))):
        key, _, value = item.partition('=')
        if key not in flags:
            order.append(key)
        flags[key] = value
    from .devices import configured
    dev = configured()
    if dev != 'cpu':
        # Theano 1.0.5 knows cuDNN only up to v7: convolutions use GpuCorrMM
        extra = [('dnn.enabled', 'False'), ('print_active_device', 'False')]
        if dev.startswith('opencl'):
            extra.append(('optimizer_excluding', OPENCL_EXCLUDED))
        for key, value in extra:
            if key not in flags:
                flags[key] = value
                order.append(key)
    if 'device' not in order:
        order.append('device')
    flags['device'] = dev
    return ','.join('%s=%s' % (k, flags[k]) for k in order)


@contextlib.contextmanager
def configured_environment():
    """``THEANO_FLAGS`` set as the engine sets it, restored afterwards.

    For code that may import a user's module (which may import Theano)
    without importing Theano itself; the environment children inherit is
    left as it was.
    """
    before = os.environ.get('THEANO_FLAGS')
    os.environ['THEANO_FLAGS'] = merged_flags(before or '')
    try:
        yield
    finally:
        if before is None:
            os.environ.pop('THEANO_FLAGS', None)
        else:
            os.environ['THEANO_FLAGS'] = before
