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
import sys
import tempfile

from ..errors import BadInput

DEFAULT_FLAGS = {
    'floatX': 'float32',
    'blas.ldflags': '',
    'warn_float64': 'ignore',
}


#: The variable that names the compile cache's folder.
CACHE_VAR = 'THEANOMPI_EXT_CACHE'


class CacheUnusable(BadInput):
    """The compile cache's folder cannot be created or written (exit status 2)."""


#: Folders found usable in this process: each is probed once, not at every
#: ``cache_dir()`` (the launcher's check, the flags, the pocl cache's path).
_usable = set()


def _unusable(path, own=False):
    """Why ``path`` cannot hold the compile cache (an OSError), or None: created if
    missing, 64 KiB written in it (a full disk fails here, not in a compile),
    and with ``own`` this user's (a folder of another user's in a shared
    temporary directory is not used; a chosen folder may be a group's)."""
    if (path, own) in _usable:
        return None
    try:
        os.makedirs(path, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix='.probe-', dir=path)
        try:
            left = 65536
            while left:           # a write short of space returns short; the next fails
                left -= os.write(fd, bytes(left))
        finally:
            os.close(fd)
            os.unlink(probe)
        if own and os.stat(path).st_uid != os.getuid():
            return OSError('owned by another user')
    except OSError as exc:
        return exc
    _usable.add((path, own))
    return None


def cache_dir():
    """The compile cache's folder, created and writable.

    ``$THEANOMPI_EXT_CACHE`` when set (:class:`CacheUnusable` when it cannot
    be used: the user chose it); else ``~/.cache/theanompi_ext``; else, when
    that cannot be written (a read-only or full home, as on some clusters'
    compute nodes), a folder of this user's in the temporary directory, with
    one warning. That choice is put in ``$THEANOMPI_EXT_CACHE``, so the ranks
    started from here use it without warning again.
    """
    path = os.environ.get(CACHE_VAR)
    if path:
        why = _unusable(path)
        if why is not None:
            raise CacheUnusable('the compile cache %s=%s cannot be used (%s): point %s at a '
                                'folder this user can write' % (CACHE_VAR, path, why, CACHE_VAR))
        return path
    home = os.path.join(os.path.expanduser('~'), '.cache', 'theanompi_ext')
    why = _unusable(home)
    if why is None:
        return home
    fallback = os.path.join(tempfile.gettempdir(), 'theanompi_ext-cache-%d' % os.getuid())
    also = _unusable(fallback, own=True)
    if also is not None:
        raise CacheUnusable('the compile cache cannot be made: %s (%s) nor %s (%s): set %s to '
                            'a folder this user can write' % (home, why, fallback, also, CACHE_VAR))
    sys.stderr.write('theanompi-ext: warning: the compile cache %s cannot be used (%s): '
                     'compiling into %s instead (set %s to choose)\n'
                     % (home, why, fallback, CACHE_VAR))
    os.environ[CACHE_VAR] = fallback
    return fallback


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
