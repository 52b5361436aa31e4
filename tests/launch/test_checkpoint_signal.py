"""A checkpoint asked for by a signal (``train --checkpoint-signal USR1``), end to end.

A batch scheduler's warning reaches the launcher (SLURM's ``--signal=B:USR1@120``)
or the ranks themselves; either way every rank writes the same iteration's
checkpoint, and the run goes on or stops with status 75 to be resumed. The
reference for "nothing changed" is the same run without any signal: the
parameters at the end must be bitwise equal (the resume is exact and a
checkpoint does not touch the state).
"""
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

from theanompi_ext.launch.forwarded_signal import ForwardedSignal
from theanompi_ext.train import checkpoint, checkpoint_request
from theanompi_ext.train.attempt import START_NAME
from theanompi_ext.train.restarts import LOG_NAME

from support.jobs import Job, catches, good_checkpoint, wait_for
from support.paths import root_on_path

CLI = [sys.executable, '-m', 'theanompi_ext']
# about 2,700 steps of 2 ranks: a few seconds, long enough to be signalled mid-run
RUN = ['train', '--workers', '2', '--model', 'mlp', '--batch-per-worker', '8',
       '--epochs', '30', '--warmup', 'none', '--decay-epochs', '20', '--eval-every', '1000']
ITERATIONS = 30 * 89


def rank_pid(job, rank):
    """The PID of rank ``rank`` among the job's processes (its MPI's rank variable)."""
    for pid in list(job.seen):
        try:
            with open('/proc/%d/environ' % pid, 'rb') as f:
                env = dict(v.split(b'=', 1) for v in f.read().split(b'\0') if b'=' in v)
        except OSError:
            continue
        if env.get(b'PMI_RANK', env.get(b'OMPI_COMM_WORLD_RANK')) == str(rank).encode() \
                and b'theanompi_ext' in open('/proc/%d/cmdline' % pid, 'rb').read():
            return pid
    return None


def params(out):
    with np.load(str(out / 'params.npz')) as f:
        return {k: f[k] for k in f.files}


