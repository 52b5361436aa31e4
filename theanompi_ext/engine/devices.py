"""Device strings, which device a rank takes, and telling the engine before Theano loads.

Device strings are Theano-MPI's (and Theano's): ``cpu`` (also ``cpu0``,
``cpu1``..., all the host), ``cuda`` / ``cuda0``, ``cuda1``... and
``openclP:D`` (OpenCL platform P, device D; ``opencl0:0`` is pocl's CPU
device on a machine without a GPU). A list (``cuda0,cuda1``, as Theano-MPI
writes ``DEVICES=`` in its session files) gives one device per rank: rank r
takes entry r, or, when MPI says how many ranks share this host, entry
``local rank`` (the same list on every host). A list of one is every rank's.

Nothing here imports Theano: :func:`configure` must run before the first
``import theanompi_ext.engine.core``, which reads :data:`ENV_VAR`.
"""
import os
import re

from ..errors import DeviceError

ENV_VAR = 'THEANOMPI_EXT_DEVICE'
_PATTERN = re.compile(r'^(cpu\d*|cuda\d*|opencl\d+:\d+)$')
# What MPI implementations export as the rank's index on its host.
_LOCAL_RANK_VARS = ('OMPI_COMM_WORLD_LOCAL_RANK', 'MPI_LOCALRANKID', 'MV2_COMM_WORLD_LOCAL_RANK',
                    'SLURM_LOCALID')


def parse_device(name):
    """The canonical form of one device string (``cpuN`` -> ``cpu``); DeviceError if unknown."""
    s = str(name).strip().lower()
    if not _PATTERN.match(s):
        raise DeviceError('unknown device %r: use cpu, cuda0, cuda1, ... or openclP:D '
                          '(e.g. opencl0:0)' % (name,))
    return 'cpu' if s.startswith('cpu') else s


def parse_device_list(text):
    """``'cuda0,cuda1'`` (or a list) -> validated canonical list (at least one)."""
    items = text if isinstance(text, (list, tuple)) else str(text).split(',')
    out = [parse_device(d) for d in items if str(d).strip()]
    if not out:
        raise DeviceError('no device given (e.g. cpu, cuda0,cuda1 or opencl0:0)')
    return out


def local_rank():
    """This process's index among the ranks on its host, if MPI said (else None)."""
    for var in _LOCAL_RANK_VARS:
        v = os.environ.get(var, '')
        if v.isdigit():
            return int(v)
    return None


def device_for_rank(devices, rank, local=None):
    """The device rank ``rank`` takes from the list ``devices`` (see module docstring)."""
    devs = parse_device_list(devices)
    if len(devs) == 1:
        return devs[0]
    i = local if local is not None else rank
    if not 0 <= i < len(devs):
        raise DeviceError('rank %d has no device: the list %s names %d' % (
            rank, ','.join(devs), len(devs)))
    return devs[i]


def configured():
    """The device the engine will use (``cpu`` unless :func:`configure` chose one)."""
    return parse_device(os.environ.get(ENV_VAR) or 'cpu')


def configure(device):
    """Make ``device`` the engine's device; must come before the engine is imported.

    Raises DeviceError if the engine is already loaded on another device.
    """
    import sys
    dev = parse_device(device)
    engine = sys.modules.get('theanompi_ext.engine.core')
    if engine is not None and engine.device() != dev:
        raise DeviceError('cannot switch to device %s: Theano is already loaded on %s in '
                          'this process' % (dev, engine.device()))
    os.environ[ENV_VAR] = dev
    return dev
