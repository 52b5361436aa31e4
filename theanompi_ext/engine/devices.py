"""Device strings and lists, which device a rank takes, and telling the engine before Theano loads.

Device strings are Theano-MPI's (and Theano's): ``cpu`` (also ``cpu0``,
``cpu1``..., all the host), ``cuda`` / ``cuda0``, ``cuda1``... and
``openclP:D`` (OpenCL platform P, device D; ``opencl0:0`` is pocl's CPU
device on a machine without a GPU). A list (``cuda0,cuda1``, as Theano-MPI
writes ``DEVICES=`` in its session files) gives one device per rank: rank r
takes entry r, or, when MPI says how many ranks share this host, entry
``local rank`` (the same list on every host). A list of one is every rank's.

Across nodes, Theano-MPI's ``DEVICES`` also names the hosts (its session
files, a bash array): ``("node0:cuda0" "node1:cuda0,cuda1")`` reaches us as
the list ``['node0:cuda0', 'node1:cuda0,cuda1']``: rank r takes the r-th
device in that order (``opencl0:0`` is a device, not a host ``opencl0``).
:func:`parse_devices` is the one parser of all these forms.

Nothing here imports Theano: :func:`configure` must run before the first
``import theanompi_ext.engine.core``, which reads :data:`ENV_VAR`.
"""
import os
import re

from ..errors import DeviceError

ENV_VAR = 'THEANOMPI_EXT_DEVICE'
_PATTERN = re.compile(r'^(cpu\d*|cuda\d*|opencl\d+:\d+)$')
# An entry starting so is an OpenCL device (its name holds a colon), not ``HOST:``.
_OPENCL = re.compile(r'^opencl\d+:', re.IGNORECASE)


def parse_device(name):
    """The canonical form of one device string (``cpuN`` -> ``cpu``); DeviceError if unknown."""
    s = str(name).strip().lower()
    if not _PATTERN.match(s):
        raise DeviceError('unknown device %r: use cpu, cuda0, cuda1, ... or openclP:D '
                          '(e.g. opencl0:0)' % (name,))
    return 'cpu' if s.startswith('cpu') else s


def parse_devices(value, hosts=True):
    """``[(host or None, device), ...]`` in rank order, from a string or a list.

    ``value``: ``'cuda0,cuda1'``, a list of such entries, or with ``hosts``
    Theano-MPI's ``HOST:DEVICE[,DEVICE...]`` entries (module docstring).
    Each device is checked by :func:`parse_device` and kept as written
    (stripped). Without ``hosts`` a ``HOST:`` prefix makes an unknown device.
    Raises :class:`DeviceError` (bad input, a ValueError) naming the entry.
    """
    items = [value] if isinstance(value, str) else list(value)
    if not any(str(item).strip() for item in items):
        raise DeviceError('no device given (e.g. cpu, cuda0,cuda1 or opencl0:0)')
    what, form = (('DEVICES entry', 'DEVICE[,DEVICE...] or HOST:DEVICE[,DEVICE...]') if hosts
                  else ('device list', 'DEVICE[,DEVICE...]'))
    out = []
    for item in items:
        text = str(item).strip()
        # HOST:DEVICES, where DEVICES may itself hold 'openclP:D'.
        host, sep, devs = text.partition(':')
        if not hosts or not sep or _OPENCL.match(text):
            host, sep, devs = None, '', text
        host = host.strip() if sep else None
        if sep and not host:
            raise DeviceError('%s %r: empty host before ":"' % (what, item))
        names = [d.strip() for d in devs.split(',')]
        if not all(names):
            raise DeviceError('%s %r: expected %s' % (what, item, form))
        for name in names:
            parse_device(name)
        out.extend((host, d) for d in names)
    return out


def parse_device_list(text):
    """``'cuda0,cuda1'`` (or a list) -> validated canonical list (at least one; no hosts)."""
    return [parse_device(d) for _, d in parse_devices(text, hosts=False)]


def device_for_rank(devices, rank, local=None):
    """The device rank ``rank`` takes from the list ``devices`` (see module docstring);
    ``local``: its index on its host (:func:`theanompi_ext.collective.world.local_rank`)."""
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