def assert_same_params(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        assert np.array_equal(a[k], b[k]), k


def signal_once(job, ready, what, pid, sig):
    """Send ``sig`` to ``pid`` once ``ready()``; the job's exit status once it has
    ended, with nothing of it left running."""
    try:
        wait_for(lambda: ready() or job.proc.poll() is not None, 60, what)
        assert job.proc.poll() is None, job.err()[-3000:]
        os.kill(pid, sig)
        return job.wait()
    finally:
        job.finish()


def stopped_at(job, sig):
    """The iteration of rank 0's line of a stop after the checkpoint ``sig`` asked for."""
    m = re.search(r'stopped by %s after the checkpoint of iteration (\d+)' % sig.name,
                  job.err())
    assert m, job.err()[-3000:]
    return int(m.group(1))


@pytest.fixture(scope='module')
def straight(tmp_path_factory):
    """The parameters of the run trained without any signal."""
    tmp = tmp_path_factory.mktemp('straight')
    job = Job(CLI + RUN + ['--out', str(tmp / 'run'), '--quiet'], tmp)
    try:
        assert job.wait() == 0, job.err()[-3000:]
    finally:
        job.finish()
    return params(tmp / 'run')


@pytest.mark.parametrize('restarts', [0, 1], ids=['plain', 'max-restarts'])
def test_a_signal_before_the_ranks_start_stops_them_after_a_checkpoint(tmp_path, straight,
                                                                       restarts):
    """SIGUSR1 to the launcher as soon as it catches it, before any rank catches it:
    it waits for the ranks (a rank that has not yet caught it would die of it), then
    every rank writes the checkpoint of the next iteration and stops with 75; no
    process is left; ``--max-restarts`` does not restart it; the resumed run ends
    with the straight run's parameters, bit for bit."""
    out = tmp_path / 'run'
    job = Job(CLI + RUN + ['--out', str(out), '--quiet', '--checkpoint-signal', 'USR1',
                           '--on-checkpoint-signal', 'stop', '--max-restarts', str(restarts)],
              tmp_path)
    try:
        wait_for(lambda: catches(job.proc.pid, signal.SIGUSR1) or job.proc.poll() is not None,
                 60, 'the launcher to catch SIGUSR1')
        early = [r for r in (rank_pid(job, 0), rank_pid(job, 1))
                 if r is not None and catches(r, signal.SIGUSR1)]
        assert not early      # no rank could take it yet: the request must wait
        os.kill(job.proc.pid, signal.SIGUSR1)
        rc = job.wait()
    finally:
        job.finish()
    err = job.err()
    assert rc == 75, err[-3000:]
    m = re.search(r'stopped by SIGUSR1 after the checkpoint of iteration (\d+) \(%s\): '
                  r'continue with --resume \(exit status 75\)'
                  % re.escape(str(out / checkpoint.FILENAME)), err)
    assert m and m.group(1), err[-3000:]
    at = int(m.group(1))
    assert 1 <= at < ITERATIONS
    assert err.strip().splitlines()[-1] == (
        'theanompi-ext: all 2 ranks stopped after the checkpoint, as asked: the job can be '
        'resumed (exit status 75)'), err[-3000:]
    assert 'failed' not in err and 'died' not in err, err[-3000:]
    assert good_checkpoint(out / checkpoint.FILENAME) == at
    assert not (out / 'params.npz').exists()      # stopped: no final outputs
    if restarts:
        import json
        log = json.loads((out / LOG_NAME).read_text())
        assert log['result']['status'] == 75 and 'signal' in log['result']['why'], log
        assert not log.get('failures'), log
    resumed = Job(CLI + RUN + ['--out', str(out), '--quiet', '--resume'], tmp_path)
    try:
        assert resumed.wait() == 0, resumed.err()[-3000:]
    finally:
        resumed.finish()
    assert_same_params(params(out), straight)


def test_a_signal_to_one_rank_checkpoints_every_rank_and_training_goes_on(tmp_path, straight):
    """SIGUSR1 to rank 1 alone (a scheduler may signal the ranks, not the launcher):
    rank 0 reports the checkpoint that every rank wrote at the next iteration, and the
    run ends normally with the straight run's parameters."""
    out = tmp_path / 'run'
    job = Job(CLI + RUN + ['--out', str(out), '--checkpoint-signal', 'SIGUSR1'], tmp_path)
    try:
        # once every rank has joined (the start mark): before, MPICH's own handler,
        # which MPI_Init installs, would take it on the rank
        wait_for(lambda: (out / START_NAME).exists() or job.proc.poll() is not None, 60,
                 'the ranks to start')
        pid = rank_pid(job, 1)
        assert pid is not None and catches(pid, signal.SIGUSR1), job.err()[-3000:]
        os.kill(pid, signal.SIGUSR1)
        rc = job.wait()
    finally:
        job.finish()
    text = job.out()
    assert rc == 0, job.err()[-3000:]
    m = re.search(r'checkpoint of iteration (\d+) written, as SIGUSR1 asked \(%s\); '
                  r'training goes on' % re.escape(str(out / checkpoint.FILENAME)), text)
    assert m and 1 <= int(m.group(1)) < ITERATIONS, text[-3000:]
    assert len(re.findall('as SIGUSR1 asked', text)) == 1
    assert_same_params(params(out), straight)


def test_one_process_run_stops_after_the_checkpoint(tmp_path):
    """``--workers 1`` runs in the launcher's own process: it catches the signal
    itself, writes the checkpoint and ends with 75."""
    out = tmp_path / 'run'
    job = Job(CLI + RUN[:2] + ['1'] + RUN[3:] + [
        '--out', str(out), '--quiet', '--checkpoint-signal', 'usr2',
        '--on-checkpoint-signal', 'stop'], tmp_path)
    rc = signal_once(job, lambda: catches(job.proc.pid, signal.SIGUSR2), 'SIGUSR2 caught',
                     job.proc.pid, signal.SIGUSR2)
    assert rc == 75, job.err()[-3000:]
    at = stopped_at(job, signal.SIGUSR2)
    assert good_checkpoint(out / checkpoint.FILENAME) == at


def test_inside_your_own_mpiexec(tmp_path):
    """The ranks of the user's own ``mpiexec -n 2 theanompi-ext train`` (as on a
    cluster) catch the signal themselves; mpiexec passes it on to them: a checkpoint
    mid-epoch, rank 0's line and 75 through mpiexec."""
    from theanompi_ext.launch.mpiexec import MPI_ENV_DEFAULTS, mpiexec_command
    from support.procs import mpiexec
    out = tmp_path / 'run'
    job = Job(mpiexec_command(2, CLI + RUN[:1] + RUN[3:] + [
        '--out', str(out), '--quiet', '--checkpoint-signal', 'USR1', '--on-checkpoint-signal',
        'stop'], mpiexec=mpiexec()), tmp_path, env=MPI_ENV_DEFAULTS)
    # once the first epoch's checkpoint is written every rank caught it long before
    rc = signal_once(job, lambda: (out / checkpoint.FILENAME).exists(), 'the first checkpoint',
                     job.proc.pid, signal.SIGUSR1)
    assert rc == 75, job.err()[-3000:]
    at = stopped_at(job, signal.SIGUSR1)
    assert 89 < at < ITERATIONS
    assert good_checkpoint(out / checkpoint.FILENAME) == at


@pytest.mark.parametrize('argv, words', [
    (['--checkpoint-signal', 'TERM'], "invalid option checkpoint_signal='TERM': 'TERM' cannot "
     'ask for a checkpoint: choose from USR1, USR2'),
    (['--checkpoint-signal', 'KILL'], 'choose from USR1, USR2'),
    (['--checkpoint-signal', 'USR1', '--out', ''], 'needs --out and checkpoints'),
    (['--checkpoint-signal', 'USR1', '--checkpoint', 'false'], 'needs --out and checkpoints'),
    (['--on-checkpoint-signal', 'stop'], 'stop after the checkpoint of which signal?'),
    (['--checkpoint-signal', 'USR1', '--on-checkpoint-signal', 'halt'],
     "invalid option on_checkpoint_signal='halt': choose from continue, stop"),
])
def test_bad_checkpoint_signal_options_are_refused_before_launch(tmp_path, argv, words):
    import subprocess
    r = subprocess.run(CLI + RUN + ['--out', str(tmp_path / 'run')] + argv,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert words in r.stderr, r.stderr
    assert not (tmp_path / 'run').exists()


# --------------------------------------------------------------------------- the parts

@pytest.mark.parametrize('given, name', [('usr1', 'USR1'), ('SIGUSR2', 'USR2'), (' Usr2 ', 'USR2'),
                                         (str(int(signal.SIGUSR1)), 'USR1'), ('', '')])
def test_signal_names(given, name):
    assert checkpoint_request.canonical_name(given) == name


@pytest.mark.parametrize('given', ['TERM', 'SIGINT', 'HUP', 'KILL', 'STOP', '9', 'SEGV', 'FOO',
                                   '999'])
def test_signals_that_cannot_ask_for_a_checkpoint(given):
    with pytest.raises(ValueError, match='cannot ask for a checkpoint: choose from USR1, USR2'):
        checkpoint_request.canonical_name(given)


TAKEN_ONCE = """
import os, signal
from theanompi_ext.train import checkpoint_request
checkpoint_request.install('USR2')
assert signal.SIGUSR2 in signal.pthread_sigmask(signal.SIG_BLOCK, [])   # held back
assert checkpoint_request.taken() is None
os.kill(os.getpid(), signal.SIGUSR2)
os.kill(os.getpid(), signal.SIGUSR2)     # two before a step: one checkpoint
assert checkpoint_request.taken() == signal.SIGUSR2
assert checkpoint_request.taken() is None
assert signal.SIGUSR2 not in signal.sigpending()
print('taken once')
"""


def test_a_caught_signal_is_taken_once():
    """In a process of one thread, as a rank starts: two signals pending before a step
    are one request. (Run in a child: a thread of this test process that does not
    block the signal would take one of the two, at a moment of the kernel's choice,
    after the first ``taken()``: CI saw it once.)"""
    res = subprocess.run([sys.executable, '-c', TAKEN_ONCE], capture_output=True, text=True,
                         timeout=60, env=root_on_path())
    assert res.returncode == 0 and res.stdout.strip() == 'taken once', res.stdout + res.stderr


SAME_REQUEST = """
import contextlib, os, signal, time
import numpy as np
from theanompi_ext.train import checkpoint_request as cr

class Comm(object):            # one rank: the vote's sum is its own note
    @contextlib.contextmanager
    def bounded(self, *args):
        yield
    def allreduce(self, buf):
        return buf

cr.install('USR1')
cr.SAME_REQUEST_S = 0.5
said = []
os.kill(os.getpid(), signal.SIGUSR1)
assert cr.vote(Comm(), 1, 5) == (True, False)                  # asked
os.kill(os.getpid(), signal.SIGUSR1)                             # while it is written
cr.after_checkpoint(signal.SIGUSR1, 'continue', 1, 'ck.h5', False, said.append)
assert cr.vote(Comm(), 2, 5) == (False, False), 'a copy that came during the write'
os.kill(os.getpid(), signal.SIGUSR1)                             # just after it
assert cr.vote(Comm(), 3, 5) == (False, False), 'a copy that came just after'
time.sleep(0.6)
os.kill(os.getpid(), signal.SIGUSR1)                             # a new request
assert cr.vote(Comm(), 4, 5) == (True, False), 'a request after SAME_REQUEST_S'
assert cr.vote(Comm(), 5, 5, True) == (False, True)              # the clock alone
assert said == ['checkpoint of iteration 1 written, as SIGUSR1 asked (ck.h5); training goes on']
print('one request')
"""


def test_copies_of_a_signal_just_answered_ask_for_no_second_checkpoint():
    """A scheduler that warns the ranks and the launcher: each rank gets the signal
    twice, the launcher's copy through mpiexec a little later. A copy that comes
    while the checkpoint it asked for is written, or within SAME_REQUEST_S after,
    asks for nothing more; a signal after that is a new request. (In a child: a
    thread of this process that does not block the signal could take it.)"""
    res = subprocess.run([sys.executable, '-c', SAME_REQUEST], capture_output=True,
                         text=True, timeout=60, env=root_on_path())
    assert res.returncode == 0 and res.stdout.strip() == 'one request', \
        res.stdout + res.stderr


# A process that asked for the signal starts a child (as Theano's import runs
# `g++ -v`), then its whole process group gets the signal, as mpiexec (hydra)
# and schedulers send it. HOW is 'held' (our install) or 'caught' (a handler alone).
CHILD_IN_GROUP = ('import os, signal, subprocess, sys\n'
                  'from theanompi_ext.train import checkpoint_request as cr\n'
                  'if sys.argv[1] == "held":\n'
                  '    cr.install("USR1")\n'
                  'else:\n'
                  '    signal.signal(signal.SIGUSR1, lambda s, f: None)\n'
                  'child = subprocess.Popen(["sleep", "1"])\n'
                  'os.killpg(0, signal.SIGUSR1)\n'
                  'print(child.wait(), cr.taken(), flush=True)\n')


@pytest.mark.parametrize('how', ['held', 'caught'])
def test_a_signal_to_the_process_group_spares_the_children(how):
    """Held back, the signal reaches the process (its next step takes it) and not
    its children, which inherit it blocked; caught by a handler alone, as before,
    it killed the child (Theano's compiler probe: a rank without C code)."""
    import subprocess
    r = subprocess.run([sys.executable, '-c', CHILD_IN_GROUP, how], capture_output=True,
                       text=True, timeout=60, start_new_session=True)
    assert r.returncode == 0, r.stderr[-2000:]
    child_rc, taken = r.stdout.split()
    if how == 'held':
        assert (int(child_rc), taken) == (0, str(int(signal.SIGUSR1))), r.stdout
    else:
        assert int(child_rc) == -signal.SIGUSR1, r.stdout


RANK_WITH_CHILD = ('import os, signal, subprocess, sys, time\n'
                   'from theanompi_ext.train import checkpoint_request as cr\n'
                   'cr.install("USR1")\n'
                   'from mpi4py import MPI\n'
                   'child = subprocess.Popen(["sleep", "3"])\n'
                   'open(os.path.join(sys.argv[1], "ready%d" % MPI.COMM_WORLD.rank), "w").close()\n'
                   'rc = child.wait()\n'
                   'print(MPI.COMM_WORLD.rank, rc, cr.taken(), flush=True)\n')


def test_mpiexec_passes_the_signal_on_to_the_ranks_and_not_to_their_children(tmp_path):
    """SIGUSR1 to mpiexec reaches both ranks, whose children (started before it
    came, alive while it comes) go on to their end."""
    from theanompi_ext.launch.mpiexec import MPI_ENV_DEFAULTS, mpiexec_command
    from support.procs import mpiexec
    job = Job(mpiexec_command(2, [sys.executable, '-c', RANK_WITH_CHILD, str(tmp_path)],
                              mpiexec=mpiexec()), tmp_path, env=MPI_ENV_DEFAULTS)
    rc = signal_once(job, lambda: all((tmp_path / ('ready%d' % r)).exists() for r in (0, 1)),
                     'both ranks and their children', job.proc.pid, signal.SIGUSR1)
    assert rc == 0, job.err()[-3000:]
    lines = sorted(job.out().split('\n'))
    assert [line.split() for line in lines if line] == [
        [str(r), '0', str(int(signal.SIGUSR1))] for r in (0, 1)], job.out()


HELD_THEN_FORWARDED = ('import os, signal\n'
                       'from theanompi_ext.train import checkpoint_request as cr\n'
                       'from theanompi_ext.train.cli import forwarded_checkpoint_signal\n'
                       'from theanompi_ext.train.config import TrainConfig\n'
                       'cr.install("USR1")\n'
                       'os.kill(os.getpid(), signal.SIGUSR1)\n'   # early: held back
                       'fwd = forwarded_checkpoint_signal(TrainConfig(checkpoint_signal="USR1"))\n'
                       'blocked = lambda: signal.SIGUSR1 in signal.pthread_sigmask(signal.SIG_BLOCK, [])\n'
                       'print(fwd.pending, blocked(), flush=True)\n'
                       'fwd.pending = False\n'
                       'os.kill(os.getpid(), signal.SIGUSR1)\n'   # now caught by the launcher
                       'print(fwd.pending, flush=True)\n'
                       'fwd.restore()\n'
                       'print(blocked(), cr.taken(), flush=True)\n')


def test_the_launcher_takes_a_held_request_and_lets_mpiexec_have_the_signal():
    """A request held back before the launcher's forwarding starts is passed on, and
    while it forwards the launcher does not hold the signal back (mpiexec, which
    it starts, must not inherit it blocked); after, it is held again."""
    import subprocess
    r = subprocess.run([sys.executable, '-c', HELD_THEN_FORWARDED], capture_output=True,
                       text=True, timeout=60, start_new_session=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split('\n')[:3] == ['True False', 'True', 'True None'], r.stdout


# A rank's first moments: until Python catches the signal its default ends the
# rank; then MPI starts (MPICH's MPI_Init puts its own SIGUSR1 handler in front).
NUMPY_SIGNALS_ITSELF = ('import os, signal, sys\n'
                     'os.kill(os.getpid(), signal.SIGUSR1)\n'
                     'sys.exit(42)\n')


@pytest.mark.parametrize('asked', [True, False], ids=['asked', 'not asked'])
def test_a_rank_catches_the_signal_before_its_imports(tmp_path, asked):
    """The worker catches it before importing numpy and the config (0.3 s of a
    rank's start): a numpy that signals its own process as it is imported finds
    the rank alive (status 42, its exit), where a rank not asked dies of it."""
    import json
    import subprocess
    from theanompi_ext.launch.worker_job import CONFIG_VAR, WORKER_MODULE
    fake = tmp_path / 'numpy'
    fake.mkdir()
    (fake / '__init__.py').write_text(NUMPY_SIGNALS_ITSELF)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(tmp_path)] + [p for p in [os.environ.get('PYTHONPATH')] if p]))
    env[CONFIG_VAR] = json.dumps({'model': 'mlp', 'checkpoint_signal': 'usr1' if asked else ''})
    r = subprocess.run([sys.executable, '-m', WORKER_MODULE], env=env, capture_output=True,
                       text=True, timeout=60, cwd=str(tmp_path))
    assert r.returncode == (42 if asked else -signal.SIGUSR1), r.stderr[-2000:]


