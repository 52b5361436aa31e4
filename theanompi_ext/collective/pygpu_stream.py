"""The CUDA stream of a pygpu context (where Theano's GPU kernels run).

Theano's ``gpuarray`` backend queues every kernel of a compiled function on
one stream of its pygpu context (Theano's default ``gpuarray.single_stream``).
An NCCL allreduce on its own stream that must start after a backward
chunk records an event on *that* stream, so :class:`~.nccl.NCCLCommunicator`
needs its handle (``compute_stream=``). pygpu does not expose it in
Python; libgpuarray does, as its ``cuda_get_stream`` extension
(``gpuarray/ext_cuda.h``: ``CUstream cuda_get_stream(gpucontext *)``),
called with the context's raw pointer (``GpuContext.ptr``).

Written to libgpuarray 0.7's header; the lookup is tested on this
machine's libgpuarray, the call itself needs a CUDA context (not yet run
on a GPU).
"""
import ctypes
import ctypes.util

LIBGPUARRAY_NAMES = ('libgpuarray.so.3', 'libgpuarray.so')


def _context_kind(ctx):
    kind = getattr(ctx, 'kind', None)
    return kind.decode('ascii', 'replace') if isinstance(kind, bytes) else kind


def load_libgpuarray(names=LIBGPUARRAY_NAMES):
    """The libgpuarray shared library (already loaded by pygpu; ctypes shares it)."""
    found = ctypes.util.find_library('gpuarray')
    errors = []
    for name in tuple(names) + ((found,) if found else ()):
        try:
            return ctypes.CDLL(name)
        except OSError as exc:
            errors.append(str(exc))
    raise OSError('libgpuarray not found (%s); it comes with pygpu (make gpu-deps)'
                  % '; '.join(errors))


def cuda_get_stream_function(lib=None):
    """libgpuarray's ``cuda_get_stream`` extension as a ctypes function."""
    lib = lib if lib is not None else load_libgpuarray()
    get_extension = lib.gpuarray_get_extension
    get_extension.restype = ctypes.c_void_p
    get_extension.argtypes = [ctypes.c_char_p]
    addr = get_extension(b'cuda_get_stream')
    if not addr:
        raise OSError('this libgpuarray has no cuda_get_stream extension (built without CUDA)')
    return ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(addr)


def context_stream(ctx, get_stream=None):
    """The raw ``CUstream`` (int) on which pygpu context ``ctx`` runs its kernels.

    Refuses a context that is not CUDA (OpenCL has no CUDA stream) by name.
    ``get_stream``: the ``cuda_get_stream`` function (tests inject one).
    """
    kind = _context_kind(ctx)
    if kind != 'cuda':
        raise TypeError('the pygpu context is %s, not CUDA: it has no CUDA stream for NCCL '
                        'to wait on' % (kind,))
    fn = get_stream if get_stream is not None else cuda_get_stream_function()
    stream = fn(int(ctx.ptr))
    # NULL is CUDA's legacy default stream: valid, and CuPy names it 0 too.
    return int(stream or 0)
