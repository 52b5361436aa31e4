"""Device arrays as NCCL sees them: address, count, dtype, layout, stream.

Buffers are device arrays by contract, not by type: a CuPy ``ndarray``
(``.data.ptr``), a pygpu ``GpuArray`` on a CUDA context (``.gpudata``:
since pygpu 0.6.9 the address of the view itself, ``.offset`` already
included), or any object with ``__cuda_array_interface__``. An in-place
float32 sum needs them float32 and C-contiguous. A numpy array is refused
with a ``TypeError`` (host memory belongs to the ``mpi`` backend).
"""
import numpy as np


class DeviceBuffer(object):
    """What a collective needs to know about a device array.

    ``ptr`` (int, offset included), ``count`` (elements), ``dtype`` (numpy
    dtype), ``contiguous`` (C order), ``kind`` ('cupy', 'pygpu', 'cai'),
    ``device`` (CUDA ordinal or None when unknown), ``stream`` (raw stream
    handle the producer used, from ``__cuda_array_interface__`` v3, or None),
    ``readonly``.
    """
    __slots__ = ('ptr', 'count', 'dtype', 'contiguous', 'kind', 'device',
                 'stream', 'readonly')

    def __init__(self, ptr, count, dtype, contiguous, kind, device=None,
                 stream=None, readonly=False):
        self.ptr = int(ptr)
        self.count = int(count)
        self.dtype = np.dtype(dtype)
        self.contiguous = bool(contiguous)
        self.kind = kind
        self.device = device
        self.stream = stream
        self.readonly = bool(readonly)

    def __repr__(self):
        return ('DeviceBuffer(kind=%s, ptr=0x%x, count=%d, dtype=%s, contiguous=%s)'
                % (self.kind, self.ptr, self.count, self.dtype, self.contiguous))


def _type_name(obj):
    t = type(obj)
    mod = t.__module__
    return t.__name__ if mod == 'builtins' else '%s.%s' % (mod, t.__name__)


def _c_contiguous_strides(shape, itemsize):
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def _pygpu_contiguous(obj):
    flags = getattr(obj, 'flags', None)
    if flags is None:
        return True
    try:
        return bool(flags.c_contiguous)
    except AttributeError:
        return bool(flags['C_CONTIGUOUS'])   # pygpu < 0.7 returned a dict


def _pygpu_kind(obj):
    """The context kind (``'cuda'``, ``'opencl'``) of a pygpu array, else None.

    Asked before ``.gpudata``, which raises TypeError on an OpenCL array.
    """
    kind = getattr(getattr(obj, 'context', None), 'kind', None)
    if isinstance(kind, bytes):
        kind = kind.decode('ascii', 'replace')
    return kind


def is_device_array(obj):
    """True when ``obj`` looks like a GPU array this layer can address
    (a pygpu array on an OpenCL context is not: NCCL needs CUDA)."""
    if obj is None or isinstance(obj, np.ndarray):
        return False
    kind = _pygpu_kind(obj)
    if kind is not None:
        return kind == 'cuda'
    if hasattr(obj, 'gpudata'):
        return True
    data = getattr(obj, 'data', None)
    if data is not None and isinstance(getattr(data, 'ptr', None), int):
        return True
    return hasattr(obj, '__cuda_array_interface__')


def device_buffer(obj):
    """Describe a device array as a :class:`DeviceBuffer`.

    The pointer comes, by documented contract and in this order, from
    ``.gpudata`` (pygpu GpuArray on CUDA; the offset of a view is already
    in it), ``.data.ptr`` (CuPy ndarray) or ``__cuda_array_interface__``.
    Raises ``TypeError`` naming the type for anything else, e.g. a numpy
    array (host memory) or a pygpu array on an OpenCL context.
    """
    if isinstance(obj, np.ndarray):
        raise TypeError('NCCL allreduce needs a device array (CuPy ndarray, pygpu '
                        'GpuArray or an object with __cuda_array_interface__), got '
                        'numpy.ndarray in host memory; use the "mpi" backend for '
                        'host buffers')
    kind = _pygpu_kind(obj)
    if kind is not None or hasattr(obj, 'gpudata'):
        if kind is not None and kind != 'cuda':
            raise TypeError('pygpu array lives on an %s context; NCCL needs CUDA (use the '
                            'host-staged MPI path for it)' % kind)
        # pygpu >= 0.6.9: gpudata is the address of the view (base + offset);
        # adding .offset again would point past it for every view but the first.
        return DeviceBuffer(int(obj.gpudata), obj.size, obj.dtype, _pygpu_contiguous(obj),
                            'pygpu')
    data = getattr(obj, 'data', None)
    if data is not None and isinstance(getattr(data, 'ptr', None), int):
        dev = getattr(obj, 'device', None)
        dev_id = getattr(dev, 'id', None)
        flags = getattr(obj, 'flags', None)
        contiguous = bool(getattr(flags, 'c_contiguous', True))
        return DeviceBuffer(data.ptr, obj.size, obj.dtype, contiguous, 'cupy', device=dev_id)
    cai = getattr(obj, '__cuda_array_interface__', None)
    if isinstance(cai, dict):
        ptr, readonly = cai['data']
        shape = tuple(int(n) for n in cai['shape'])
        dtype = np.dtype(cai['typestr'])
        strides = cai.get('strides')
        count = int(np.prod(shape)) if shape else 1
        contiguous = (strides is None or count <= 1 or
                      tuple(strides) == _c_contiguous_strides(shape, dtype.itemsize))
        stream = cai.get('stream')
        # CAI v3: 0 is disallowed, None means "no synchronisation needed".
        stream = int(stream) if stream else None
        return DeviceBuffer(ptr or 0, count, dtype, contiguous, 'cai',
                            stream=stream, readonly=readonly)
    raise TypeError('NCCL allreduce needs a device array (CuPy ndarray, pygpu GpuArray '
                    'or an object with __cuda_array_interface__), got %s' % _type_name(obj))


def device_pointer(obj):
    """The device address (int) of a device array; see :func:`device_buffer`."""
    return device_buffer(obj).ptr


def float32_device_buffer(obj):
    """:func:`device_buffer`, refusing what an in-place float32 sum cannot use."""
    info = device_buffer(obj)
    if info.dtype != np.float32:
        raise TypeError('NCCL allreduce needs float32, got %s (%s)' % (info.dtype, _type_name(obj)))
    if not info.contiguous:
        raise ValueError('NCCL allreduce needs a C-contiguous buffer (copy it into a '
                         'contiguous bucket first), got a strided %s' % _type_name(obj))
    if info.readonly:
        raise ValueError('NCCL allreduce sums in place; the buffer is read-only')
    return info


__all__ = ['DeviceBuffer', 'device_buffer', 'device_pointer', 'float32_device_buffer',
           'is_device_array']
