"""The device option and GPU-resident training, on the OpenCL device (pocl).

Tests that need pygpu + pocl take the ``opencl`` fixture: they skip without
them (`make gpu-deps` installs them, as root) and fail instead when the CI
environment variable is set.
"""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from support.paths import MPI_DIR, ROOT
from support.procs import mpiexec
from theanompi_ext.engine.devices import (DeviceError, device_for_rank, parse_device, parse_device_list,
                                          parse_devices)
from theanompi_ext.train.config import TrainConfig

CLI = [sys.executable, '-m', 'theanompi_ext.cli']
TRAIN = ['train', '--workers', '2', '--model', 'digits_cnn', '--epochs', '2',
         '--warmup-epochs', '1', '--batch-per-worker', '16', '--base-lr', '0.05',
         '--ref-batch', '32', '--max-steps', '3']


def cli(*args, timeout=900):
    res = subprocess.run(CLI + [str(a) for a in args], capture_output=True, text=True,
                         timeout=timeout, cwd=ROOT)
    return res.returncode, res.stdout + res.stderr


# -- device strings (no device needed) -------------------------------------------

def test_device_strings():
    assert parse_device('cuda1') == 'cuda1' and parse_device('OpenCL0:0') == 'opencl0:0'
    assert parse_device('cpu3') == 'cpu'
    assert parse_device_list('cuda0, cuda1') == ['cuda0', 'cuda1']
    for bad in ('gpu0', 'cuda', 'opencl0', 'cuda0;cuda1', ''):
        if bad == 'cuda':
            continue            # Theano's 'cuda' (the default CUDA device) is valid
        with pytest.raises(DeviceError):
            parse_device_list(bad) if bad in ('', 'cuda0;cuda1') else parse_device(bad)
    # one parser: Theano-MPI's DEVICES (hosts) and the plain lists, devices checked
    assert parse_devices(['node0:cuda0', 'cpu1']) == [('node0', 'cuda0'), (None, 'cpu1')]
    for bad, why in ((['node0:gpu1'], "unknown device 'gpu1'"), ('', 'no device given'),
                     (['cuda0', ''], 'expected DEVICE'),
                     (':cuda0', 'empty host'), ('cuda0,', 'expected DEVICE')):
        with pytest.raises(DeviceError, match=why):
            parse_devices(bad)
    with pytest.raises(DeviceError, match="unknown device 'node0:cuda0'"):
        parse_device_list('node0:cuda0')            # a host where only devices go
    assert parse_device_list(['CPU1', 'opencl0:0']) == ['cpu', 'opencl0:0']
    # rank r takes entry r, or its local rank's entry on several hosts
    assert device_for_rank('cuda0,cuda1', 1) == 'cuda1'
    assert device_for_rank('cuda0,cuda1', 3, local=1) == 'cuda1'
    assert device_for_rank('opencl0:0', 5) == 'opencl0:0'
    with pytest.raises(DeviceError, match='rank 2 has no device: the list cuda0,cuda1'):
        device_for_rank(['cuda0', 'cuda1'], 2)
    with pytest.raises(ValueError, match="invalid option device='gpu0': unknown device"):
        TrainConfig(device='gpu0').validate()
    with pytest.raises(ValueError, match='exchange_path'):
        TrainConfig(exchange_path='carrier-pigeon').validate()


def test_unknown_device_is_refused_before_launch():
    rc, out = cli(*(TRAIN + ['--device', 'gpu7']))
    assert rc == 2, out
    assert "unknown device 'gpu7'" in out


def test_device_that_cannot_be_opened_stops_every_rank():
    # opencl0:9 does not exist here (pocl has one device); without pygpu the
    # reason is that pygpu is missing. Either way: named, on both ranks, exit 2.
    rc, out = cli(*(TRAIN + ['--device', 'opencl0:9']), timeout=300)
    assert rc == 2, out
    assert 'cannot open device opencl0:9' in out
    # found by both ranks alike: said once, by rank 0, for both
    assert out.count('all 2 ranks failed: DeviceErrorOnRanks') == 1, out
    assert 'of 2 failed' not in out, out


# -- on the OpenCL device -------------------------------------------------------

def test_nccl_requested_where_unavailable(opencl):
    rc, out = cli(*(TRAIN + ['--device', opencl, '--exchange-path', 'nccl']), timeout=300)
    assert rc == 2, out
    assert 'exchange path nccl is not available on device opencl0:0: NCCL needs a CUDA device' \
        in out


