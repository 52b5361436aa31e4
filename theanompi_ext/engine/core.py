"""The one module that imports Theano.

Every other module gets Theano through here (``from theanompi_ext.engine.core
import theano, T``), so that the engine's configuration lives in one place
and no user has to set ``THEANO_FLAGS`` by hand:

* ``floatX=float32`` (the dtype the collectives and buffers assume);
* ``blas.ldflags=`` (empty): Theano 1.0.5 cannot read numpy 1.23's BLAS
  config and would otherwise fail; it then uses its NumPy C-API BLAS,
  measured within 15% of linking OpenBLAS directly;
* ``base_compiledir``: ``$THEANOMPI_EXT_CACHE`` or ``~/.cache/theanompi_ext``
  instead of ``~/.theano``;
* Python 3.11 cannot build the C extension of ``scan``
  (``longintrepr.h`` is gone), so we make Theano fall back to Python scan;
* ``device``: the one :func:`theanompi_ext.engine.devices.configure` chose
  (``cpu`` by default); on a device also ``dnn.enabled=False`` (Theano
  1.0.5 knows cuDNN only up to v7; convolutions use GpuCorrMM), on OpenCL
  ``optimizer_excluding`` keeping the fused crossentropy(softmax) op on the
  host (its kernel does not build there, :data:`.flags.OPENCL_EXCLUDED`), and the
  device must open: else :class:`~theanompi_ext.errors.DeviceError`
  naming it and why.

Flags the user did set in ``THEANO_FLAGS`` or in a ``.theanorc`` win over these
defaults, except ``device``, which is the project's ``--device`` option
(:mod:`theanompi_ext.engine.flags`, which does this without importing
Theano, for the launching side).
"""
import os
import sys
import warnings

from ..errors import DeviceError
from .devices import configured as _configured_device
from .flags import cache_dir as _cache_dir, merged_flags as _merged_flags


def _configure_and_import():
    os.environ['THEANO_FLAGS'] = _merged_flags(os.environ.get('THEANO_FLAGS', ''))
    # Python 3.11: the scan C extension cannot compile; None makes the
    # import fail fast so Theano uses its pure-Python scan.
    sys.modules.setdefault('theano.scan_module.scan_perform_ext', None)
    import logging
    # The NumPy C-API BLAS warning is expected with blas.ldflags empty.
    logging.getLogger('theano.tensor.blas').setLevel(logging.ERROR)
    # Ranks sharing one compile cache wait on its lock; that is expected.
    logging.getLogger('theano.gof.compilelock').setLevel(logging.WARNING)
    # A device that fails to open is our DeviceError below, not Theano's traceback.
    # Theano's GPU backend imports pkg_resources (kept by the setuptools pin,
    # constraints.txt), which warns on every rank, also when imported later.
    warnings.filterwarnings('ignore', message='pkg_resources is deprecated',
                            category=UserWarning, module=r'theano\.')
    logging.getLogger('theano.gpuarray').setLevel(logging.CRITICAL)
    if _configured_device().startswith('opencl'):
        # pocl compiles its kernels once per cache (~40 s for CLBlast's first call).
        # One folder per local rank: two ranks building the same kernel at once
        # into one folder failed (clBuildProgram: Unknown error).
        from ..collective.world import local_rank   # at import, no comm: the launcher's variables
        base = os.environ.get('POCL_CACHE_DIR') or os.path.join(_cache_dir(), 'pocl')
        os.environ['POCL_CACHE_DIR'] = os.path.join(base, 'rank%d' % (local_rank() or 0))
        # pocl's CPU device: one thread per rank unless told (as for BLAS).
        if os.environ.get('OMP_NUM_THREADS'):
            os.environ.setdefault('POCL_MAX_PTHREAD_COUNT', os.environ['OMP_NUM_THREADS'])
    from ..collective.world import starting_mpi   # Theano's import starts MPI
    with warnings.catch_warnings(), starting_mpi():
        warnings.simplefilter('ignore')
        import theano as _theano
        import theano.tensor as _T
        import theano.tensor.nnet  # noqa: F401  (conv2d, softmax)
        import theano.tensor.signal.pool  # noqa: F401
    _stable_cache_keys(_theano)
    _check_compiler(_theano)
    _check_device(_theano)
    return _theano, _T


