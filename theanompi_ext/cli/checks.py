"""The checks behind ``theanompi-ext info``, each run in a fresh interpreter as a rank is.

``python -m theanompi_ext.cli.checks REPORT CHECK [DEVICE]`` runs one check
and appends one JSON line per stage to the file REPORT: ``{"stage", "ok",
"why", "info", "rank"}``. :mod:`.probes` starts these children, bounds them
in time and reads the file back: a file, not stdout, because under
``mpiexec`` the ranks' output interleaves, and Theano, pocl or MPI may
print there. Every stage of a check is reported, a stage after a failed one
with the failure's reason.

Each check goes through the functions a training run uses:

``mpi`` (started by :mod:`.info` under ``mpiexec -n 2``)
    ``import``: mpi4py imports; ``init``: the ``mpi`` communicator starts
    MPI; ``allreduce``: its communication thread sums a buffer across the
    ranks, and small objects are gathered.
``engine DEVICE``
    ``import``: the engine loads on DEVICE (Theano, and on a device its
    gpuarray backend with everything that imports, pkg_resources included);
    ``compute``: a function is compiled and run on a small shared array,
    and the results are copied back and checked. On a device also
    ``staged``: MPI starts and the host-staged exchanger sums a device
    gradient through host memory (one rank: the copies are real, the sum is
    the rank's own); on CUDA also ``collectives``: the ``pygpu-nccl``
    backend is built on the device's context and sums a device array.
``devices``
    ``import``: pygpu imports; ``list``: the CUDA and OpenCL devices it
    sees, opening none.
``nccl``
    ``probe``: :func:`theanompi_ext.collective.nccl_probe.probe` (libnccl,
    CuPy, a CUDA device).
"""
import json
import os
import sys

import numpy as np

from ..collective.world import launcher_rank_size

#: What an engine check computes on a shared array holding 0, 1, 2, 3 and an
#: input of ones: ``s * x + x``, and ``s`` updated to ``s + x``; both are 1..4.
EXPECTED = np.arange(1, 5, dtype=np.float32)


def reason(exc):
    """One line saying why: ``Type: first line of the message`` (tracebacks and
    compilers' logs stay out of a report line)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = '%s: %s' % (type(exc).__name__, lines[0]) if lines else type(exc).__name__
    return text if len(text) <= 300 else text[:297] + '...'


class Reporter(object):
    """Appends the stage reports of one process (rank ``rank``) to ``path``."""

    def __init__(self, path, rank=0):
        self.path, self.rank = path, rank

    def write(self, stage, ok, why=None, info=None):
        """Report ``stage``: ``ok``, the reason ``why``, details ``info`` (a dict)."""
        line = json.dumps({'stage': stage, 'ok': bool(ok), 'why': why, 'info': info or {},
                           'rank': self.rank}) + '\n'
        # One write on a file opened for appending: the ranks' lines stay whole.
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode('utf-8'))
        finally:
            os.close(fd)

    def run(self, stage, fn, *args):
        """Run ``fn(*args)`` (it returns the info dict) and report it; returns the
        reason it failed, or None."""
        try:
            info = fn(*args)
        except Exception as exc:  # noqa: B902 - any failure is the report
            why = reason(exc)
            self.write(stage, False, why)
            return why
        self.write(stage, True, None, info)
        return None

    def chain(self, stages, why=None):
        """Run ``[(stage, fn, args...)]`` in order; once one fails, the rest are
        reported failed with its reason (``why``: failed before the first)."""
        for stage, fn, *args in stages:
            if why is None:
                why = self.run(stage, fn, *args)
            else:
                self.write(stage, False, why)
        return why


def _check_values(what, got, expected):
    got = np.asarray(got)
    if got.shape != expected.shape or not np.allclose(got, expected):
        raise RuntimeError('%s: got %s, expected %s' % (what, got, expected))


# -- mpi ----------------------------------------------------------------------------

def check_mpi(rep):
    """The ``mpi`` backend: mpi4py, MPI's start, a sum across the ranks."""
    held = {}

    def imported():
        from ..collective.mpi import mpi4py_version
        return {'mpi4py': mpi4py_version()}

    def init():
        from ..collective.mpi import library_version, thread_level
        from ..collective.registry import create_communicator
        held['comm'] = comm = create_communicator('mpi')
        return {'library': library_version(), 'thread_level': thread_level(),
                'ranks': comm.size}

    def allreduce():
        comm = held['comm']
        try:
            buf = np.full(4, comm.rank + 1, np.float32)
            # the training path: started, summed by the communication thread, waited for
            comm.start_allreduce(buf, name='info').wait()
            _check_values('sum over %d ranks' % comm.size, buf,
                          np.full(4, comm.size * (comm.size + 1) / 2, np.float32))
            ranks = comm.allgather(comm.rank)
            if ranks != list(range(comm.size)):
                raise RuntimeError('allgather gave %r' % (ranks,))
        finally:
            comm.close()
        return {'ranks': comm.size}

    rep.chain([('import', imported), ('init', init), ('allreduce', allreduce)])


