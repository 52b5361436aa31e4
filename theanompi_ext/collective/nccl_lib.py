"""A small ctypes binding of NCCL 2 (``libnccl.so.2``).

Only what the collective layer uses is bound: version, unique id,
communicator init/destroy/abort, in-place or out-of-place allreduce, rank
and count queries, and error strings. Nothing here touches a GPU until
:meth:`NCCLLibrary.comm_init_rank` or :meth:`NCCLLibrary.all_reduce` is
called, so the library can be loaded and its version read on a machine
without a CUDA device (NCCL initialises CUDA lazily).

Where the library comes from, first match wins:

1. ``THEANOMPI_EXT_NCCL_LIB`` (a path to ``libnccl.so*``), when set. An
   explicit setting beats the wheel so a site build (say, one matched to
   the cluster's InfiniBand plugin) can be chosen even where the wheel is
   installed; a set but missing path is an error, not a silent fallback.
2. The ``nvidia-nccl-cu12`` wheel (``pip install theanompi_ext[gpu]``) or
   ``nvidia-nccl-cu13`` (``[gpu-cu13]``, for CUDA 13 drivers); both put it
   at ``<site-packages>/nvidia/nccl/lib/libnccl.so.2``.
3. ``ctypes.util.find_library('nccl')`` (a system install on the loader path).
"""
import ctypes
import ctypes.util
import os

from ..errors import NCCLError, NCCLUnavailable

ENV_LIB = 'THEANOMPI_EXT_NCCL_LIB'
# The wheels that ship libnccl, by CUDA major version.
NCCL_WHEELS = ('nvidia-nccl-cu12', 'nvidia-nccl-cu13')
SHORT_HINT = 'pip install theanompi_ext[gpu], or [gpu-cu13] for CUDA 13'
INSTALL_HINT = ('pip install theanompi_ext[gpu] (nvidia-nccl-cu12, CUDA 12) or '
                'theanompi_ext[gpu-cu13] (nvidia-nccl-cu13, CUDA 13), or point %s at '
                'a libnccl.so.2' % ENV_LIB)

# ncclDataType_t (nccl.h, stable since NCCL 2.0; bfloat16 added in 2.10).
NCCL_INT8, NCCL_UINT8, NCCL_INT32, NCCL_UINT32 = 0, 1, 2, 3
NCCL_INT64, NCCL_UINT64, NCCL_FLOAT16, NCCL_FLOAT32 = 4, 5, 6, 7
NCCL_FLOAT64, NCCL_BFLOAT16 = 8, 9
# ncclRedOp_t (ncclAvg since NCCL 2.10).
NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN, NCCL_AVG = 0, 1, 2, 3, 4

UNIQUE_ID_BYTES = 128          # NCCL_UNIQUE_ID_BYTES in nccl.h


class _UniqueId(ctypes.Structure):
    # ncclUniqueId is `struct { char internal[128]; }`, passed by value to
    # ncclCommInitRank, so it must be a real Structure, not a char buffer.
    _fields_ = [('internal', ctypes.c_char * UNIQUE_ID_BYTES)]


def wheel_library_path():
    """Path of ``libnccl.so.2`` inside an installed NCCL wheel (cu12 or cu13), or None."""
    try:
        import nvidia.nccl as pkg   # a namespace package: no __file__, use __path__
    except Exception:
        return None
    for root in list(getattr(pkg, '__path__', [])):
        path = os.path.join(root, 'lib', 'libnccl.so.2')
        if os.path.exists(path):
            return path
    return None


def installed_wheel():
    """``(name, version)`` of the installed NCCL wheel, or None (cu12 first)."""
    import importlib.metadata
    for name in NCCL_WHEELS:
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def system_library_path():
    """What ``ctypes.util.find_library('nccl')`` finds, or None."""
    try:
        return ctypes.util.find_library('nccl')
    except Exception:   # find_library shells out to ldconfig/gcc; never fatal
        return None


