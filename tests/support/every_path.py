"""The launch paths other than ``train`` (check-equivalence, trials, a Theano-MPI
session) with rank 1 SIGKILLed after its first iteration, and what their output
must show: shared by tests/launch/test_exit_noise_every_path.py (one host) and
test_far_death_every_path.py (the rank on the far emulated host)."""
import os
import re

from support.paths import ROOT
from theanompi_ext.train import attempt

#: rank 1 SIGKILLed after its first iteration (train/attempt.FAULTS_VAR)
KILL_RANK_1 = {attempt.FAULTS_VAR: '0:1:1:kill'}
#: the smallest runs: start-up is most of each one's time
CHECK_EQUIVALENCE = ['theanompi_ext', 'check-equivalence', '--workers', '2', '--steps', '12',
                     '--subset', '128', '--model', 'mlp']


def trials_argv(out):
    """``trials``: one run of 2 ranks, one epoch of the mlp, its folder ``out``."""
    return ['theanompi_ext', 'trials', '--runs', '1', '--workers', '2', '--epochs', '1',
            '--batch-per-worker', '16', '--ref-batch', '32', '--warmup-epochs', '0',
            '--model', 'mlp', '--out', str(out)]


def session_argv(folder, devices):
    """A Theano-MPI session of the digits MLP on ``devices`` (the cfg's DEVICES
    value), its cfg written in ``folder``: the tmlauncher's argv."""
    cfg = os.path.join(str(folder), 'session.cfg')
    with open(cfg, 'w') as fh:
        fh.write('RULE=BSP\nMODELFILE=%s\nMODELCLASS=DigitsMLPLayered\nDEVICES=%s\n'
                 % (os.path.join(ROOT, 'tests', 'dropin', 'digits_contract.py'), devices))
    return ['theanompi_ext.tmlauncher', '-cfg=%s' % cfg]


def reported(text, *also):
    """The launcher's own report of rank 1 is there, before the explanation: hydra's
    banner (standard output) or Open MPI's text (standard error), or one of ``also``."""
    assert any(s in text for s in ('BAD TERMINATION', 'prterun noticed that process rank 1')
               + also), text[-3000:]


def no_trail(text):
    """hydra's bracketed lines (launch/exit_noise.HYDRA_LINE) are held or absent."""
    assert not re.search(r'^\s*\[(mpiexec|proxy:[^\]]*)@', text, re.M), text[-3000:]


def last_lines(text, n=1):
    """The last ``n`` lines of ``text`` (Open MPI's output may leave NUL bytes)."""
    return text.replace('\0', '').strip().splitlines()[-n:]
