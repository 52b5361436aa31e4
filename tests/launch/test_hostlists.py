"""``theanompi-ext hostfile``: SLURM's and LSF's host lists as hostfiles (launch/hostlists.py)."""
import os
import stat

import pytest

from theanompi_ext.cli.commands import main
from theanompi_ext.errors import BadInput
from theanompi_ext.launch.hostlists import (format_hostfile, from_lsf, from_slurm,
                                            slurm_tasks_per_node)


def test_slurm_tasks_per_node():
    assert slurm_tasks_per_node('2(x3),1') == [2, 2, 2, 1]
    assert slurm_tasks_per_node('4') == [4]
    with pytest.raises(BadInput, match='SLURM_TASKS_PER_NODE'):
        slurm_tasks_per_node('2(3)')


def test_from_slurm_pairs_nodes_with_their_tasks():
    env = {'SLURM_JOB_NODELIST': 'n[01-03]', 'SLURM_TASKS_PER_NODE': '2(x2),1'}
    assert from_slurm(env, ['n01', 'n02', 'n03']) == [('n01', 2), ('n02', 2), ('n03', 1)]
    assert from_slurm({'SLURM_JOB_NODELIST': 'a,b'}, ['a', 'b']) == [('a', 1), ('b', 1)]
    with pytest.raises(BadInput, match='gives 1 nodes, the node list 2'):
        from_slurm(dict(env, SLURM_TASKS_PER_NODE='2'), ['a', 'b'])
    with pytest.raises(BadInput, match='SLURM_JOB_NODELIST is not set'):
        from_slurm({})


def test_from_lsf_either_variable():
    assert from_lsf({'LSB_MCPU_HOSTS': 'hA 2 hB 4'}) == [('hA', 2), ('hB', 4)]
    assert from_lsf({'LSB_HOSTS': 'hA hA hB hA'}) == [('hA', 2), ('hB', 1), ('hA', 1)]
    with pytest.raises(BadInput, match='host slots'):
        from_lsf({'LSB_MCPU_HOSTS': 'hA 2 hB'})
    with pytest.raises(BadInput, match='LSF job'):
        from_lsf({})


def test_formats():
    hosts = [('a', 2), ('b', 1)]
    assert format_hostfile(hosts) == 'a:2\nb:1\n'
    assert format_hostfile(hosts, 'openmpi') == 'a slots=2\nb slots=1\n'


def test_the_command_runs_scontrol(tmp_path, monkeypatch, capsys):
    # a stand-in scontrol on PATH, as on a SLURM node
    fake = tmp_path / 'scontrol'
    fake.write_text('#!/bin/sh\n[ "$1 $2 $3" = "show hostnames gpu[1-2]" ] && '
                    'printf "gpu1\\ngpu2\\n"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv('PATH', '%s%s%s' % (tmp_path, os.pathsep, os.environ['PATH']))
    monkeypatch.setenv('SLURM_JOB_NODELIST', 'gpu[1-2]')
    monkeypatch.setenv('SLURM_TASKS_PER_NODE', '8(x2)')
    assert main(['hostfile', '--from-slurm', '--format', 'openmpi']) == 0
    assert capsys.readouterr().out == 'gpu1 slots=8\ngpu2 slots=8\n'
    out = tmp_path / 'hosts'
    assert main(['hostfile', '--from-slurm', '--out', str(out)]) == 0
    assert out.read_text() == 'gpu1:8\ngpu2:8\n'
    monkeypatch.delenv('LSB_MCPU_HOSTS', raising=False)
    monkeypatch.delenv('LSB_HOSTS', raising=False)
    assert main(['hostfile', '--from-lsf']) == 2
    assert 'LSF job' in capsys.readouterr().err
