"""collective.world: MPI's world, or a world of one where MPI cannot load.

mpi4py with no MPI library raises when ``mpi4py.MPI`` is imported (a stock
GPU image); that is simulated by replacing the module in ``sys.modules``.
"""
import json
import os
import subprocess
import sys
import types

import pytest

from theanompi_ext.collective import world
from theanompi_ext.collective.nccl import NCCLCommunicator
from theanompi_ext.collective.registry import create_communicator
from theanompi_ext.collective.world import (OneRankWorld, world_comm, in_mpi_job, LAUNCHER_VARS,
                                            LOCAL_RANK_VARS, SINGLETON_ENV, import_mpi,
                                            local_rank)

from support.fakes import FakeLib, FakeCupyArray, fake_cupy


def _mpi4py_cannot_load(monkeypatch):
    """``from mpi4py import MPI`` raises mpi4py's own RuntimeError."""
    fake = types.ModuleType('mpi4py')

    def __getattr__(name):
        raise RuntimeError('cannot load MPI library\nlibmpi.so.12: cannot open shared object file')
    fake.__getattr__ = __getattr__
    monkeypatch.setitem(sys.modules, 'mpi4py', fake)
    monkeypatch.delitem(sys.modules, 'mpi4py.MPI', raising=False)


def _no_launcher(monkeypatch):
    for v in LAUNCHER_VARS:
        monkeypatch.delenv(v, raising=False)


def test_one_rank_world_semantics():
    w = OneRankWorld()
    assert (w.Get_rank(), w.Get_size()) == (0, 1)
    assert w.allgather({'a': 1}) == [{'a': 1}]
    assert w.bcast(b'id', root=0) == b'id'
    with pytest.raises(ValueError, match='bcast root 1 in a world of one rank'):
        w.bcast(b'id', root=1)
    w.Barrier()


def test_in_mpi_job_reads_launcher_variables():
    assert not in_mpi_job({})
    assert not in_mpi_job({'PATH': '/bin'})
    for v in LAUNCHER_VARS:
        assert in_mpi_job({v: '0'})


def test_local_rank_from_the_launchers_variables():
    assert local_rank(environ={}) is None
    assert local_rank(environ={'MPI_LOCALRANKID': 'x'}) is None     # not a number: unknown
    for v in LOCAL_RANK_VARS:
        assert local_rank(environ={v: '3'}) == 3
    # the first variable in the list wins (Open MPI's before hydra's)
    assert local_rank(environ={'OMPI_COMM_WORLD_LOCAL_RANK': '1', 'MPI_LOCALRANKID': '2'}) == 1


def test_local_rank_with_a_communicator(monkeypatch):
    # no MPI communicator (a world of one, a test's fake): the launcher's variables
    assert local_rank(OneRankWorld(), environ={'SLURM_LOCALID': '2'}) == 2
    assert local_rank(object(), environ={}) is None
    for v in LOCAL_RANK_VARS:
        monkeypatch.setenv(v, '5')
    MPI = import_mpi()
    # an MPI communicator: MPI's answer (ranks sharing memory), not the variables
    assert local_rank(MPI.COMM_SELF) == 0
    assert local_rank(MPI.COMM_WORLD) == MPI.COMM_WORLD.Get_rank() == 0


def test_world_comm_is_comm_world_when_mpi_loads():
    assert world_comm() is import_mpi().COMM_WORLD


ALONE = r'''
import json, os
before = set(os.listdir('/dev/shm'))
from theanompi_ext.collective.world import import_mpi
MPI = import_mpi()
MPI.COMM_WORLD.Barrier()
print(json.dumps([MPI.COMM_WORLD.Get_size(), os.environ.get('OMPI_MCA_btl')]))
MPI.Finalize()
print(json.dumps(sorted(n for n in set(os.listdir('/dev/shm')) - before
                        if n.startswith('sm_segment.'))))
'''


def test_mpi_alone_leaves_nothing_in_dev_shm():
    """A process that starts MPI alone (info, train --workers 1): Open MPI would
    leave a 16 MB segment in /dev/shm behind each; started the package's way it
    leaves none, and its launcher variables stay out of the environment."""
    env = {k: v for k, v in os.environ.items() if k not in SINGLETON_ENV}
    out = subprocess.run([sys.executable, '-c', ALONE], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    first, left = [json.loads(line) for line in out.stdout.splitlines()[-2:]]
    assert first == [1, None]
    assert left == [], left


def test_world_of_one_when_mpi_cannot_load(monkeypatch):
    _mpi4py_cannot_load(monkeypatch)
    _no_launcher(monkeypatch)
    assert isinstance(world_comm(), OneRankWorld)
    monkeypatch.setitem(sys.modules, 'mpi4py', None)       # mpi4py not installed at all
    assert isinstance(world_comm(), OneRankWorld)
    assert create_communicator('auto').name == 'local'


def test_launched_ranks_refuse_to_go_solo(monkeypatch):
    _mpi4py_cannot_load(monkeypatch)
    _no_launcher(monkeypatch)
    monkeypatch.setenv('PMI_SIZE', '2')
    with pytest.raises(RuntimeError, match=r'started by an MPI launcher, but mpi4py cannot '
                                           r'load MPI \(RuntimeError: cannot load MPI library\); '
                                           r'install an MPI') as err:
        world_comm()
    assert str(err.value).endswith(world.MPI_HINT)
    with pytest.raises(RuntimeError, match='started by an MPI launcher'):
        create_communicator('auto')
    with pytest.raises(RuntimeError, match='started by an MPI launcher'):
        NCCLCommunicator(lib=FakeLib(), cupy=fake_cupy())


def test_nccl_on_one_gpu_without_mpi(monkeypatch):
    """One process, one GPU, no MPI library: the NCCL communicator still forms."""
    _mpi4py_cannot_load(monkeypatch)
    _no_launcher(monkeypatch)
    lib, cp = FakeLib(), fake_cupy()
    comm = NCCLCommunicator(lib=lib, cupy=cp)
    assert isinstance(comm.comm, OneRankWorld)
    assert (comm.rank, comm.size, comm.device) == (0, 1, 0)
    assert lib.log[0] == ('init', 1, 128, 0)
    buf = FakeCupyArray(n=4, ptr=0xB000)
    assert comm.start_allreduce(buf, 'b').wait() is buf
    assert lib.log[-1][:4] == ('allreduce', 0xB000, 0xB000, 4)
    assert comm.allgather('x') == ['x'] and comm.bcast(7) == 7
    comm.barrier()
    comm.close()
    assert lib.log[-1] == ('destroy',)
