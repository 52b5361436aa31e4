"""Theano-MPI compatibility around the model: launcher flags and keys, DEVICES,
engine flags vs a user's .theanorc, install_into_theanompi's refusals."""
import os
import subprocess
import sys

import pytest

from support.paths import ROOT

DROPIN = os.path.join(ROOT, 'tests', 'dropin')


def test_the_aliases_users_type_keep_working():
    """``from theanompi_ext.rules import BSP`` and ``python -m theanompi_ext.tmlauncher``
    (Theano-MPI's ``theanompi.rules`` and launcher) stay at the top of the package."""
    import theanompi_ext
    from theanompi_ext import tmlauncher
    from theanompi_ext.rules import BSP
    from theanompi_ext.theanompi_compat import rule, session
    assert BSP is rule.BSP is theanompi_ext.BSP
    assert tmlauncher.main is session.main
    r = subprocess.run([sys.executable, '-m', 'theanompi_ext.tmlauncher', '-no_such_flag'],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "tmxlauncher: error: unknown flag '-no_such_flag'" in r.stderr


def test_theanompi_flags_and_session_keys(tmp_path):
    from theanompi_ext.theanompi_compat.session import parse_args, session_from_file
    cfg = tmp_path / 's.cfg'
    cfg.write_text("RULE=BSP\nBSP_SYNC_TYPE='avg'  # Theano-MPI's key\n"
                   'MODELFILE=%s\nMODELCLASS=DigitsMLP\n'
                   'DEVICES=("node0:cuda0"\n   "node1:cuda0,cuda1")\n'
                   % os.path.join(DROPIN, 'digits_contract.py'))
    flags = parse_args(['-cfg=%s' % cfg, '-bsp_exch_strategy=ar'])
    s = session_from_file(flags['cfg'], flags)
    assert s['sync_type'] == 'avg' and s['exch_strategy'] == 'ar'
    assert s['devices'] == ['node0:cuda0', 'node1:cuda0,cuda1']
    # A flag contradicting the file is an error, not silently one or the other.
    flags = parse_args(['--config=%s' % cfg, '-bsp_sync_type=kn'])
    with pytest.raises(ValueError, match='SYNC_TYPE=kn on the command line but SYNC_TYPE=avg'):
        session_from_file(flags['cfg'], flags)


@pytest.mark.parametrize('argv,needle', [
    (['-cfg=x', '-bind'], 'flag -bind (core binding) is not supported'),
    (['-cfg=x', '-s=4'], 'flag -s (a size (the number of ranks is the number of DEVICES))'),
    (['-cfg=x', '--colour=blue'], "unknown flag '--colour=blue'"),
    ([], 'no session config given'),
])
def test_flags_the_launcher_does_not_take_are_errors(argv, needle):
    from theanompi_ext.theanompi_compat.session import parse_args
    with pytest.raises(ValueError) as exc:
        parse_args(argv)
    assert needle in str(exc.value)


@pytest.mark.parametrize('line,needle', [
    ('BSP_EXCH_STRATEGY=nccl32', "EXCH_STRATEGY='nccl32': Theano-MPI's pygpu NCCL"),
    ('DEVICES=("node0:")', "DEVICES entry 'node0:'"),
    ('DEVICES=("node0:cuda0"', 'array DEVICES=( is not closed'),
    ('TOPOLOGY=ring', 'TOPOLOGY=ring is not a valid str'),
])
def test_bad_session_values(tmp_path, line, needle):
    from theanompi_ext.theanompi_compat.session import session_from_file
    cfg = tmp_path / 's.cfg'
    devices = '' if line.startswith('DEVICES') else 'DEVICES=cpu0,cpu1\n'
    cfg.write_text('RULE=BSP\nMODELFILE=digits_contract\nMODELCLASS=DigitsMLP\n%s%s\n'
                   % (devices, line))
    with pytest.raises(ValueError) as exc:
        session_from_file(str(cfg))
    assert needle in str(exc.value)


def test_topology_is_an_option_of_the_rule_not_of_the_model():
    # how an allreduce spans hosts: chosen before the model loads (the communicator
    # exists first), so from the rule's options / the environment only
    from theanompi_ext.theanompi_compat.options import early_option, resolve_options
    from theanompi_ext.theanompi_compat.rule import _child_env
    assert early_option('topology', {}) == 'auto'
    assert early_option('topology', {'THEANOMPI_EXT_TOPOLOGY': 'two-level'}) == 'two-level'
    with pytest.raises(ValueError, match="THEANOMPI_EXT_TOPOLOGY='ring': unknown topology"):
        early_option('topology', {'THEANOMPI_EXT_TOPOLOGY': 'ring'})
    assert _child_env({'topology': 'flat'})['THEANOMPI_EXT_TOPOLOGY'] == 'flat'
    with pytest.raises(ValueError, match="option topology='ring': unknown topology"):
        _child_env({'topology': 'ring'})       # refused before any rank starts
    with pytest.raises(ValueError, match="option max_steps='many'"):
        _child_env({'max_steps': 'many'})

    class Model(object):
        tmx_options = {'topology': 'flat'}
        n_epochs, batch_size, base_lr = 1, 4, 0.1
    with pytest.raises(ValueError, match=r"tmx_options\['topology'\]: chosen before the model"):
        resolve_options(Model(), {})


def test_devices_across_hosts_place_ranks_in_order(monkeypatch):
    from theanompi_ext.engine.devices import parse_devices
    from theanompi_ext.launch import mpiexec as mpiexec_mod
    from theanompi_ext.launch.devices import remote_hosts, host_args, split_hosts
    pairs = parse_devices(['node0:cuda0', 'node1:cuda0,cuda1'])
    assert pairs == [('node0', 'cuda0'), ('node1', 'cuda0'), ('node1', 'cuda1')]
    assert remote_hosts(pairs) == [('node0', 1), ('node1', 2)]
    assert remote_hosts(parse_devices('cuda0,cuda1')) is None
    assert remote_hosts(parse_devices(['localhost:cuda0,cuda1'])) is None
    hosts = [('node0', 1), ('node1', 2), ('node0', 1)]
    monkeypatch.setattr(mpiexec_mod, 'is_openmpi', lambda m: False)
    assert host_args(hosts, 'mpiexec') == ['-hosts', 'node0:1,node1:2,node0:1']
    # Open MPI: a --host entry per rank, mapped in order (it would merge node0's entries)
    monkeypatch.setattr(mpiexec_mod, 'is_openmpi', lambda m: True)
    assert host_args(hosts, 'mpiexec') == ['--host', 'node0,node1,node1,node0',
                                           '--map-by', 'seq:OVERSUBSCRIBE']
    # ... and mpiexec_command keeps that mapping instead of its own
    cmd = mpiexec_mod.mpiexec_command(4, ['x'], mpiexec='mpiexec', extra=host_args(hosts, 'm'),
                                      hosts=['node0', 'node1'])
    assert cmd.count('--map-by') == 1 and cmd[cmd.index('--map-by') + 1] == 'seq:OVERSUBSCRIBE'
    assert split_hosts(hosts) == ['node0'] and split_hosts(hosts[:2]) == []


def test_users_theanorc_wins_over_our_defaults(tmp_path):
    from theanompi_ext.engine.flags import merged_flags
    rc = tmp_path / 'rc'
    rc.write_text('[global]\nfloatX = float64\n\n[blas]\nldflags = -lopenblas\n')
    flags = dict(f.split('=', 1) for f in merged_flags('', {'THEANORC': str(rc)}).split(','))
    assert 'floatX' not in flags and 'blas.ldflags' not in flags     # the .theanorc's apply
    assert flags['warn_float64'] == 'ignore'
    flags = dict(f.split('=', 1) for f in merged_flags('', {'THEANORC': str(tmp_path / 'none')})
                 .split(','))
    assert flags['floatX'] == 'float32' and flags['blas.ldflags'] == ''
    # THEANO_FLAGS still win over everything.
    assert 'floatX=float16' in merged_flags('floatX=float16', {'THEANORC': str(rc)})


def _install_in(tmp_path, files):
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), ROOT]))
    code = ('from theanompi_ext.exchange.theanompi_exchanger import install_into_theanompi\n'
            'print("installed", install_into_theanompi())\n')
    return subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                          env=env, timeout=120)


