"""MPI's shared-memory files and Open MPI's session folders left by killed jobs,
removed (launch/mpi_leftovers.py): which count, that a file a process maps is
kept, and real jobs: a rank SIGKILLed under the launcher leaves none of its
job's files; a rank started by
a bare mpiexec (as on a host the launcher cannot reach) sweeps its host's old
ones when it starts, and keeps one that a running process maps."""
import mmap
import os
import subprocess
import sys
import textwrap
import time

import pytest

from theanompi_ext.errors import BadInput
from theanompi_ext.launch.mpiexec import mpiexec_command
from theanompi_ext.launch import mpi_leftovers
from theanompi_ext.launch.mpi_leftovers import (AGE_VAR, leftovers, mapped, session_folders,
                                                sweep, sweep_at_rank_start)

from support.configs import write_cfg
from support.procs import command_words, descendants, job, mpiexec, shm_made_since

MPI_NAMES = ['mpich_shm_e7d58f75_0', 'mpich_shm_e7d58f75_1', 'sm_segment.vm.1001.7e630001.0',
             'vader_segment.vm.3f.2']
OTHER_NAMES = ['mpich_shm_nothex_0', 'ucx_shm_posix_11cd3d3f', 'sem.mine', 'my_shm_file']


def test_mpi_files_of_this_user_unmapped_and_old_enough(tmp_path):
    for name in MPI_NAMES + OTHER_NAMES:
        (tmp_path / name).write_bytes(b'x')
    now = time.time()
    later = now + 100
    assert leftovers(60, str(tmp_path), in_use=set(), now=later) == sorted(MPI_NAMES)
    # too young, or another user's, or mapped by a running process
    assert leftovers(60, str(tmp_path), in_use=set(), now=now) == []
    assert leftovers(60, str(tmp_path), in_use=set(), now=later, uid=os.getuid() + 1) == []
    busy = {str(tmp_path / MPI_NAMES[0]), str(tmp_path / MPI_NAMES[2])}
    assert leftovers(60, str(tmp_path), in_use=busy, now=later) == [MPI_NAMES[1], MPI_NAMES[3]]
    # a folder that is not there: nothing, no error
    assert leftovers(0, str(tmp_path / 'gone')) == []


def test_sweep_removes_only_the_leftovers(tmp_path):
    for name in MPI_NAMES + OTHER_NAMES:
        (tmp_path / name).write_bytes(b'x')
    time.sleep(0.05)
    assert sweep(0.01, str(tmp_path), tmpdirs=[]) == sorted(MPI_NAMES)
    assert sorted(os.listdir(tmp_path)) == sorted(OTHER_NAMES)
    assert sweep(0.01, str(tmp_path / 'gone'), tmpdirs=[str(tmp_path / 'gone')]) == []


def test_open_mpis_session_folders_of_processes_gone(tmp_path):
    """``ompi.<pid>`` folders (prterun's, a daemon's) whose process is gone are
    removed with what is in them; a live process's, another name, a file or a
    link of that name are kept."""
    ended = subprocess.Popen(['true'])
    ended.wait()
    dead, live = tmp_path / ('ompi.%d' % ended.pid), tmp_path / ('ompi.%d' % os.getpid())
    for folder in (dead, live, tmp_path / 'ompi.x'):
        (folder / '1').mkdir(parents=True)
        (folder / '1' / 'pmix-gds-shmem2.session').write_text('x')
    (tmp_path / 'keep').mkdir()
    (tmp_path / ('ompi.%d' % (ended.pid + 1000000))).symlink_to(tmp_path / 'keep')
    assert session_folders([str(tmp_path)]) == [str(dead)]
    assert session_folders([str(tmp_path)], uid=os.getuid() + 1) == []
    assert sweep(0.01, str(tmp_path / 'no-shm'), tmpdirs=[str(tmp_path)]) == [dead.name]
    assert not dead.exists() and live.exists() and (tmp_path / 'keep').exists()


def test_a_file_this_process_maps_is_in_use():
    """mapped() reads the maps of this user's processes: a file in /dev/shm that
    this process maps is there, and so kept by a sweep of /dev/shm."""
    path = os.path.join(mpi_leftovers.SHM_DIR, 'mpich_shm_%08x_9' % os.getpid())
    with open(path, 'w+b') as f:
        f.write(b'\0' * 4096)
        f.flush()
        view = mmap.mmap(f.fileno(), 4096)
    try:
        time.sleep(0.05)
        assert path in mapped()
        assert os.path.basename(path) not in leftovers(0.01)
        assert os.path.basename(path) not in sweep(0.01, tmpdirs=[])
        assert os.path.exists(path)
    finally:
        view.close()
    assert path not in mapped()
    assert os.path.basename(path) in sweep(0.01, tmpdirs=[])
    assert not os.path.exists(path)