MPI_START = ('import os, signal, sys, time\n'
             'from theanompi_ext.train import checkpoint_request as cr\n'
             'cr.install("USR1")\n'
             'from mpi4py import MPI\n'               # MPI_Init: MPICH's handler in front
             'os.kill(os.getpid(), signal.SIGUSR1)\n'
             'time.sleep(0.1)\n'
             'print(MPI.Get_library_version().split()[0], cr.taken(), flush=True)\n')


def test_a_signal_once_mpi_has_started_still_reaches_a_rank_that_caught_it_before():
    """MPICH's handler passes the signal on to the one installed before MPI_Init,
    so a signal during a rank's MPI start is not lost (Open MPI leaves it alone)."""
    import subprocess
    from theanompi_ext.launch.mpiexec import MPI_ENV_DEFAULTS, mpiexec_command
    from support.procs import mpiexec
    r = subprocess.run(mpiexec_command(1, [sys.executable, '-c', MPI_START], mpiexec=mpiexec()),
                       env=dict(os.environ, **MPI_ENV_DEFAULTS), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[1:] == [str(int(signal.SIGUSR1))], r.stdout


CATCHER = ('import signal, sys, time\n'
           'signal.signal(signal.SIGUSR1, lambda s, f: print("got", flush=True))\n'
           'print("ready", flush=True)\n'
           'time.sleep(30)\n')


def _catcher():
    import subprocess
    proc = subprocess.Popen([sys.executable, '-c', CATCHER], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == 'ready\n'
    return proc


def test_the_launcher_passes_a_request_on_only_once_the_job_is_ready():
    """Held while ``ready()`` is false, passed on once it is true; one still held
    when its job ends waits for the next job (an attempt after a restart)."""
    import time
    fwd = ForwardedSignal(signal.SIGUSR1).install()
    first = second = None
    try:
        ready = []
        first = _catcher()
        fwd.attach(first, lambda: bool(ready))
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.5)
        assert fwd.pending and fwd.forwarded == 0
        ready.append(True)
        wait_for(lambda: fwd.forwarded == 1, 10, 'the request passed on')
        assert first.stdout.readline() == 'got\n'
        first.kill()
        first.wait()
        os.kill(os.getpid(), signal.SIGUSR1)     # its job has ended: kept
        time.sleep(0.5)
        fwd.detach()
        assert fwd.pending and fwd.forwarded == 1
        second = _catcher()
        fwd.attach(second)
        wait_for(lambda: fwd.forwarded == 2, 10, 'the request passed on to the next job')
        assert second.stdout.readline() == 'got\n'
    finally:
        fwd.detach()
        fwd.restore()
        for p in (first, second):
            if p is not None:
                p.kill()
                p.wait()
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL
