"""Shared test set-up: one Theano compile cache, one BLAS thread, the fixtures.

The helpers themselves are in tests/support/ (importable as ``support``:
pytest puts this file's folder on ``sys.path``).
"""
import os
import signal

import pytest

from theanompi_ext.launch.mpiexec import MPI_ENV_DEFAULTS
from support.opencl import OPENCL_DEVICE, opencl_unavailable
from support.paths import ROOT
from support.procs import run_mpi

# Python's default buffering, a user's: a machine's PYTHONUNBUFFERED (this one
# sets it) would hide what only a block-buffered process loses or delays.
# Tests of both modes set it themselves.
os.environ.pop('PYTHONUNBUFFERED', None)
os.environ.setdefault('THEANOMPI_EXT_CACHE', os.path.join(ROOT, '.cache', 'theano'))
os.environ.setdefault('OMP_NUM_THREADS', '1')
os.environ.setdefault('OPENBLAS_NUM_THREADS', '1')
os.environ.setdefault('POCL_CACHE_DIR', os.path.join(ROOT, '.cache', 'pocl'))
# The tests also start mpiexec themselves, as a user would: with what the
# project gives its own mpiexec (Open MPI run as root, docs/openmpi.md).
for _var, _value in MPI_ENV_DEFAULTS.items():
    os.environ.setdefault(_var, _value)


# A suite run under nohup (as CI may be) has SIGHUP ignored, and every job a test
# starts would inherit that: the launcher keeps an ignored stop signal ignored, so
# the tests that send SIGHUP (a terminal's hangup) hung for their 180 s. A handler
# of our own instead: the suite still outlives a hangup, and a child starts with the
# default (exec resets a handled signal, not an ignored one).
if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
    signal.signal(signal.SIGHUP, lambda signum, frame: None)


def pytest_collection_modifyitems(config, items):
    """Tests marked ``root`` skip, with the reason, for a user without root."""
    if os.geteuid() == 0:
        return
    skip = pytest.mark.skip(reason='needs root (mount, network namespaces); CI runs it as '
                            'root: make test-root')
    for item in items:
        if item.get_closest_marker('root'):
            item.add_marker(skip)


@pytest.fixture
def mpirun():
    """:func:`support.procs.run_mpi` as a fixture."""
    return run_mpi


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
