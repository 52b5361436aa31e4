"""``theanompi-ext hostfile``: SLURM's, LSF's, PBS's and Grid Engine's host lists as
hostfiles (launch/hostlists.py)."""
import os
import stat

import pytest

from theanompi_ext.cli.commands import main
from theanompi_ext.errors import BadInput
from theanompi_ext.launch.hostlists import (HostfileError, check_line_ends, format_hostfile,
                                            from_lsf, from_pbs, from_sge, from_slurm,
                                            job_source, read_hostfile,
                                            slot_warnings, slurm_tasks_per_node)


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


def test_from_pbs_a_host_per_slot(tmp_path):
    nodes = tmp_path / 'nodes'
    # Torque's file: a host once per slot; a run is one entry, a later run another
    nodes.write_text('n01\nn01\nn02\nn02 \n\nn02\nn01\n')
    assert from_pbs({'PBS_NODEFILE': str(nodes)}) == [('n01', 2), ('n02', 3), ('n01', 1)]
    with pytest.raises(BadInput, match='PBS_NODEFILE is not set: run inside a PBS job'):
        from_pbs({})
    with pytest.raises(BadInput, match=r'PBS_NODEFILE=%s: cannot read it \(No such file'
                       % (tmp_path / 'gone')):
        from_pbs({'PBS_NODEFILE': str(tmp_path / 'gone')})
    (tmp_path / 'empty').write_text('\n')
    with pytest.raises(BadInput, match='names no host'):
        from_pbs({'PBS_NODEFILE': str(tmp_path / 'empty')})


def test_from_sge_host_slots_queue_processors(tmp_path):
    pe = tmp_path / 'pe_hostfile'
    # a host in two queues: its slots add up, at its first place
    pe.write_text('node01.cl 4 all.q@node01.cl UNDEFINED\n'
                  'node02.cl 2 all.q@node02.cl <NULL>\n'
                  'node01.cl 1 long.q@node01.cl UNDEFINED\n\n')
    assert from_sge({'PE_HOSTFILE': str(pe)}) == [('node01.cl', 5), ('node02.cl', 2)]
    for bad in ('node01.cl\n', 'node01.cl four all.q UNDEFINED\n', 'node01.cl 0 all.q x\n'):
        pe.write_text('node00 1 all.q x\n' + bad)
        with pytest.raises(BadInput, match=r'PE_HOSTFILE=%s, line 2: .*"host slots queue '
                           r'processors"' % pe):
            from_sge({'PE_HOSTFILE': str(pe)})
    with pytest.raises(BadInput, match='PE_HOSTFILE is not set: run inside a Grid Engine'):
        from_sge({})
    pe.write_text('')
    with pytest.raises(BadInput, match='names no host'):
        from_sge({'PE_HOSTFILE': str(pe)})


def test_formats():
    hosts = [('a', 2), ('b', 1)]
    assert format_hostfile(hosts) == 'a:2\nb:1\n'
    assert format_hostfile(hosts, 'openmpi') == 'a slots=2\nb slots=1\n'


def test_read_either_format_with_mpis_own_words(tmp_path):
    f = tmp_path / 'h'
    # hydra's and Open MPI's extra words pass; max_slots is not the host's slots
    f.write_text('# nodes\nn1:2 binding=user:0,1\nn2 max_slots=8 slots=4\n\nn1:1  # again\n'
                 'n3\n')
    assert read_hostfile(str(f)) == [('n1', 3), ('n2', 4), ('n3', 1)]
    f.write_text(format_hostfile([('a', 2), ('b', 1)], 'openmpi'))
    assert read_hostfile(str(f)) == [('a', 2), ('b', 1)]


