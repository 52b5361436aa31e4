"""Theano-MPI's session file puts the contract worker's ranks on their devices.

``DEVICES=opencl0:0,opencl0:0`` (both ranks on the one pocl device, the
``opencl`` fixture of conftest: skipped without pygpu/pocl, failed under
CI) trains tests/dropin/digits_contract.py's model on the device (the
trainer's device step: flat device parameters and gradient, host-staged
MPI, the compiled update; serial, and overlapped with the chunked backward)
to the parameters of the same session with
``DEVICES=cpu0,cpu1`` (the host backend), float32 tolerance. Bad device
strings and devices that cannot be opened end every rank with exit 2.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from support.paths import ROOT

MODEL = os.path.join(ROOT, 'tests', 'dropin', 'digits_contract.py')
STEPS = 3


def session(tmp_path, name, devices, model='DigitsMLPHooked', strategy='ar', timeout=900):
    """Run tmxlauncher on a session file; (exit status, stdout, stderr, out folder)."""
    out = tmp_path / name
    cfg = tmp_path / (name + '.cfg')
    cfg.write_text('RULE=BSP\nMODELFILE=%s\nMODELCLASS=%s\nEXCH_STRATEGY=%s\nDEVICES=%s\n'
                   'MAX_STEPS=%d\nOUT=%s\n' % (MODEL, model, strategy, devices, STEPS, out))
    res = subprocess.run([sys.executable, '-m', 'theanompi_ext.tmlauncher', '-cfg=%s' % cfg],
                         capture_output=True, text=True, timeout=timeout, cwd=str(tmp_path))
    return res.returncode, res.stdout, res.stderr, out


def load_params(out):
    with np.load(os.path.join(str(out), 'params.npz')) as z:
        return {k: z[k] for k in z.files}


def test_unknown_device_in_session_refused_before_launch(tmp_path):
    rc, stdout, stderr, out = session(tmp_path, 'bad', 'opencl0:0,gpu1', timeout=120)
    assert rc == 2, stdout + stderr
    assert "unknown device 'gpu1'" in stderr
    assert 'rank' not in stdout + stderr      # no rank started
    assert not out.exists()


def test_session_device_that_cannot_be_opened_stops_every_rank(tmp_path):
    # opencl0:9 does not exist (pocl has one device); without pygpu the reason
    # is that pygpu is missing. Either way: named, on both ranks, exit 2.
    rc, stdout, stderr, out = session(tmp_path, 'closed', 'opencl0:9,opencl0:9', timeout=300)
    log = stdout + stderr
    assert rc == 2, log
    assert 'cannot open device opencl0:9' in log
    # found by both ranks alike: said once, by rank 0, for both
    assert log.count('all 2 ranks failed: DeviceErrorOnRanks') == 1, log
    assert 'of 2 failed' not in log, log


# DigitsMLP has no load_train_batch: its own train_iter steps and the stepper
# restores the device parameters; DigitsMLPLayered: the chunked backward on the
# device, each bucket host-staged as it is final. ~1 min each (pocl builds).
@pytest.mark.parametrize('model,strategy', [('DigitsMLP', 'ar'),
                                            ('DigitsMLPLayered', 'ar-overlap')])
def test_contract_session_on_device_matches_cpu(opencl, tmp_path, model, strategy):
    rc, stdout, stderr, dev_out = session(tmp_path, 'dev', '%s,%s' % (opencl, opencl),
                                          model, strategy)
    assert rc == 0, stdout + stderr
    lines = stdout.splitlines()
    # the first lines say where each rank runs (launch/places.py), then one line names
    # the ranks' devices and the exchange path
    assert lines[0].endswith(', local rank 0, device %s' % opencl), lines[0]
    assert lines[1].startswith('rank 1 of 2: host '), lines[1]
    first = lines[2]
    assert 'on 2 ranks (opencl0:0,opencl0:0)' in first, first
    assert 'exchange host-staged MPI on opencl0:0' in first, first
    assert 'exchange mode %s:' % strategy in first, first
    rc, cpu_stdout, stderr, cpu_out = session(tmp_path, 'cpu', 'cpu0,cpu1', model, strategy)
    assert rc == 0, cpu_stdout + stderr
    assert 'exchange host MPI;' in cpu_stdout.splitlines()[2]
    dev, cpu = load_params(dev_out), load_params(cpu_out)
    assert sorted(dev) == sorted(cpu) and len(cpu) == 4
    sys.path.insert(0, os.path.dirname(MODEL))
    from digits_contract import init_params      # noqa: E402  (numpy only)
    for name, start in zip(sorted(cpu), init_params()):
        assert cpu[name].shape == start.shape
        assert not np.allclose(cpu[name], start)        # the steps moved every parameter
        np.testing.assert_allclose(dev[name], cpu[name], rtol=1e-4, atol=1e-6, err_msg=name)
    summary = json.load(open(str(dev_out / 'summary.json')))
    assert summary['iterations'] == STEPS and summary['devices'] == ['opencl0:0'] * 2


def test_opencl_entries_are_devices_not_hosts():
    from theanompi_ext.engine.devices import parse_devices
    assert parse_devices(['opencl0:0', 'opencl0:0']) == [(None, 'opencl0:0')] * 2
    assert parse_devices('opencl0:0,opencl1:2') == [(None, 'opencl0:0'), (None, 'opencl1:2')]
    assert parse_devices(['node0:opencl0:0,opencl0:1', 'node1:cuda0']) == [
        ('node0', 'opencl0:0'), ('node0', 'opencl0:1'), ('node1', 'cuda0')]


def test_bsp_init_refuses_unknown_device_before_launch():
    from theanompi_ext import BSP
    from theanompi_ext.errors import DeviceError
    rule = BSP()
    with pytest.raises(DeviceError, match="unknown device 'opencl0'"):
        rule.init(['cuda0', 'opencl0'], MODEL, 'DigitsMLPHooked')
    assert rule.proc is None