# -- engine -------------------------------------------------------------------------

def engine_stages(device):
    """The stages of ``engine DEVICE``, in order."""
    return (('import', 'compute') + (() if device == 'cpu' else ('staged',))
            + (('collectives',) if device.startswith('cuda') else ()))


def _import_engine(device):
    from ..engine.devices import configure
    configure(device)
    from ..engine import core
    return {'theano': core.version(), 'floatX': core.floatX,
            'compiledir': core.theano.config.base_compiledir}


def _compute():
    from ..engine import core
    x = core.T.fvector('x')
    s = core.shared(np.arange(4, dtype=np.float32), name='info_s')
    f = core.function([x], s * x + x, updates=[(s, s + x)])
    out = f(np.ones(4, np.float32))
    if core.on_device():
        stored = core.device_value(s)
        # Theano would otherwise have run this on the host without saying so
        if type(stored).__module__.split('.')[0] != 'pygpu':
            raise RuntimeError('the shared array is a %s, not a device array'
                               % type(stored).__name__)
    _check_values('s * x + x', out, EXPECTED)
    _check_values('s after s += x', core.device_value(s), EXPECTED)
    return {}


def _staged():
    from ..buckets.plan import Bucket
    from ..collective.registry import create_communicator
    from ..engine import core
    from ..exchange.staged import HostStagedExchanger
    comm = create_communicator('mpi')
    try:
        n = 8
        values = np.arange(n, dtype=np.float32)
        grads = core.device_zeros(n)
        grads.write(values)
        HostStagedExchanger(comm, [Bucket(0, 0, 1, 0, n)], n).reduce(grads)
        _check_values('device gradient after the host-staged sum', grads, values * comm.size)
    finally:
        comm.close()
    return {'ranks': comm.size}


def _collectives():
    from ..collective.registry import create_communicator
    from ..engine import core
    comm = create_communicator('pygpu-nccl', context=core.device_context())
    try:
        buf = core.device_zeros(4)
        buf.write(np.ones(4, np.float32))
        comm.allreduce(buf)
        _check_values('pygpu-nccl sum', buf, np.full(4, comm.size, np.float32))
    finally:
        comm.close()
    return {}


def check_engine(rep, device):
    """The engine on ``device``, then its exchange paths (module docstring)."""
    steps = {'import': (_import_engine, device), 'compute': (_compute,),
             'staged': (_staged,), 'collectives': (_collectives,)}
    rep.chain([(stage,) + steps[stage] for stage in engine_stages(device)])


# -- devices, nccl ------------------------------------------------------------------

def _import_pygpu():
    import pygpu
    return {'pygpu': pygpu.__version__}


def _list_devices():
    import pygpu.gpuarray as ga
    found, failed = [], []
    for kind in ('cuda', 'opencl'):
        try:
            platforms = ga.count_platforms(kind)
            names = (['cuda%d' % d for d in range(ga.count_devices(kind, 0))] if kind == 'cuda'
                     else ['opencl%d:%d' % (p, d) for p in range(platforms)
                           for d in range(ga.count_devices(kind, p))])
        except Exception as exc:  # noqa: B902 - pygpu raises its own types, bytes messages
            msg = exc.args[0] if exc.args else exc
            failed.append([kind, msg.decode('utf-8', 'replace') if isinstance(msg, bytes)
                           else str(msg)])
            continue
        found.extend(names)
    return {'devices': found, 'failed': failed}


def check_devices(rep):
    """pygpu and the devices it lists."""
    rep.chain([('import', _import_pygpu), ('list', _list_devices)])


def check_nccl(rep):
    """Can the NCCL backend run here (:func:`~theanompi_ext.collective.nccl_probe.probe`)."""
    from ..collective.nccl_probe import probe
    ok, why = probe()
    rep.write('probe', ok, why)


CHECKS = {'mpi': check_mpi, 'engine': check_engine, 'devices': check_devices,
          'nccl': check_nccl}


def main(argv=None):
    """``REPORT CHECK [ARGS]``: run one check, reporting to the file REPORT."""
    argv = sys.argv[1:] if argv is None else argv
    path, check, args = argv[0], argv[1], argv[2:]
    # The launcher's variables: the rank is known before MPI starts (or if it cannot).
    rank, _ = launcher_rank_size()
    CHECKS[check](Reporter(path, rank), *args)
    return 0


if __name__ == '__main__':
    sys.exit(main())