def _check_compiler(theano_module):
    """Raise CompilerProbeFailed where Theano's import decided on no C++ compiler
    though the user did not ask for none and ``g++`` is on PATH.

    Theano runs ``g++ -v`` once at import and, if that fails for any reason (a
    signal to the process group killed it, a full process table), quietly
    falls back to its Python implementations for the whole process: one rank
    then computes slower and with other roundings than the rest.
    """
    import shutil
    config = theano_module.config
    if config.cxx or not type(config).cxx.is_default:
        return
    gxx = shutil.which('g++')
    if gxx:
        from ..errors import CompilerProbeFailed
        raise CompilerProbeFailed(
            "Theano's import found no C++ compiler, though %s is there: its probe "
            "(`g++ -v`) failed in this process (pid %d), which would run Theano's slow "
            "Python implementations, with other roundings than the other ranks. Run it "
            "again; to run without C code on purpose, set THEANO_FLAGS=cxx=" % (gxx, os.getpid()))


def _stable_cache_keys(theano_module):
    """Let Theano 1.0.5's compile cache serve every process, not only the one
    that compiled: two of its cache keys change from process to process.

    * ``COp.c_code_cache_version`` is ``hash()`` of the op's C source, and
      Python 3 salts ``hash()`` of a string per process: each process compiled
      its own copy of every such op (DimShuffle; most GPU ops) and added it to
      the cache, whose scan at each start grew with it (measured: 0.85 s of
      g++ per process for DimShuffle alone, one more cache folder each time).
      A SHA-256 of the same source is the same in every process.
    * An op whose ``__props__`` is ``()`` (Softmax, Alloc) made its module's
      key "unversioned", compiled again in every process (0.8-0.9 s each),
      although its C code is versioned; the key still holds the op itself
      (equal to every other instance: it has no properties) and its types.
    """
    import hashlib
    cc, op = theano_module.gof.cc, theano_module.gof.op

    def c_code_cache_version(self):
        digest = hashlib.sha256('\0'.join(self.func_codes).encode('utf-8')).digest()
        version = (int.from_bytes(digest[:8], 'big', signed=True),)
        if hasattr(self, 'params_type'):
            version += (self.params_type.c_code_cache_version(),)
        return version
    op.COp.c_code_cache_version = c_code_cache_version

    theano_key = cc.CLinker.cmodule_key_

    def cmodule_key_(self, fgraph, no_recycling, *args, **kwargs):
        key = theano_key(self, fgraph, no_recycling, *args, **kwargs)
        if key is None or key[0]:
            return key
        version = []     # Theano's, without the empty __props__ it counts as unversioned
        for node in self.schedule(fgraph):
            if hasattr(node.op, 'c_code_cache_version_apply'):
                version.append(node.op.c_code_cache_version_apply(node))
            if getattr(node.op, '__props__', None):
                version.append(node.op.__props__)
            version += [v.type.c_code_cache_version() for v in node.inputs + node.outputs]
        return (tuple(version), key[1]) if all(version) else key
    cc.CLinker.cmodule_key_ = cmodule_key_


def _check_device(theano_module):
    """Raise DeviceError unless Theano opened the configured device."""
    dev = _configured_device()
    if dev == 'cpu':
        return
    if getattr(theano_module, 'gpuarray', None) is not None and \
            theano_module.gpuarray.pygpu_activated:
        return
    raise DeviceError('cannot open device %s: %s' % (dev, open_failure(dev)))


def open_failure(dev):
    """Why pygpu cannot open ``dev`` (a short sentence), or None if it can."""
    try:
        import pygpu
    except ImportError as exc:
        return ('pygpu is not installed (%s); `make gpu-deps` as root installs it '
                '(docs/gpu.md)' % exc)
    try:
        pygpu.init(dev)
    except Exception as exc:  # noqa: B902 - pygpu raises several types
        msg = exc.args[0] if exc.args else exc
        if isinstance(msg, bytes):
            msg = msg.decode('utf-8', 'replace')
        return '%s (%s)' % (msg, type(exc).__name__)
    return None


theano, T = _configure_and_import()
floatX = theano.config.floatX


def version():
    """Theano's version string."""
    return theano.__version__


