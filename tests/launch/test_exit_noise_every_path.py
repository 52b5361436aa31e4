"""A rank that dies, on the launch paths other than ``train`` (which tests/launch/
test_faults.py covers): ``check-equivalence``, ``trials`` and a Theano-MPI session
started the plain way (``BSP().init``). Each runs 2 real ranks on this host, rank 1
SIGKILLed after its first iteration (train/attempt.FAULTS_VAR; the smallest models:
their start-up is most of each test's time), through
launch/postmortem.run_explained: the launcher's explanation, naming the rank and
its host, is the last line, after hydra's report; hydra's own bracketed trail never
follows it. (On one host hydra's only lines are its banner, which is the report;
what launch/exit_noise.py holds back is tested on captured output in test_exit_noise.py.
The same death on the far one of 2 emulated hosts: test_far_death_every_path.py.)
"""
import json
import os
import re
import socket
import subprocess
import sys

from support.every_path import (CHECK_EQUIVALENCE, KILL_RANK_1, no_trail, reported,
                                session_argv, trials_argv)

TIMEOUT = 300
#: the launcher's line for rank 1 of 2 killed on this host
DIED = re.compile(r'theanompi-ext: rank 1 of 2 \(pid \d+ on %s\) died: Killed \(signal 9\); '
                  r'mpiexec stopped the other ranks \(exit status 9\)$'
                  % re.escape(socket.gethostname()))


def _run(argv, cwd):
    return subprocess.run([sys.executable, '-m'] + argv, capture_output=True, text=True,
                          timeout=TIMEOUT, env=dict(os.environ, **KILL_RANK_1), cwd=str(cwd))


def test_check_equivalence(tmp_path):
    r = _run(CHECK_EQUIVALENCE, tmp_path)
    assert r.returncode == 9, r.stdout + r.stderr[-3000:]
    last = r.stderr.strip().splitlines()[-2:]
    assert last[0] == 'check-equivalence: the 2-rank run failed (exit 9)', last
    assert DIED.match(last[1]), last
    assert 'PASS' not in r.stdout
    reported(r.stdout + r.stderr)
    no_trail(r.stdout + r.stderr)


def test_trials(tmp_path):
    out = tmp_path / 'trials'
    r = _run(trials_argv(out), tmp_path)
    assert r.returncode == 3, r.stdout + r.stderr[-3000:]
    # the terminal: the run's line ends with the launcher's explanation
    line = [ln for ln in r.stdout.splitlines() if ln.startswith('[1/1] ')][0]
    assert DIED.search(line.rsplit(', ', 1)[0]), line
    (run,) = json.loads((out / 'trials.json').read_text())['settings'][0]['runs']
    assert run['status'] == 'failed' and run['exit_status'] == 9 and DIED.match(run['reason'])
    # the log: hydra's report, then the explanation last
    log = (out / 'run0' / 'train.log').read_text()
    assert DIED.match(log.strip().splitlines()[-1]), log[-2000:]
    reported(log)
    no_trail(log + r.stdout + r.stderr)


def test_theanompi_session(tmp_path):
    r = _run(session_argv(tmp_path, '(cpu0 cpu1)'), tmp_path)
    assert r.returncode == 9, r.stdout + r.stderr[-3000:]
    assert DIED.match(r.stderr.strip().splitlines()[-1]), r.stderr[-3000:]
    reported(r.stdout + r.stderr)
    no_trail(r.stdout + r.stderr)
