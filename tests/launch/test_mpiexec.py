"""The mpiexec command lines for MPICH and Open MPI, and one real job of this
venv's MPI: no start-up chatter, the local rank, the environment (docs/openmpi.md)."""
import json
import subprocess
import sys

from theanompi_ext.launch import mpiexec as launch

from support.procs import mpiexec


def _fake_mpiexec(tmp_path, name, version_text):
    path = tmp_path / name
    path.write_text('#!/bin/sh\ncat <<EOF\n%s\nEOF\n' % version_text)
    path.chmod(0o755)
    return str(path)


def test_command_lines_of_each_mpi(tmp_path):
    ompi = _fake_mpiexec(tmp_path, 'ompi', 'mpiexec (Open MPI) 5.0.11')
    hydra = _fake_mpiexec(tmp_path, 'hydra', 'HYDRA build details:\n    Version: 5.0.2')
    assert launch.is_openmpi(ompi) and not launch.is_openmpi(hydra)
    assert launch.mpiexec_command(4, ['prog'], hostfile='h', mpiexec=ompi) == [
        ompi, '-n', '4', '--map-by', 'slot:OVERSUBSCRIBE', '--hostfile', 'h', 'prog']
    assert launch.mpiexec_command(4, ['prog'], hostfile='h', mpiexec=hydra) == [
        hydra, '-n', '4', '-f', 'h', 'prog']
    # Open MPI passes other hosts only the variables named with -x
    env = {'THEANOMPI_EXT_WARMUP': 'gradual', 'THEANO_FLAGS': 'floatX=float32',
           'OMP_NUM_THREADS': '1', 'PYTHONPATH': '/x', 'HOME': '/root', 'PATH': '/bin'}
    assert launch.forwarded_env_args(ompi, env) == [
        '-x', 'OMP_NUM_THREADS', '-x', 'PYTHONPATH', '-x', 'THEANOMPI_EXT_WARMUP',
        '-x', 'THEANO_FLAGS']
    assert launch.forwarded_env_args(hydra, env) == []    # hydra passes everything



def test_iface_in_each_mpis_words(tmp_path, monkeypatch):
    # train --iface (THEANOMPI_EXT_IFACE): hydra's -iface, Open MPI's two include lists
    ompi = _fake_mpiexec(tmp_path, 'ompi', 'mpiexec (Open MPI) 5.0.11')
    hydra = _fake_mpiexec(tmp_path, 'hydra', 'HYDRA build details:\n    Version: 5.0.2')
    monkeypatch.setenv(launch.IFACE_VAR, 'ib0')
    assert launch.mpiexec_command(2, ['prog'], mpiexec=hydra) == [
        hydra, '-n', '2', '-iface', 'ib0', 'prog']
    assert launch.mpiexec_command(2, ['prog'], mpiexec=ompi)[3:7] == [
        '--mca', 'btl_tcp_if_include', 'ib0', '--mca']
    monkeypatch.delenv(launch.IFACE_VAR)
    assert launch.network_args(hydra) == []


RANK = r'''
import json, os, sys
from mpi4py import MPI
from theanompi_ext.collective.world import local_rank, launcher_rank_size
comm = MPI.COMM_WORLD
rows = comm.gather([comm.Get_rank(), local_rank(comm), local_rank(), launcher_rank_size(),
                    os.environ.get('THEANOMPI_EXT_PROBE')])
if rows:
    print(json.dumps(rows))
'''


def test_four_ranks_on_two_cores_start_quietly_with_their_environment():
    """4 ranks (more than this machine's cores) through the launcher's own line:
    nothing on standard error (no MPI start-up warnings), the launcher's local
    rank variable agrees with MPI's, and the project's variables arrive."""
    env = dict(launch.child_env(), THEANOMPI_EXT_PROBE='here')
    cmd = launch.mpiexec_command(4, [sys.executable, '-c', RANK], mpiexec=mpiexec())
    proc = launch.popen_job(cmd, env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and err == b'', err.decode()
    rows = json.loads(out.decode())
    assert rows == [[r, r, r, [r, 4], 'here'] for r in range(4)], rows


def test_a_hostfile_with_windows_line_ends_under_this_mpi(tmp_path):
    """``train --hostfile`` of a file saved with CR LF: MPICH's mpiexec reads it
    (the run trains); Open MPI's cannot ("parse error", status 250), so the
    launcher refuses it first: 2 and the line naming the fix."""
    hosts = tmp_path / 'hosts'
    ompi = launch.is_openmpi(mpiexec())
    hosts.write_bytes(b'localhost slots=2\r\n' if ompi else b'localhost:2\r\n')
    r = subprocess.run([sys.executable, '-m', 'theanompi_ext', 'train', '--workers', '2',
                        '--hostfile', str(hosts), '--model', 'mlp', '--max-steps', '3'],
                       capture_output=True, text=True, timeout=300)
    if ompi:
        assert r.returncode == 2, r.stderr[-3000:]
        assert r.stderr.rstrip().splitlines()[-1] == (
            "theanompi-ext train: error: --hostfile %s, line 1: ends in a carriage return "
            "(Windows line ends), which Open MPI's mpiexec cannot parse: convert the file "
            "(dos2unix %s, or sed -i 's/\\r$//' %s)" % (hosts, hosts, hosts)), r.stderr
    else:
        assert r.returncode == 0, r.stderr[-3000:]
        assert r.stdout.splitlines()[-1].startswith('summary: 2 workers'), r.stdout
