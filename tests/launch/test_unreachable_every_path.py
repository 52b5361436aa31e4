"""A host that cannot be reached, on every launch path: ``train``, ``check-equivalence``,
``trials`` and a Theano-MPI session with a two-host ``DEVICES``. Each ends with status 2
naming the host (launch/reach.check_hosts) before mpiexec starts, without hydra's lines.
Also a hostfile that is missing or not a hostfile, on each path that takes one (and
``info``): status 2 naming the file and line (launch/hostlists.read_hostfile).
No root, no MPI job: the real ssh is asked, each host within 1 s."""
import os
import shutil
import time

import pytest

from support.paths import ROOT
from theanompi_ext.cli.commands import main as cli_main
from theanompi_ext.launch import reach

DOWN = 'tmx-nohost.invalid'          # never resolves (RFC 6761)
BLACKHOLE = '192.0.2.1'              # TEST-NET-1: nothing answers
# the agent's words: ssh's, or that there is no ssh to run (a machine without it)
NAMED = "cannot start the job on host %s (`ssh %s true` " if shutil.which('ssh') else \
    "cannot start the job on host %s (cannot run the launcher agent ssh"


@pytest.fixture
def hostfile(tmp_path, monkeypatch):
    monkeypatch.setenv(reach.TIMEOUT_VAR, '1')
    monkeypatch.delenv(reach.AGENT_VAR, raising=False)
    for var in reach.SCHEDULER_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    path = tmp_path / 'hosts'
    path.write_text('localhost:1\n%s:1\n' % DOWN)
    return str(path)


def _said(capsys, host=DOWN):
    out, err = capsys.readouterr()
    line = err.strip().splitlines()[-1]
    assert (NAMED % ((host, host) if shutil.which('ssh') else host)) in line and line.endswith(
        'no rank was started (exit status 2)'), (out, err)
    assert 'mpiexec@' not in out + err and 'proxy' not in out + err
    return out, line


def test_train(hostfile, capsys, tmp_path):
    rc = cli_main(['train', '--workers', '2', '--hostfile', hostfile, '--model', 'digits_cnn',
                   '--out', str(tmp_path / 'out')])
    assert rc == 2
    assert _said(capsys)[1].startswith('theanompi-ext: cannot start the job on host ')


def test_check_equivalence_and_a_silent_address(hostfile, capsys, tmp_path):
    with open(hostfile, 'w') as fh:
        fh.write('localhost:1\n%s:1\n' % BLACKHOLE)
    t0 = time.monotonic()
    rc = cli_main(['check-equivalence', '--workers', '2', '--hostfile', hostfile])
    assert rc == 2 and time.monotonic() - t0 < 8      # bounded: 1 s per host, asked at once
    out, line = _said(capsys, BLACKHOLE)
    assert 'the 2-rank run cannot start' in out
    assert not [p for p in os.listdir(str(tmp_path)) if p.startswith('tmx-equiv-')]


def test_trials(hostfile, capsys, tmp_path):
    rc = cli_main(['trials', '--runs', '1', '--workers', '2', '--hostfile', hostfile,
                   '--out', str(tmp_path / 'trials'), '--model', 'digits_cnn'])
    assert rc == 2
    _said(capsys)
    assert not os.path.exists(str(tmp_path / 'trials'))


def test_theanompi_session(hostfile, capsys, tmp_path):
    from theanompi_ext.theanompi_compat import session
    cfg = tmp_path / 'session.cfg'
    cfg.write_text('RULE=BSP\nMODELFILE=%s\nMODELCLASS=DigitsMLPLayered\n'
                   'DEVICES=("localhost:cpu0" "%s:cpu0")\n'
                   % (os.path.join(ROOT, 'tests', 'dropin', 'digits_contract.py'), DOWN))
    assert session.main(['-cfg=%s' % cfg]) == 2
    out, line = _said(capsys)
    assert line.startswith('tmxlauncher: error: cannot start the job on host')
    # the rule itself, as a user's script calls it
    from theanompi_ext import BSP
    with pytest.raises(reach.Unreachable, match=DOWN):
        BSP().init(['localhost:cpu0', '%s:cpu0' % DOWN],
                   os.path.join(ROOT, 'tests', 'dropin', 'digits_contract.py'),
                   'DigitsMLPLayered')


def test_this_host_and_schedulers_are_not_asked(monkeypatch):
    asked = []
    monkeypatch.setattr(reach, 'unreachable', lambda hosts, *a: asked.append(hosts) or [])
    reach.check_hosts(['localhost', 'localhost'], environ={})
    reach.check_hosts([DOWN], environ={'SLURM_JOB_ID': '7'})   # srun starts the proxies
    assert asked == []
    reach.check_hosts([DOWN, 'localhost', DOWN], environ={'SLURM_JOB_ID': '7',
                                                          reach.AGENT_VAR: 'wrapper'})
    assert asked == [[DOWN]]


@pytest.mark.parametrize('command', ['train', 'check-equivalence', 'trials', 'info'])
def test_a_bad_hostfile_on_every_path(command, tmp_path, capsys):
    """Before MPI reads it (MPICH took a missing file as 'error parsing parameters',
    status 255, and an empty one as this host alone; Open MPI had its own banners)."""
    args = {'train': ['--workers', '2', '--model', 'digits_cnn', '--out', str(tmp_path / 'o')],
            'check-equivalence': ['--workers', '2'],
            'trials': ['--runs', '1', '--workers', '2', '--model', 'digits_cnn',
                       '--out', str(tmp_path / 'trials')],
            'info': ['--timeout', '1']}[command]
    bad = tmp_path / 'hosts'
    for text, why in ((None, 'cannot read it (No such file or directory)'),
                      ('', 'names no host'),
                      ('localhost:1\nnode2:two\n', "line 2: 'node2:two': a slot count must "
                                                   "be a whole number >= 1, not 'two'")):
        if text is not None:
            bad.write_text(text)
        t0 = time.monotonic()
        assert cli_main([command, '--hostfile', str(bad)] + args) == 2
        out, err = capsys.readouterr()
        last = err.strip().splitlines()[-1]
        assert ('--hostfile %s' % bad) in last and why in last, (out, err)
        assert 'mpiexec@' not in out + err and time.monotonic() - t0 < 30
    assert not os.path.exists(str(tmp_path / 'o')) and not os.path.exists(str(tmp_path / 'trials'))
