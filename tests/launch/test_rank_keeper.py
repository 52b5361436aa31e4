"""A rank's keeper (launch/rank_keeper.py): a rank gone without a note of its own is
noted ``died`` and its MPI daemon, if left waiting, ended; a rank that noted its
end is left alone. The whole path across emulated hosts with the launcher cut
off: test_faults_across_hosts.py (root)."""
import os
import signal
import subprocess
import sys
import time

from support.procs import alive
from theanompi_ext.launch.rank_keeper import LAUNCHER_HOST_VAR, far_from_launcher, start_keeper
from theanompi_ext.launch.rank_notes import read_rank_notes


def _sleeper(seconds=60):
    return subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(%d)' % seconds])


def _note(folder, rank, pid, state, host='h1'):
    with open(os.path.join(folder, 'rank%d' % rank), 'w') as f:
        f.write('%d %s %s\n' % (pid, host, state))


def _until(cond, within):
    deadline = time.monotonic() + within
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.02)
    return cond()


def test_a_rank_killed_is_noted_died_and_its_waiting_daemon_ended(tmp_path):
    folder = str(tmp_path)
    rank, daemon = _sleeper(), _sleeper()
    try:
        _note(folder, 1, rank.pid, 'running')
        keeper = start_keeper(folder, 1, 1.0, pid=rank.pid, daemon=daemon.pid)
        time.sleep(0.5)
        assert keeper.poll() is None and daemon.poll() is None    # nothing while it runs
        assert read_rank_notes(folder)[1] == (rank.pid, 'h1', 'running')
        rank.kill()
        rank.wait()
        t0 = time.monotonic()
        assert _until(lambda: read_rank_notes(folder)[1][2] == 'died', 3)
        assert read_rank_notes(folder)[1][:2] == (rank.pid, 'h1')     # pid and host kept
        assert daemon.wait(10) == -signal.SIGKILL
        assert 0.9 <= time.monotonic() - t0 < 5          # alone_s after the death
        assert keeper.wait(5) == 0
        assert sorted(os.listdir(folder)) == ['rank1']   # no temporary file left
    finally:
        for p in (rank, daemon):
            p.kill()
            p.wait()


def test_a_daemon_that_ends_by_itself_is_not_killed(tmp_path):
    """The connected case: mpiexec ends the job after a rank's death, its daemon
    exits by itself, and the keeper with it (long before ``alone_s``)."""
    folder = str(tmp_path)
    rank = _sleeper()
    daemon = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(1.5)'])
    _note(folder, 0, rank.pid, 'running')
    keeper = start_keeper(folder, 0, 30.0, pid=rank.pid, daemon=daemon.pid)
    rank.kill()
    rank.wait()
    assert keeper.wait(10) == 0
    assert daemon.wait(1) == 0                          # ended by itself, not SIGKILLed
    assert read_rank_notes(folder)[0][2] == 'died'


def test_a_rank_that_noted_its_end_is_left_alone(tmp_path):
    folder = str(tmp_path)
    for rank_no, state in enumerate(('done 0', 'failed 4', 'stopped 75')):
        rank, daemon = _sleeper(), _sleeper()
        try:
            _note(folder, rank_no, rank.pid, 'running')
            keeper = start_keeper(folder, rank_no, 0.3, pid=rank.pid, daemon=daemon.pid)
            _note(folder, rank_no, rank.pid, state)     # the rank's own word, then its end
            rank.kill()
            rank.wait()
            assert keeper.wait(5) == 0
            time.sleep(0.5)
            assert read_rank_notes(folder)[rank_no][2] == state
            assert daemon.poll() is None                 # its end is abort_alone's
        finally:
            for p in (rank, daemon):
                p.kill()
                p.wait()


def test_a_note_of_another_process_is_not_touched(tmp_path):
    """The note names another PID (a later run's rank in a reused folder): the
    keeper of the rank that died leaves it as it is."""
    folder = str(tmp_path)
    rank = _sleeper()
    _note(folder, 0, rank.pid + 1, 'running')
    keeper = start_keeper(folder, 0, 0.3, pid=rank.pid, daemon=0)
    rank.kill()
    rank.wait()
    assert keeper.wait(5) == 0
    assert read_rank_notes(folder)[0] == (rank.pid + 1, 'h1', 'running')


def test_a_keeper_outlives_no_rank_for_long(tmp_path):
    """No daemon to wait for (0): the keeper ends as soon as it has noted."""
    folder = str(tmp_path)
    rank = _sleeper()
    _note(folder, 0, rank.pid, 'running')
    keeper = start_keeper(folder, 0, 30.0, pid=rank.pid, daemon=0)
    rank.kill()
    rank.wait()
    t0 = time.monotonic()
    assert keeper.wait(5) == 0 and time.monotonic() - t0 < 2
    assert not alive(keeper.pid)


def test_which_ranks_start_one():
    import socket
    assert not far_from_launcher({})                       # not under our launcher
    assert not far_from_launcher({LAUNCHER_HOST_VAR: socket.gethostname()})
    assert far_from_launcher({LAUNCHER_HOST_VAR: socket.gethostname() + '-login'})


def test_a_rank_of_a_real_job_gets_a_keeper(tmp_path):
    """Two ranks under mpiexec (``train.worker.guarded``), told that the launcher
    runs elsewhere: rank 1 SIGKILLed, its keeper notes ``died`` (mpiexec then ends
    the job by itself)."""
    from support.procs import mpi_cmd
    folder = str(tmp_path)
    env = dict(os.environ, THEANOMPI_EXT_RANKS_DIR=folder)
    env[LAUNCHER_HOST_VAR] = 'a-login-node'
    proc = subprocess.Popen(mpi_cmd(2, 'run_keeper.py'), env=env, stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        line = proc.stdout.readline().split()
        assert line[:1] == ['rank1'], line
        assert _until(lambda: len(read_rank_notes(folder)) == 2, 30)
        os.kill(int(line[1]), signal.SIGKILL)
        assert _until(lambda: read_rank_notes(folder)[1][2] == 'died', 5)
        assert read_rank_notes(folder)[1][0] == int(line[1])
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
