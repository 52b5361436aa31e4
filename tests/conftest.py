"""Shared test set-up: one Theano compile cache, one BLAS thread, MPI helpers."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault('THEANOMPI_EXT_CACHE', os.path.join(ROOT, '.cache', 'theano'))
os.environ.setdefault('OMP_NUM_THREADS', '1')
os.environ.setdefault('OPENBLAS_NUM_THREADS', '1')
MPI_DIR = os.path.join(ROOT, 'tests', 'mpi')


def mpiexec():
    here = os.path.join(os.path.dirname(sys.executable), 'mpiexec')
    return here if os.path.exists(here) else 'mpiexec'


def run_mpi(nprocs, script, *args, timeout=300, env=None):
    """Run tests/mpi/<script> on ``nprocs`` ranks; a hang fails the test.

    Returns the CompletedProcess (stdout/stderr as text).
    """
    cmd = [mpiexec(), '-n', str(nprocs), sys.executable, os.path.join(MPI_DIR, script)]
    cmd += [str(a) for a in args]
    full_env = dict(os.environ)
    full_env.update(env or {})
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env=full_env, start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        pytest.fail('%d-rank %s hung for %ss:\n%s\n%s' % (nprocs, script, timeout,
                                                        exc.stdout, exc.stderr))


@pytest.fixture
def mpirun():
    """The :func:`run_mpi` helper as a fixture."""
    return run_mpi


def run_mpi_json(nprocs, script, *args, timeout=300, env=None):
    """:func:`run_mpi` that must exit 0; returns the JSON of the last stdout line."""
    import json
    res = run_mpi(nprocs, script, *args, timeout=timeout, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


# -- the OpenCL device (pygpu + pocl, `make gpu-deps`) ---------------------------
os.environ.setdefault('POCL_CACHE_DIR', os.path.join(ROOT, '.cache', 'pocl'))
OPENCL_DEVICE = 'opencl0:0'


def opencl_unavailable():
    """Why the OpenCL device cannot run here (None when it can), in a subprocess
    so that this process's Theano stays on the CPU."""
    code = '\n'.join([
        'import sys',
        'try:',
        '    import pygpu',
        'except ImportError as e:',
        '    sys.exit("pygpu is not installed (" + str(e) + ")")',
        'try:',
        '    pygpu.init(sys.argv[1])',
        'except Exception as e:',
        '    sys.exit("pygpu cannot open " + sys.argv[1] + ": " + str(e))'])
    res = subprocess.run([sys.executable, '-c', code, OPENCL_DEVICE], capture_output=True,
                         text=True)
    return None if res.returncode == 0 else (res.stderr.strip() or 'exit %d' % res.returncode)


@pytest.fixture(scope='session')
def opencl():
    """The OpenCL device string; skips without pygpu/pocl (`make gpu-deps`), but
    fails when the CI environment variable is set, so CI cannot skip silently."""
    why = opencl_unavailable()
    if why:
        msg = 'OpenCL device tests need `make gpu-deps` (root): %s' % why
        if os.environ.get('CI'):
            pytest.fail(msg + ' [CI is set: not skipping]')
        pytest.skip(msg)
    return OPENCL_DEVICE
