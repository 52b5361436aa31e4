"""The first lines of a run (where each rank runs) and the check that every host sees
--out (train/placement.py, train/outdir.unseen_by_this_host), with a stand-in
communicator; and MPI_Abort's fallback when the launcher cannot be reached."""
import os
import socket
import subprocess
import sys
import time

import pytest

from theanompi_ext.train import outdir
from theanompi_ext.train.config import TrainConfig
from theanompi_ext.train.placement import OutputFolderUnseen, announce_placement


class TwoRanks(object):
    """Rank 0 of 2; the other rank's place is given."""
    rank, size = 0, 2

    def __init__(self, other):
        self.other = other

    def allgather(self, obj, label=None):
        return [obj, self.other]


def test_unseen_by_this_host(tmp_path):
    lock = outdir.FolderLock(str(tmp_path))
    try:
        env = {outdir.MARK_VAR: lock.holder}
        assert outdir.unseen_by_this_host(str(tmp_path), env) is None
        assert outdir.unseen_by_this_host(str(tmp_path), {}) is None     # no launcher mark
        assert 'cannot read' in outdir.unseen_by_this_host(str(tmp_path / 'no'), env)
        other = dict(env, **{outdir.MARK_VAR: 'pid 1 on elsewhere since then'})
        assert "is not the launcher's" in outdir.unseen_by_this_host(str(tmp_path), other)
    finally:
        lock.release()


def test_lines_then_refusal(tmp_path, monkeypatch):
    cfg = TrainConfig(out=str(tmp_path), quiet=False)
    lines = []
    places = announce_placement(cfg, TwoRanks(('far', 0, 'cpu', None)), 'cpu', lines.append)
    host = socket.gethostname()
    assert lines == ['rank 0 of 2: host %s, local rank ?, device cpu\n'
                     'rank 1 of 2: host far, local rank 0, device cpu' % host]
    assert places[1] == ('far', 0, 'cpu')
    with pytest.raises(OutputFolderUnseen, match=r'--out %s is not seen by rank 1 on host far '
                                                 r'\(cannot read' % tmp_path) as e:
        announce_placement(cfg, TwoRanks(('far', 0, 'cpu', 'cannot read it')), 'cpu',
                           lines.append)
    assert isinstance(e.value, ValueError)       # bad input: exit status 2


def test_mpi_abort_that_never_returns_ends_the_rank():
    code = ('import time\nfrom theanompi_ext.collective.abort_alone import abort\n'
            'abort(lambda c: time.sleep(30), 4, alone_s=0.3)\n')
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, '-c', code], timeout=20)
    assert res.returncode == 4 and time.monotonic() - t0 < 10


def test_mpi_abort_that_returns_at_once_still_ends_the_daemon():
    """Open MPI's MPI_Abort ends the rank at once while its daemon (prted) may wait for
    an unreachable launcher for ever: the daemon is SIGKILLed ``alone_s`` later."""
    rank = ('import os\nfrom theanompi_ext.collective.abort_alone import abort\n'
            'abort(lambda c: os._exit(c), 4, alone_s=0.5)\n')
    # the parent calls itself prted (its comm), starts the rank, then waits for ever
    daemon = ('import ctypes, subprocess, sys, time\n'
              'ctypes.CDLL(None).prctl(15, b"prted", 0, 0, 0)\n'
              'print(subprocess.call([sys.executable, "-c", %r]), flush=True)\n'
              'time.sleep(30)\n' % rank)
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, '-c', daemon], timeout=20, capture_output=True,
                         text=True)
    assert res.stdout.strip() == '4' and res.returncode == -9, res
    assert time.monotonic() - t0 < 10


def test_an_abort_leaves_the_ranks_note(tmp_path):
    """Once a rank has noted itself for the launcher, any abort of the job by it (the
    watchdog's too, which no ``except`` sees) leaves ``failed N`` first; a failing
    hook of before_abort does not stop the abort."""
    from theanompi_ext.launch.rank_notes import RANKS_DIR_VAR, read_rank_notes
    code = ('import os\nfrom theanompi_ext.collective.abort_alone import abort, before_abort\n'
            'from theanompi_ext.train import faults\n'
            'before_abort(lambda c: 1 / 0)\n'
            'faults.note_rank("running", rank=3)\n'
            'faults.note_rank("running", rank=3)\n'
            'from theanompi_ext.collective import abort_alone\n'
            'assert len(abort_alone._BEFORE_ABORT) == 2, abort_alone._BEFORE_ABORT\n'
            'abort(lambda c: os._exit(c), 4, alone_s=5)\n')
    res = subprocess.run([sys.executable, '-c', code], timeout=20, capture_output=True,
                         text=True, env=dict(os.environ, **{RANKS_DIR_VAR: str(tmp_path)}))
    assert res.returncode == 4, res.stderr
    (_, _, state), = read_rank_notes(str(tmp_path)).values()
    assert state == 'failed 4' and list(read_rank_notes(str(tmp_path))) == [3]