@pytest.mark.parametrize('files,needle', [
    ({}, 'Theano-MPI is not importable'),
    ({'theanompi/__init__.py': '', 'theanompi/lib/__init__.py': '',
      'theanompi/lib/exchanger.py': 'import pygpu_not_here\n'},
     'pygpu_not_here is missing'),
    ({'theanompi/__init__.py': '', 'theanompi/lib/__init__.py': '',
      'theanompi/lib/exchanger.py': 'Exchanger = object\n'},
     'a Theano-MPI version this project does not recognise'),
])
def test_install_says_why_it_cannot(tmp_path, files, needle):
    res = _install_in(tmp_path, files)
    assert res.returncode == 0, res.stderr
    assert 'installed False' in res.stdout
    assert 'install_into_theanompi: not installed: ' in res.stderr and needle in res.stderr


def test_wait_past_its_timeout_stops_the_job_and_says_why(capsys, tmp_path):
    # a stand-in job in a process group of its own, as init starts it: wait(timeout)
    # ends the whole group, returns 124 and its line on stderr is the last
    import time
    from theanompi_ext.theanompi_compat.rule import BSP
    rule = BSP()
    with pytest.raises(RuntimeError, match=r'BSP.wait\(\) before BSP.init\(\)'):
        rule.wait()
    child = tmp_path / 'child.pid'
    rule.proc = subprocess.Popen(['sh', '-c', 'sleep 60 & echo $! > %s; wait' % child],
                                 start_new_session=True)
    while not child.exists() or not child.read_text().strip():
        time.sleep(0.01)
    assert rule.wait(timeout=0.3) == 124
    assert rule.proc.poll() is not None
    from support.procs import alive      # a zombie not yet reaped has ended
    deadline = time.monotonic() + 5
    while alive(int(child.read_text())) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not alive(int(child.read_text())), 'the rest of the group still runs'
    assert capsys.readouterr().err.splitlines()[-1] == (
        'theanompi-ext: BSP.wait() still running after timeout=0.3 s: every rank was '
        'stopped (exit status 124)')
