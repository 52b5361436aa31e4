"""A rank that dies, on the launch paths other than ``train`` (which tests/launch/
test_faults.py covers): ``check-equivalence``, ``trials`` and a Theano-MPI session
started the plain way (``BSP().init``). Each runs 2 real ranks on this host, rank 1
SIGKILLed after its first iteration (train/attempt.FAULTS_VAR; the smallest models:
their start-up is most of each test's time), through
launch/postmortem.run_explained: the launcher's explanation, naming the rank and
its host, is the last line, after hydra's report; hydra's own bracketed trail never
follows it. (On one host hydra's only lines are its banner, which is the report;
what launch/exit_noise.py holds back is tested on captured output in test_exit_noise.py.)
"""
import json
import os
import re
import socket
import subprocess
import sys

from support.paths import ROOT
from theanompi_ext.train import attempt

TIMEOUT = 300
KILLED = attempt.FAULTS_VAR
#: the launcher's line for rank 1 of 2 killed on this host
DIED = re.compile(r'theanompi-ext: rank 1 of 2 \(pid \d+ on %s\) died: Killed \(signal 9\); '
                  r'mpiexec stopped the other ranks \(exit status 9\)$'
                  % re.escape(socket.gethostname()))


def _run(argv, cwd):
    env = dict(os.environ, **{KILLED: '0:1:1:kill'})
    return subprocess.run([sys.executable, '-m'] + argv, capture_output=True, text=True,
                          timeout=TIMEOUT, env=env, cwd=str(cwd))


def _reported(text):
    # the launcher's own report of the rank, before the explanation: hydra's banner
    # (standard output) or Open MPI's text (standard error)
    assert 'BAD TERMINATION' in text or 'prterun noticed that process rank 1' in text, text


def _no_trail(text):
    # hydra's bracketed lines (launch/exit_noise.HYDRA_LINE) are held or absent
    assert not re.search(r'^\s*\[(mpiexec|proxy:[^\]]*)@', text, re.M), text[-3000:]


def test_check_equivalence(tmp_path):
    r = _run(['theanompi_ext', 'check-equivalence', '--workers', '2', '--steps', '12',
              '--subset', '128', '--model', 'mlp'], tmp_path)
    assert r.returncode == 9, r.stdout + r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-2:]
    assert last[0] == 'check-equivalence: the 2-rank run failed (exit 9)', last
    assert DIED.match(last[1]), last
    assert 'PASS' not in r.stdout
    _reported(r.stdout + r.stderr)
    _no_trail(r.stdout + r.stderr)


def test_trials(tmp_path):
    out = tmp_path / 'trials'
    r = _run(['theanompi_ext', 'trials', '--runs', '1', '--workers', '2', '--epochs', '1',
              '--batch-per-worker', '16', '--ref-batch', '32', '--warmup-epochs', '0',
              '--model', 'mlp', '--out', str(out)], tmp_path)
    assert r.returncode == 3, r.stdout + r.stderr[-3000:]
    # the terminal: the run's line ends with the launcher's explanation
    line = [ln for ln in r.stdout.splitlines() if ln.startswith('[1/1] ')][0]
    assert DIED.search(line.rsplit(', ', 1)[0]), line
    (run,) = json.loads((out / 'trials.json').read_text())['settings'][0]['runs']
    assert run['status'] == 'failed' and run['exit_status'] == 9 and DIED.match(run['reason'])
    # the log: hydra's report, then the explanation last
    log = (out / 'run0' / 'train.log').read_text()
    assert DIED.match(log.strip().splitlines()[-1]), log[-2000:]
    _reported(log)
    _no_trail(log + r.stdout + r.stderr)


def test_theanompi_session(tmp_path):
    cfg = tmp_path / 'session.cfg'
    cfg.write_text('RULE=BSP\nMODELFILE=%s\nMODELCLASS=DigitsMLPLayered\nDEVICES=(cpu0 cpu1)\n'
                   % os.path.join(ROOT, 'tests', 'dropin', 'digits_contract.py'))
    r = _run(['theanompi_ext.tmlauncher', '-cfg=%s' % cfg], tmp_path)
    assert r.returncode == 9, r.stdout + r.stderr[-3000:]
    assert DIED.match(r.stderr.strip().splitlines()[-1]), r.stderr[-3000:]
    _reported(r.stdout + r.stderr)
    _no_trail(r.stdout + r.stderr)