@pytest.mark.parametrize('text,why', [
    (None, 'cannot read it (No such file or directory)'),
    ('', 'names no host (one per line'),
    ('# only a comment\n\n', 'names no host'),
    ('a:2\nb:x\n', "line 2: 'b:x': a slot count must be a whole number >= 1, not 'x'"),
    ('a:0\n', "line 1: 'a:0': a slot count must be a whole number >= 1, not '0'"),
    ('a:-1\n', "not '-1'"),
    ('a slots=2.5\n', "line 1: 'a slots=2.5': a slot count must be a whole number >= 1, "
                      "not '2.5'"),
    ('a slots=2 max_slots=\n', "not ''"),
    ('a b\n', "line 1: 'b' is not KEY=VALUE (one host per line: host:N or host slots=N)"),
    ('a =3\n', "'=3' is not KEY=VALUE"),
    (':2\n', "line 1: ':2': no host name"),
    (b'\xff\xfe:2\n', 'cannot read it'),
    # a Windows editor's byte-order mark: mpiexec would take it for part of a host name
    (b'\xef\xbb\xbfa:2\n', 'line 1: starts with a byte-order mark (U+FEFF, as some Windows '
                            'editors save a file), which mpiexec takes for part of the first '
                            'host name: save the file without it'),
])
def test_a_bad_hostfile_is_named_with_its_line(tmp_path, text, why):
    f = tmp_path / 'hosts'
    if isinstance(text, bytes):
        f.write_bytes(text)
    elif text is not None:
        f.write_text(text)
    with pytest.raises(HostfileError) as exc:
        read_hostfile(str(f))
    assert str(exc.value).startswith('--hostfile %s' % f) and why in str(exc.value), exc.value
    assert isinstance(exc.value, BadInput)          # status 2 on every path


def test_windows_line_ends_read_here_and_refused_for_open_mpi_only(tmp_path):
    """CR LF: hydra reads it (and so do we); Open MPI's mpiexec fails to parse it
    (status 250, "parse error ... on token 1"), so a launch with Open MPI is
    refused first, naming the line and the fix."""
    f = tmp_path / 'hosts'
    f.write_bytes(b'a:2\nb slots=1\r\nc\r\n')
    assert read_hostfile(str(f)) == [('a', 2), ('b', 1), ('c', 1)]
    with pytest.raises(HostfileError) as exc:
        check_line_ends(str(f))
    assert str(exc.value) == (
        "--hostfile %s, line 2: ends in a carriage return (Windows line ends), which Open "
        "MPI's mpiexec cannot parse: convert the file (dos2unix %s, or sed -i 's/\\r$//' %s)"
        % (f, f, f))
    f.write_bytes(b'a:2\nb slots=1\n')
    check_line_ends(str(f))                       # Unix line ends: nothing to say


def test_slot_warnings():
    hosts = [('a', 2), ('b', 2)]
    assert slot_warnings(hosts, 4) == [] and slot_warnings(hosts, 3) == []
    # more ranks than slots: hydra and Open MPI (--map-by slot:OVERSUBSCRIBE) both go on
    assert slot_warnings(hosts, 6) == [
        '--workers 6 on a hostfile of 4 slots (a:2, b:2): MPI places the other 2 ranks on '
        'the same hosts again, more ranks than slots']
    assert slot_warnings([('a', 1)], 2)[0].startswith('--workers 2 on a hostfile of 1 slot (a:1)')
    # fewer: the first host's slots take them all
    assert slot_warnings(hosts, 2) == [
        "--workers 2 fills the first 2 slots of the hostfile: host b gets no rank (ranks fill "
        "each host's slots in order; lower a host's slots to spread them)"]
    assert 'hosts b, c get no rank' in slot_warnings(hosts + [('c', 1)], 1)[0]


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


def test_the_command_reads_pbs_and_sge_files(tmp_path, monkeypatch, capsys):
    (tmp_path / 'nodes').write_text('a\na\nb\n')
    monkeypatch.setenv('PBS_NODEFILE', str(tmp_path / 'nodes'))
    assert main(['hostfile', '--from-pbs', '--format', 'openmpi']) == 0
    assert capsys.readouterr().out == 'a slots=2\nb slots=1\n'
    (tmp_path / 'pe').write_text('c 3 all.q@c UNDEFINED\n')
    monkeypatch.setenv('PE_HOSTFILE', str(tmp_path / 'pe'))
    assert main(['hostfile', '--from-sge']) == 0
    assert capsys.readouterr().out == 'c:3\n'
    monkeypatch.delenv('PE_HOSTFILE')
    assert main(['hostfile', '--from-sge']) == 2
    assert 'PE_HOSTFILE is not set' in capsys.readouterr().err