def device():
    """The device Theano computes on (``cpu``, ``cuda0``, ``opencl0:0``...)."""
    return _configured_device()


def on_device():
    """True when Theano computes on a GPU-backend device (not the host)."""
    return device() != 'cpu'


def function(inputs, outputs, updates=None, name=None, excluding=(),
             device_inputs=(), device_outputs=(), no_default_updates=False):
    """Compile a Theano function (thin wrapper so callers never import theano).

    ``excluding`` names graph optimisations (tags) to leave out of the
    default mode, e.g. ``('inplace_elemwise_optimizer',)``.

    On a device, the float32 variables of ``inputs`` that are in
    ``device_inputs`` take device arrays (an intermediate variable is cut
    there, as a host input would be), and the float32 ``outputs`` in
    ``device_outputs`` are returned as device arrays the caller borrows
    (valid until the next call). On the host both are ignored.

    ``no_default_updates``: shared variables' default updates (random
    generator states, Lasagne's BN running statistics) are not applied,
    for functions that re-read a graph another function already ran.
    """
    mode = theano.compile.mode.get_default_mode().excluding(*excluding) if excluding else None
    givens = None
    if on_device() and (device_inputs or device_outputs):
        inputs, givens = _device_inputs(inputs, device_inputs)
        outputs = _device_outputs(outputs, device_outputs)
    return theano.function(inputs, outputs, updates=updates, name=name, mode=mode,
                           givens=givens, allow_input_downcast=True, on_unused_input='ignore',
                           no_default_updates=no_default_updates)


def _on_device(v, chosen):
    return any(v is c for c in chosen) and getattr(v, 'dtype', None) == 'float32'


def _device_inputs(inputs, chosen):
    from theano.gpuarray.type import GpuArrayType
    from theano.gpuarray.basic_ops import host_from_gpu
    new, givens = [], []
    for v in inputs:
        if _on_device(v, chosen):
            d = GpuArrayType('float32', v.broadcastable)(v.name)
            givens.append((v, host_from_gpu(d)))
            new.append(d)
        else:
            new.append(v)
    return new, givens


def _device_outputs(outputs, chosen):
    from theano.gpuarray.basic_ops import as_gpuarray_variable
    return [theano.Out(as_gpuarray_variable(v, None), borrow=True) if _on_device(v, chosen)
            else v for v in outputs]


def device_context():
    """The pygpu context of the device (None on the host)."""
    if not on_device():
        return None
    from theano.gpuarray.type import get_context
    return get_context(None)


def device_zeros(size):
    """A zero float32 vector of ``size`` on the device."""
    import pygpu
    return pygpu.gpuarray.zeros((int(size),), dtype='float32', context=device_context())


def device_value(var):
    """A shared variable's own storage (a device array on a device; no copy)."""
    return var.get_value(borrow=True, return_internal_type=True)


def shared(value, name=None, borrow=False):
    """Create a Theano shared variable."""
    return theano.shared(value, name=name, borrow=borrow)


def conv2d(x, w, border_mode, stride):
    """2-D convolution, NCHW input and (out, in, kh, kw) filters."""
    return T.nnet.conv2d(x, w, border_mode=border_mode, subsample=stride,
                         filter_flip=False)


def pool2d(x, size, stride, pad, mode):
    """Max or average pooling (mode 'max' or 'average_exc_pad')."""
    return theano.tensor.signal.pool.pool_2d(
        x, ws=size, stride=stride, pad=pad, ignore_border=True, mode=mode)


def grad(cost, wrt, known_grads=None, stop_at=None):
    """Symbolic gradients of ``cost`` (or of ``known_grads`` pushed back when
    ``cost`` is None) with respect to the variables ``wrt``; ``stop_at``:
    variables the gradient is not pushed back through (their own gradient
    is still computed)."""
    return theano.grad(cost, wrt, known_grads=known_grads, consider_constant=stop_at)


def graph_inputs(outputs):
    """The root variables (symbolic inputs, shared variables, constants) of ``outputs``."""
    from theano.gof import graph
    return graph.inputs(outputs)


def toposort(outputs):
    """Apply nodes computing ``outputs`` from the graph's roots, inputs first."""
    from theano.gof import graph
    return graph.io_toposort(graph.inputs(outputs), outputs)