def find_library():
    """Return ``(path, source)`` of the NCCL library to load.

    ``source`` is ``'env'``, ``'wheel'`` or ``'system'``. Raises
    :class:`NCCLUnavailable` naming what to install when nothing is found,
    or naming the bad path when ``THEANOMPI_EXT_NCCL_LIB`` points nowhere.
    """
    env = os.environ.get(ENV_LIB)
    if env:
        if not os.path.exists(env):
            raise NCCLUnavailable('%s=%s does not exist; unset it to use the '
                                  'NCCL wheel (%s)' % (ENV_LIB, env, INSTALL_HINT))
        return env, 'env'
    path = wheel_library_path()
    if path:
        return path, 'wheel'
    path = system_library_path()
    if path:
        return path, 'system'
    raise NCCLUnavailable('libnccl not installed: no NCCL wheel, %s unset, '
                          'and no libnccl on the loader path (%s)' % (ENV_LIB, INSTALL_HINT))


def decode_version(code):
    """(major, minor, patch) from ncclGetVersion's integer.

    NCCL >= 2.9 encodes ``major*10000 + minor*100 + patch``; older releases
    used ``major*1000 + minor*100 + patch``.
    """
    code = int(code)
    if code >= 10000:
        return code // 10000, (code % 10000) // 100, code % 100
    return code // 1000, (code % 1000) // 100, code % 100