def test_only_a_hosts_first_rank_sweeps_and_a_bad_age_is_refused(monkeypatch):
    calls = []
    monkeypatch.setattr(mpi_leftovers, 'sweep', lambda age: calls.append(age) or ['x'])
    assert sweep_at_rank_start(1, {}) == [] and calls == []
    assert sweep_at_rank_start(0, {}) == ['x'] and calls == [mpi_leftovers.AT_START_S]
    assert sweep_at_rank_start(0, {AGE_VAR: '0.5'}) == ['x'] and calls[-1] == 0.5
    with pytest.raises(BadInput, match='%s=.*not a number of seconds > 0' % AGE_VAR):
        sweep_at_rank_start(0, {AGE_VAR: 'soon'})


def test_a_killed_rank_leaves_no_file_of_its_job(tmp_path):
    """Rank 1 SIGKILLed mid-run under the launcher (``train --workers 2``): MPICH
    or Open MPI would leave the job's shared memory behind (measured: MPICH's
    ``mpich_shm_<id>_0``, 2 MB); the launcher removes it when the job has ended."""
    t0 = time.time()
    out = tmp_path / 'out'
    cmd = [sys.executable, '-m', 'theanompi_ext', 'train', '--workers', '2', '--model', 'mlp',
           '--epochs', '3000', '--warmup', 'none', '--quiet', '--out', str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        ranks = []
        while len(ranks) < 2 or not _maps_shm(ranks[1]):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.2)
            ranks = sorted(p for p in descendants(proc.pid)
                           if 'theanompi_ext.train.worker' in command_words(p)
                           and 'python' in os.path.basename(command_words(p)[0]))
        # older than the sweep's AFTER_JOB_S (a younger one waits for the next sweep)
        time.sleep(mpi_leftovers.AFTER_JOB_S + 0.5)
        os.kill(ranks[1], 9)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    assert rc == 9, (rc, proc.stderr.read()[-2000:])
    assert shm_made_since(t0) == []


def _maps_shm(pid):
    """Whether process ``pid`` maps one of MPI's files in /dev/shm (its MPI is up)."""
    try:
        with open('/proc/%d/maps' % pid) as f:
            return any(mpi_leftovers.MPI_FILES.match(os.path.basename(line.split(None, 5)[-1]
                                                                     .rstrip('\n')))
                       for line in f if mpi_leftovers.SHM_DIR + '/' in line)
    except OSError:
        return False


HOLDER = textwrap.dedent('''\
    import mmap, sys, time
    f = open(sys.argv[1], 'r+b'); m = mmap.mmap(f.fileno(), 4096)
    print('mapped', flush=True); sys.stdin.read()
    ''')


def test_the_first_rank_of_a_host_sweeps_it_at_start(tmp_path):
    """Ranks started by a bare mpiexec (no launcher of ours on that host, as on the
    far hosts of a job): local rank 0 removes an old leftover of this user and
    keeps one that a running process maps."""
    left = os.path.join(mpi_leftovers.SHM_DIR, 'mpich_shm_%08x_0' % os.getpid())
    held = os.path.join(mpi_leftovers.SHM_DIR, 'mpich_shm_%08x_1' % os.getpid())
    for path in (left, held):
        with open(path, 'wb') as f:
            f.write(b'\0' * 4096)
    holder = subprocess.Popen([sys.executable, '-c', HOLDER, held], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == 'mapped'
        time.sleep(0.2)
        cfg = write_cfg(str(tmp_path / 'cfg.json'), model='mlp', epochs=1, max_steps=2,
                        warmup='none', quiet=True, out=str(tmp_path / 'out'))
        cmd = mpiexec_command(2, [sys.executable, '-m', 'theanompi_ext.train.worker', cfg],
                              mpiexec=mpiexec())
        rc, out, err, _ = job(cmd, env=dict(os.environ, **{AGE_VAR: '0.1'}))
        assert rc == 0, err[-3000:]
        assert not os.path.exists(left)
        assert os.path.exists(held)
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
        for path in (left, held):
            if os.path.exists(path):
                os.unlink(path)