def test_device_update_views_and_nccl_answers(opencl):
    """Device update == numpy for every momentum form; buckets are views at their
    offsets; the NCCL layer answers for OpenCL arrays (tests/mpi/device_unit.py)."""
    res = subprocess.run([sys.executable, os.path.join(MPI_DIR, 'device_unit.py'), opencl],
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.split() == ['OK', 'update', 'OK', 'views', 'OK', 'nccl']


def _train(tmp_path, name, device, strategy, exchange_bn, timeline=False, own_mpiexec=False):
    out = str(tmp_path / name)
    args = TRAIN + ['--device', device, '--exch-strategy', strategy,
                    '--exchange-bn', str(exchange_bn).lower(), '--out', out,
                    '--checkpoint', 'false']
    prefix = str(tmp_path / (name + '-timeline'))
    if timeline:
        args += ['--timeline', prefix]
    if own_mpiexec:
        # the user's own mpiexec: each rank parses the options itself, so the
        # device is opened after --model is checked (once Theano loads, its device is set)
        res = subprocess.run([mpiexec(), '-n', '2'] + CLI + [str(a) for a in args],
                             capture_output=True, text=True, timeout=900, cwd=ROOT)
        rc, log = res.returncode, res.stdout + res.stderr
    else:
        rc, log = cli(*args)
    assert rc == 0, log
    with np.load(os.path.join(out, 'params.npz')) as z:
        return {k: z[k] for k in z.files}, log, prefix + '.json'


# Each device run costs ~1-2 min of pocl kernel builds (pocl rebuilds from source
# in every process), so there is one here: ar-overlap with BN kept local (the
# device update of parameters outside the buckets), started by the user's own
# mpiexec. ar with BN exchanged is check-equivalence's setting
# (test_check_equivalence_on_device); the chunked backward with and without BN
# exchanged: tests/backward/test_overlap.py.
def test_two_ranks_on_device_match_cpu(opencl, tmp_path):
    dev, log, trace = _train(tmp_path, 'dev', opencl, 'ar-overlap', False, timeline=True,
                             own_mpiexec=True)
    cpu, _, _ = _train(tmp_path, 'cpu', 'cpu', 'ar-overlap', False)
    assert 'exchange host-staged MPI on opencl0:0' in log     # the first log line names it
    assert sorted(dev) == sorted(cpu)
    for name in cpu:
        np.testing.assert_allclose(dev[name], cpu[name], rtol=1e-4, atol=1e-5, err_msg=name)
    check_overlapped_timeline(trace)


def check_overlapped_timeline(path):
    """In every step of every rank a bucket's transfer starts before the last
    backward chunk ends; copies shown.

    The start used to be the scheduler's choice (the comm thread needing a
    core and the GIL; one CI step of six started late); the communicator
    now hands its idle thread the GIL until the transfer has started
    (collective/mpi.py, ``thread_handoff``), so it is asked of each step."""
    from theanompi_ext.exchange import timeline as tl
    with open(path) as f:
        trace = json.load(f)
    xs = [e for e in trace['traceEvents'] if e.get('ph') == 'X']
    steps = [e for e in xs if e['tid'] == tl.COMPUTE_TID and e['name'].startswith('step ')]
    assert sorted(e['pid'] for e in steps) == [0, 0, 0, 1, 1, 1]
    launched = started = 0
    for s in steps:
        inside = [e for e in xs if e['pid'] == s['pid'] and
                  s['ts'] <= e['ts'] <= s['ts'] + s['dur']]
        chunks = [e for e in inside if e['name'].startswith('backward:')]
        last_end = max(e['ts'] + e['dur'] for e in chunks)
        buckets = [e for e in inside if e['tid'] == tl.COMM_TID]
        copies = [e for e in inside if e['tid'] == tl.COPY_TID]
        assert len(buckets) >= 2 and len(copies) == 2 * len(buckets)
        assert {e['name'].split()[0] for e in copies} == {'d2h', 'h2d'}
        launched += min(e['ts'] - e['args']['queued_us'] for e in buckets) < last_end
        started += min(e['ts'] for e in buckets) < last_end
    assert launched == started == len(steps), (launched, started)


def test_check_equivalence_on_device(opencl):
    rc, out = cli('check-equivalence', '--device', opencl, '--workers', '2', '--steps', '4',
                  '--subset', '128')
    assert rc == 0, out
    assert 'check-equivalence: PASS' in out


def test_a_16_bit_wire_is_sent_from_a_device(opencl):
    """``--wire-dtype float16`` on a device: the host-staged buckets travel as
    16 bits. The device step used to drop the option and send float32
    (difference 6.7e-07, float32's summation order, with the option asked);
    the float16 wire's rounding shows as ~5e-04, inside its bound 2u/(1-m)."""
    rc, out = cli('check-equivalence', '--device', opencl, '--workers', '2', '--steps', '4',
                  '--subset', '128', '--wire-dtype', 'float16')
    assert rc == 0, out
    assert 'check-equivalence: PASS' in out and 'float16 wire' in out
    diff = float(re.search(r'max relative parameter difference: (\S+)', out).group(1))
    assert 1e-5 < diff < 9.8e-3, out