class NCCLLibrary(object):
    """The loaded library with typed entry points; see module docstring."""

    def __init__(self, path=None):
        if path is None:
            path, self.source = find_library()
        else:
            self.source = 'given'
        self.path = path
        try:
            self._lib = ctypes.CDLL(path)
        except OSError as exc:
            raise NCCLUnavailable('cannot load NCCL from %s: %s (%s)' % (path, exc, INSTALL_HINT))
        self._bind()
        self.version = self.get_version()

    def _bind(self):
        lib = self._lib
        c_int_p = ctypes.POINTER(ctypes.c_int)
        vp = ctypes.c_void_p
        self._sig('ncclGetVersion', [c_int_p])
        self._sig('ncclGetUniqueId', [ctypes.POINTER(_UniqueId)])
        self._sig('ncclCommInitRank', [ctypes.POINTER(vp), ctypes.c_int, _UniqueId, ctypes.c_int])
        self._sig('ncclAllReduce', [vp, vp, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, vp, vp])
        self._sig('ncclCommDestroy', [vp])
        self._sig('ncclCommAbort', [vp])
        self._sig('ncclCommCount', [vp, c_int_p])
        self._sig('ncclCommUserRank', [vp, c_int_p])
        self._sig('ncclCommCuDevice', [vp, c_int_p])
        self._sig('ncclCommGetAsyncError', [vp, c_int_p])
        lib.ncclGetErrorString.argtypes = [ctypes.c_int]
        lib.ncclGetErrorString.restype = ctypes.c_char_p
        # ncclGetLastError exists since NCCL 2.13; it carries the detail
        # (which peer, which syscall) that the generic string lacks.
        self._has_last_error = hasattr(lib, 'ncclGetLastError')
        if self._has_last_error:
            lib.ncclGetLastError.argtypes = [vp]
            lib.ncclGetLastError.restype = ctypes.c_char_p

    def _sig(self, name, argtypes):
        try:
            fn = getattr(self._lib, name)
        except AttributeError:
            if name in ('ncclCommGetAsyncError', 'ncclCommCuDevice', 'ncclCommAbort'):
                return   # optional in very old 2.x releases
            raise NCCLUnavailable('%s lacks %s: not a NCCL 2 library' % (self.path, name))
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int

    # -- errors -------------------------------------------------------------
    def error_string(self, code):
        """NCCL's text for a ncclResult_t code."""
        s = self._lib.ncclGetErrorString(int(code))
        return s.decode('utf-8', 'replace') if s else 'unknown error %d' % code

    def last_error(self, comm=None):
        """NCCL's detailed message of the last failure ('' if unavailable)."""
        if not self._has_last_error:
            return ''
        s = self._lib.ncclGetLastError(comm)
        return s.decode('utf-8', 'replace') if s else ''

    def check(self, func, code, comm=None):
        """Raise :class:`NCCLError` for a non-zero ncclResult_t."""
        if code != 0:
            msg = self.error_string(code)
            detail = self.last_error(comm)
            if detail:
                msg = '%s; %s' % (msg, detail)
            raise NCCLError(func, code, msg)

    # -- entry points --------------------------------------------------------
    def get_version(self):
        """(major, minor, patch) of the loaded library; needs no GPU."""
        v = ctypes.c_int()
        self.check('ncclGetVersion', self._lib.ncclGetVersion(ctypes.byref(v)))
        return decode_version(v.value)

    def version_string(self):
        """'2.28.9'-style version."""
        return '%d.%d.%d' % self.version

    def get_unique_id(self):
        """A fresh ncclUniqueId as 128 bytes (rank 0 makes it, MPI ships it)."""
        uid = _UniqueId()
        self.check('ncclGetUniqueId', self._lib.ncclGetUniqueId(ctypes.byref(uid)))
        # bytes(uid) keeps embedded NULs; uid.internal would stop at the first.
        return bytes(uid)

    def comm_init_rank(self, nranks, unique_id, rank):
        """Collective: every rank calls it with the same id; returns the comm handle."""
        unique_id = bytes(unique_id)
        if len(unique_id) != UNIQUE_ID_BYTES:
            raise ValueError('NCCL unique id must be %d bytes, got %d'
                             % (UNIQUE_ID_BYTES, len(unique_id)))
        uid = _UniqueId.from_buffer_copy(unique_id)
        comm = ctypes.c_void_p()
        self.check('ncclCommInitRank', self._lib.ncclCommInitRank(
            ctypes.byref(comm), int(nranks), uid, int(rank)))
        return comm

    def all_reduce(self, sendbuf, recvbuf, count, datatype, op, comm, stream):
        """Enqueue ncclAllReduce on ``stream`` (raw cudaStream_t int; 0 = legacy default)."""
        self.check('ncclAllReduce', self._lib.ncclAllReduce(
            ctypes.c_void_p(sendbuf), ctypes.c_void_p(recvbuf), ctypes.c_size_t(count),
            int(datatype), int(op), comm, ctypes.c_void_p(stream)), comm)

    def comm_destroy(self, comm):
        """Free a communicator after its pending work finished."""
        self.check('ncclCommDestroy', self._lib.ncclCommDestroy(comm))

    def comm_abort(self, comm):
        """Free a communicator, cancelling pending work (used on failure)."""
        fn = getattr(self._lib, 'ncclCommAbort', None)
        if fn is not None:
            self.check('ncclCommAbort', fn(comm))

    def _int_query(self, name, comm):
        fn = getattr(self._lib, name, None)
        if fn is None:
            return None
        v = ctypes.c_int()
        self.check(name, fn(comm, ctypes.byref(v)), comm)
        return v.value

    def comm_count(self, comm):
        """Number of ranks in ``comm``."""
        return self._int_query('ncclCommCount', comm)

    def comm_user_rank(self, comm):
        """This process's rank in ``comm``."""
        return self._int_query('ncclCommUserRank', comm)

    def comm_cu_device(self, comm):
        """CUDA device ordinal ``comm`` was created on (None if unbound)."""
        return self._int_query('ncclCommCuDevice', comm)

    def comm_async_error(self, comm):
        """ncclResult_t of an asynchronous failure (0 = none; None if unbound)."""
        fn = getattr(self._lib, 'ncclCommGetAsyncError', None)
        if fn is None:
            return None
        v = ctypes.c_int()
        # The query itself can fail only on a bad handle; report that too.
        self.check('ncclCommGetAsyncError', fn(comm, ctypes.byref(v)))
        return v.value


_CACHE = {}


def load_library(path=None):
    """Load (once per path) and return an :class:`NCCLLibrary`.

    Raises :class:`NCCLUnavailable` with an install hint when no library
    is found or it does not load.
    """
    if path is None:
        path, source = find_library()
    else:
        source = 'given'
    lib = _CACHE.get(path)
    if lib is None:
        lib = NCCLLibrary(path)
        lib.source = source
        _CACHE[path] = lib
    return lib
