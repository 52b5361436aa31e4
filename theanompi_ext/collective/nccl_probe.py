"""Can the NCCL backend run here: libnccl, CuPy and a visible CUDA device.

:func:`probe` answers without raising (for ``info``, the strategy names
and the device step); :func:`import_cupy` and :func:`device_count` are the
same questions asked by the communicator, raising
:class:`~.nccl_lib.NCCLUnavailable` with what to install.
"""
from .nccl_lib import NCCLUnavailable, load_library, SHORT_HINT

CUPY_HINT = ('pip install cupy-cuda12x (CUDA 12) or cupy-cuda13x (CUDA 13), or '
             'theanompi_ext[gpu] / [gpu-cu13]')


def import_cupy():
    """The ``cupy`` module, or :class:`NCCLUnavailable` saying how to install it."""
    try:
        import cupy
    except Exception as exc:
        raise NCCLUnavailable('the NCCL backend needs CuPy for CUDA streams and events '
                              '(%s: %s): %s' % (type(exc).__name__, exc, CUPY_HINT))
    return cupy


def device_count(cp):
    """CUDA devices visible to CuPy module ``cp`` (>= 1), else :class:`NCCLUnavailable`."""
    try:
        n = cp.cuda.runtime.getDeviceCount()
    except Exception as exc:
        raise NCCLUnavailable('no CUDA device visible to this process (%s: %s)'
                              % (type(exc).__name__, exc))
    if n < 1:
        raise NCCLUnavailable('no CUDA device visible to this process '
                              '(check CUDA_VISIBLE_DEVICES)')
    return n



def probe(_cupy=None):
    """``(ok, reason)``: can the NCCL backend run here? Never raises."""
    try:
        try:
            lib = load_library()
        except NCCLUnavailable as exc:
            if 'not installed' in str(exc):
                return False, 'libnccl not installed (%s)' % SHORT_HINT
            return False, str(exc)
        ver = 'NCCL %s' % lib.version_string()
        try:
            cp = _cupy if _cupy is not None else import_cupy()
        except NCCLUnavailable:
            return False, '%s loaded but CuPy missing (%s)' % (ver, CUPY_HINT)
        try:
            n = device_count(cp)
        except NCCLUnavailable as exc:
            return False, '%s loaded but %s' % (ver, exc)
        return True, '%s from %s (%s), %d CUDA device(s)' % (ver, lib.path, lib.source, n)
    except Exception as exc:   # the promise: report, never raise
        return False, 'NCCL probe failed: %s: %s' % (type(exc).__name__, exc)


__all__ = ['CUPY_HINT', 'device_count', 'import_cupy', 'probe']