def test_out_is_whole_or_left_as_it_was(tmp_path, monkeypatch, capsys):
    """--out goes through files/atomic: a hostfile that cannot be read, or a
    folder where it cannot be written, leaves an older file there as it was,
    and no temporary beside it."""
    (tmp_path / 'nodes').write_text('a\nb\n')
    monkeypatch.setenv('PBS_NODEFILE', str(tmp_path / 'nodes'))
    out = tmp_path / 'hosts'
    assert main(['hostfile', '--from-pbs', '--out', str(out)]) == 0
    assert out.read_text() == 'a:1\nb:1\n'
    monkeypatch.setenv('PBS_NODEFILE', str(tmp_path / 'gone'))
    assert main(['hostfile', '--from-pbs', '--out', str(out)]) == 2
    assert 'cannot read it' in capsys.readouterr().err
    assert out.read_text() == 'a:1\nb:1\n'
    monkeypatch.setenv('PBS_NODEFILE', str(tmp_path / 'nodes'))
    assert main(['hostfile', '--from-pbs', '--out', str(tmp_path / 'no' / 'hosts')]) == 3
    err = capsys.readouterr().err
    assert 'theanompi-ext hostfile: error: ' in err and str(tmp_path / 'no' / 'hosts') in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ['hosts', 'nodes']


def test_the_job_tells_its_scheduler():
    assert job_source({'SLURM_JOB_NODELIST': 'n[1-2]', 'HOME': '/h'}) == 'from_slurm'
    assert job_source({'SLURM_NODELIST': 'n1'}) == 'from_slurm'
    assert job_source({'LSB_HOSTS': 'a a'}) == 'from_lsf'
    assert job_source({'PBS_NODEFILE': '/var/spool/pbs/aux/1'}) == 'from_pbs'
    # an empty variable is no job
    assert job_source({'PE_HOSTFILE': '/tmp/pe', 'LSB_HOSTS': ''}) == 'from_sge'
    with pytest.raises(BadInput, match=r'not inside a batch job: none of SLURM_JOB_NODELIST, '
                       r'SLURM_NODELIST, LSB_MCPU_HOSTS, LSB_HOSTS, PBS_NODEFILE, PE_HOSTFILE'):
        job_source({'HOME': '/h'})
    with pytest.raises(BadInput, match=r'several schedulers are set \(SLURM_JOB_NODELIST; '
                       r'PBS_NODEFILE\): choose with --from-slurm or --from-pbs'):
        job_source({'SLURM_JOB_NODELIST': 'n1', 'PBS_NODEFILE': '/x'})


def test_the_command_without_a_source_reads_the_jobs(tmp_path, monkeypatch, capsys):
    for names in ('SLURM_JOB_NODELIST', 'SLURM_NODELIST', 'LSB_MCPU_HOSTS', 'LSB_HOSTS',
                  'PBS_NODEFILE', 'PE_HOSTFILE'):
        monkeypatch.delenv(names, raising=False)
    assert main(['hostfile']) == 2
    assert 'not inside a batch job' in capsys.readouterr().err
    (tmp_path / 'nodes').write_text('a\nb\nb\n')
    monkeypatch.setenv('PBS_NODEFILE', str(tmp_path / 'nodes'))
    assert main(['hostfile', '--format', 'openmpi']) == 0
    assert capsys.readouterr().out == 'a slots=1\nb slots=2\n'
    monkeypatch.setenv('LSB_MCPU_HOSTS', 'c 4')
    assert main(['hostfile']) == 2
    assert 'choose with --from-lsf or --from-pbs' in capsys.readouterr().err
    assert main(['hostfile', '--from-lsf']) == 0
    assert capsys.readouterr().out == 'c:4\n'
