"""A job told to stop stops, and what is on disk is whole and good (docs/faults.md).

Signals to the launcher (SIGTERM, SIGHUP, SIGINT, SIGKILL, also during a
checkpoint write), a rank stopped inside a write, corrupt and diverged
checkpoints, full disks for train and convert, and output folders (a
forgotten --resume, two jobs on one folder, bad output paths, resuming with
other options). Every job runs under a hard timeout, and every process it
started is watched: after each fault test none may be left.
"""
import fcntl
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

from theanompi_ext.errors import OutputFolderError
from theanompi_ext.files import atomic, isolated, sealed
from theanompi_ext.launch.mpiexec import is_openmpi
from theanompi_ext.launch.rank_notes import RANKS_PREFIX
from theanompi_ext.train import checkpoint, outdir
from theanompi_ext.train.config import TrainConfig

from support.configs import write_cfg
from support.paths import MPI_DIR
from support.jobs import (Job, good_checkpoint, signal_a_helper_thread, temporaries,
                          wait_for)
from support.suspend import rank_of
from support.procs import (command_words, descendants, explained, mpi_cmd, mpiexec,
                           shm_made_since, the_mpiexec)

JOB_TIMEOUT = 180
CLI = [sys.executable, '-m', 'theanompi_ext']
# A 2-rank CLI run that would train for a long time, checkpointing every step.
LONG = ['train', '--workers', '2', '--model', 'mlp', '--batch-per-worker', '8',
        '--epochs', '1000', '--warmup', 'none', '--checkpoint-every', '1',
        '--eval-every', '1000', '--quiet']
# runs the command after it with core files off (SIGQUIT's default action)
NO_CORE = ['sh', '-c', 'ulimit -c 0 && exec "$0" "$@"']


# --------------------------------------------------------------------------- helpers

def fault_line(err):
    m = re.search(r'FAULT \S+ rank \d+ pid (\d+) at ([0-9.]+) iteration (-?\d+)', err)
    assert m, err[-3000:]
    return int(m.group(1)), float(m.group(2)), int(m.group(3))


def signalled_when(job, ready, what, sig, pids=None):
    """Once ``ready()`` (within 120 s, the job still running), ``sig`` to the
    launcher (or to each of ``pids()``); (seconds until every process of the job
    was gone or None, its exit status). Whatever happens, nothing of the job is
    left (``job.finish``)."""
    try:
        wait_for(lambda: ready() or job.proc.poll() is not None, 120, what)
        assert job.proc.poll() is None, job.err()[-3000:]
        for pid in pids() if pids else [job.proc.pid]:
            os.kill(pid, sig)
        took = job.gone_within(20)
        return took, job.wait()
    finally:
        job.finish()


def cli(*argv, timeout=60):
    return subprocess.run(CLI + [str(a) for a in argv], capture_output=True, text=True,
                          timeout=timeout)


# --------------------------------------------------------------------------- signals

@pytest.mark.parametrize('sig', [signal.SIGTERM, signal.SIGHUP, signal.SIGINT,
                                 signal.SIGKILL], ids=lambda s: signal.Signals(s).name)
def test_signal_to_launcher_stops_every_rank(tmp_path, sig):
    """The launcher gets a signal at a random moment of a run that checkpoints every
    step: every rank and mpiexec end within a bounded time, the exit status is
    128 + the signal (SIGKILL: the launcher is just killed), the checkpoint on
    disk verifies. With SIGTERM a second job on the same --out is refused first.
    SIGINT and SIGHUP are given to a thread of the launcher other than its main
    one, as the kernel may deliver a signal sent to the process (once, that
    launcher ran on: launch/awake.py); the others are sent to the process."""
    out = tmp_path / 'run'
    to_a_thread = sig in (signal.SIGINT, signal.SIGHUP)
    job = Job(CLI + LONG + ['--out', str(out)], tmp_path)
    try:
        wait_for(lambda: (out / checkpoint.PREV_FILENAME).exists() or job.proc.poll() is not None,
                 120, 'the first checkpoints')
        assert job.proc.poll() is None, job.err()[-3000:]
        if sig == signal.SIGTERM:
            r = cli(*(LONG + ['--out', out, '--resume']))
            assert r.returncode == 2, r.stderr
            assert re.search(r'--out \S+ is in use by another job \(pid %d on ' % job.proc.pid,
                             r.stderr), r.stderr
        time.sleep(random.Random(sig).uniform(0.0, 1.0))
        if to_a_thread:
            signal_a_helper_thread(job.proc.pid, sig)
        else:
            os.kill(job.proc.pid, sig)
        took = job.gone_within(20)
        rc = job.wait()
    finally:
        job.finish()
    print('\n%s to the launcher%s -> every process of the job gone in %s s'
          % (signal.Signals(sig).name, ' (a helper thread)' if to_a_thread else '',
             took and '%.2f' % took))
    # the ranks get STOP_GRACE_S (3 s) to end before SIGKILL
    assert took is not None and took < 8, took
    assert rc == (-9 if sig == signal.SIGKILL else 128 + sig), (rc, job.err()[-3000:])
    if sig != signal.SIGKILL:
        assert 'stopped by %s: every rank of the job ended' % signal.Signals(sig).name \
            in job.err()
        assert not temporaries(out)
    assert good_checkpoint(out / checkpoint.FILENAME) >= 1
    # a writer killed mid-write may leave a temporary: the next start removes it
    c = TrainConfig(model='mlp', batch_per_worker=8, epochs=1000, warmup='none',
                    checkpoint_every=1, eval_every=1000, quiet=True, out=str(out), resume=True)
    outdir.prepare(c).release()
    assert not temporaries(out)


@pytest.mark.parametrize('sig', [signal.SIGTERM, signal.SIGINT],
                         ids=lambda s: signal.Signals(s).name)
def test_a_burst_of_stop_signals_is_one_stop(tmp_path, sig):
    """200 copies of the signal to the launcher within about 0.2 s (Ctrl-C pressed
    again and again, a scheduler and a user's `kill` together): one stop, 128 + the
    signal from the process itself, its line last, no traceback, nothing left, its
    notes folder removed. Before, the copies after the stop killed the launcher by
    the default action after its line (SIGTERM: -15 from Python, 6 runs in 6) or
    raised KeyboardInterrupt in its clean-up (SIGINT: a traceback, 3 in 3)."""
    out = tmp_path / 'run'
    job = Job(CLI + LONG + ['--out', str(out)], tmp_path, env={'TMPDIR': str(tmp_path)})
    try:
        wait_for(lambda: (out / checkpoint.PREV_FILENAME).exists() or job.proc.poll() is not None,
                 120, 'the first checkpoints')
        assert job.proc.poll() is None, job.err()[-3000:]
        for k in range(200):
            try:
                os.kill(job.proc.pid, sig)
            except ProcessLookupError:
                break
            time.sleep(0.0005 * (k % 5))
        took = job.gone_within(20)
        rc = job.wait()
    finally:
        job.finish()
    assert took is not None and took < 8, took
    assert rc == 128 + sig, (rc, job.err()[-3000:])
    err = job.err()
    assert err.rstrip().splitlines()[-1] == (
        'theanompi-ext: stopped by %s: every rank of the job ended (exit status %d)'
        % (signal.Signals(sig).name, 128 + sig)), err[-3000:]
    assert 'Traceback' not in err, err[-3000:]
    assert not [n for n in os.listdir(str(tmp_path)) if n.startswith(RANKS_PREFIX)]
    assert good_checkpoint(out / checkpoint.FILENAME) >= 1


def test_every_process_of_the_job_signalled_at_once(tmp_path):
    """SIGTERM to the launcher, mpiexec, its proxies and every rank at the same moment,
    as a batch scheduler ends a job (Slurm's scancel or time limit signals every
    process of the job step): the same stop as SIGTERM to the launcher alone (143, its
    line last, every process gone, the checkpoint whole, no temporary left), and
    mpiexec's line about the second signal it got held back (Open MPI's prterun: 'Abort
    is in progress...hit ctrl-c again to forcibly terminate', shown 2 times in 3 before)."""
    out = tmp_path / 'run'
    job = Job(CLI + LONG + ['--out', str(out)], tmp_path)
    took, rc = signalled_when(
        job, lambda: (out / checkpoint.PREV_FILENAME).exists(), 'the first checkpoints',
        signal.SIGTERM, lambda: [job.proc.pid] + descendants(job.proc.pid))
    print('\nSIGTERM to every process of the job -> every process gone in %s s'
          % (took and '%.2f' % took))
    assert took is not None and took < 8, took
    assert rc == 143, (rc, job.err()[-3000:])
    err = job.err()
    assert err.rstrip().splitlines()[-1] == \
        'theanompi-ext: stopped by SIGTERM: every rank of the job ended (exit status 143)', \
        err[-3000:]
    # told at most in the summary of mpiexec's lines held back
    assert not re.search(r'^Abort is in progress', err, re.M), err[-3000:]
    assert 'Traceback' not in err, err[-3000:]
    assert not temporaries(out)
    assert good_checkpoint(out / checkpoint.FILENAME) >= 1


@pytest.mark.parametrize('sig', [signal.SIGQUIT, signal.SIGUSR2],
                         ids=lambda s: signal.Signals(s).name)
def test_a_signal_not_caught_ends_every_rank_with_the_launcher(tmp_path, sig):
    """A signal the launcher does not catch and whose default ends a process
    (Ctrl-\\'s SIGQUIT; SIGUSR2 without --checkpoint-signal, as a scheduler's
    warning to a job that did not ask for one) ends the launcher at once, and the
    job goes as for SIGKILL: mpiexec follows it (PR_SET_PDEATHSIG), then every
    rank; the last checkpoint verifies. No core file: ulimit -c 0."""
    out = tmp_path / 'run'
    job = Job(NO_CORE + CLI + LONG + ['--out', str(out)], tmp_path)
    took, rc = signalled_when(job, (out / checkpoint.PREV_FILENAME).exists,
                              'the first checkpoints', sig)
    print('\n%s to the launcher -> every process of the job gone in %s s'
          % (signal.Signals(sig).name, took and '%.2f' % took))
    assert took is not None and took < 8, took
    assert rc == -sig, (rc, job.err()[-3000:])
    assert good_checkpoint(out / checkpoint.FILENAME) >= 1


@pytest.mark.parametrize('sig', [signal.SIGKILL, signal.SIGHUP],
                         ids=lambda s: signal.Signals(s).name)
def test_mpiexec_killed_from_outside_is_said_and_ends_every_rank(tmp_path, sig):
    """mpiexec itself killed by someone else (the OOM killer's SIGKILL; SIGHUP,
    which hydra does not catch): the launcher's last line says so, naming the
    signal and the ranks that had not finished, status 3 (restartable:
    train/restarts.classify); every rank ends, the checkpoint verifies. (Open
    MPI's prterun answers SIGHUP by sending every rank SIGTERM and exiting 1
    itself: told as the stop from outside of the test below, 143.)"""
    out = tmp_path / 'run'
    t0 = time.time()
    job = Job(CLI + LONG + ['--out', str(out)], tmp_path)
    killed = []
    took, rc = signalled_when(job, lambda: (out / checkpoint.PREV_FILENAME).exists() and
                              the_mpiexec(job.proc.pid), 'the first checkpoints', sig,
                              lambda: killed.extend(the_mpiexec(job.proc.pid)) or killed)
    # and what MPI left (Open MPI's prterun SIGKILLed leaves its ranks' sm_segment
    # files and its session folder): removed by the launcher (launch/mpi_leftovers.py)
    assert shm_made_since(t0) == []
    assert not os.path.exists(os.path.join(tempfile.gettempdir(), 'ompi.%d' % killed[0]))
    print('\n%s to mpiexec -> every process of the job gone in %s s'
          % (signal.Signals(sig).name, took and '%.2f' % took))
    assert took is not None and took < 8, took
    if sig == signal.SIGHUP and is_openmpi(mpiexec()):
        assert rc == 143, (rc, job.err()[-3000:])
        assert job.err().strip().splitlines()[-1] == stopped_from_outside(signal.SIGTERM), \
            job.err()[-3000:]
    else:
        assert rc == 3, (rc, job.err()[-3000:])
        assert re.search(r'theanompi-ext: mpiexec \(pid \d+ on \S+\) was killed by %s '
                         r'\(signal %d\), not by this launcher.*; its ranks ended with it; '
                         r'ranks 0, 1 of 2 had not finished training \(exit status 3\)$'
                         % (signal.Signals(sig).name, sig), job.err().strip().splitlines()[-1]), \
            job.err()[-3000:]
    assert good_checkpoint(out / checkpoint.FILENAME) >= 1


def stopped_from_outside(sig):
    """The launcher's last line for ``sig`` that reached both ranks from outside it
    (launch/signal_marks.py): a stop, or for SIGQUIT a kill."""
    if sig == signal.SIGQUIT:
        return ('theanompi-ext: every rank of the job (0, 1 of 2) was sent SIGQUIT, and not '
                'by this launcher: mpiexec passes a SIGQUIT it is sent on to every rank '
                '(`kill` of mpiexec), or a batch scheduler or `kill` signalled the ranks; '
                'each ended by it, as killed (exit status 3)')
    return ('theanompi-ext: every rank of the job (0, 1 of 2) was sent %s, and not by '
            'this launcher: mpiexec passes a stop signal it is sent on to every rank (`kill` '
            'of mpiexec), or a batch scheduler or `kill` signalled the ranks; the job was '
            'stopped (exit status %d)' % (signal.Signals(sig).name, 128 + sig))


@pytest.mark.parametrize('sig', [signal.SIGTERM, signal.SIGINT, signal.SIGQUIT],
                         ids=lambda s: signal.Signals(s).name)
def test_a_stop_signal_to_mpiexec_alone_stops_the_job_blaming_no_rank(tmp_path, sig):
    """SIGTERM to mpiexec alone (``kill`` of its PID; a supervisor that signals only
    the process it started): hydra passes it on to every rank, Open MPI's prterun
    sends every rank a SIGTERM of its own (for SIGINT too). Each rank marks the
    SIGTERM as it dies (launch/signal_marks.py), and the launcher says the job was
    stopped from outside, 143, which a restart supervisor does not restart; no rank
    is blamed, nothing is left, the checkpoint verifies. Before: ``rank 1 of 2
    died: Terminated (signal 15)``, status 15 and restarted (MPICH); status 1,
    "mpiexec gave no report" (Open MPI). SIGINT, which hydra passes on as it is:
    each rank marks it as it comes, even inside a checkpoint write, then takes it as
    Ctrl-C (``stopped by SIGINT``) and aborts; the launcher says every rank was sent
    SIGINT, 130, not restarted. Before: the rank whose abort ended the job was named
    (its note could not be told from a SIGINT to that rank alone). SIGQUIT, which
    hydra passes on too, is a kill, as for the launcher: 3, restartable, and the
    line names no rank (before: the first rank hydra saw die); prterun dies of it,
    and says so (3)."""
    from theanompi_ext.train.restarts import classify
    out = tmp_path / 'run'
    job = Job(NO_CORE + CLI + LONG + ['--out', str(out)], tmp_path)
    took, rc = signalled_when(job, lambda: (out / checkpoint.PREV_FILENAME).exists() and
                              the_mpiexec(job.proc.pid), 'the first checkpoints', sig,
                              lambda: the_mpiexec(job.proc.pid))
    print('\n%s to mpiexec alone -> every process of the job gone in %s s'
          % (signal.Signals(sig).name, took and '%.2f' % took))
    assert took is not None and took < 8, took
    last = job.err().strip().splitlines()[-1]
    assert 'died' not in job.err() and 'ended the job' not in job.err(), job.err()[-3000:]
    # hydra's banner (SIGTERM, SIGQUIT: "BAD TERMINATION ... a problem with your
    # application") is held, told in one line (launch/exit_noise.py)
    assert 'BAD TERMINATION' not in job.out() + job.err(), job.out()[-3000:]
    # nor MPICH's line of the abort of a rank that took SIGINT (quoted in the one line)
    assert not re.search(r'^Abort\(\d+\) on node', job.err(), re.M), job.err()[-3000:]
    assert good_checkpoint(out / checkpoint.FILENAME) >= 1
    if sig == signal.SIGQUIT:
        assert rc == 3, (rc, job.err()[-3000:])
        if is_openmpi(mpiexec()):
            assert re.match(r'theanompi-ext: mpiexec \(pid \d+ on \S+\) was killed by SIGQUIT',
                            last), job.err()[-3000:]
        else:
            assert last == stopped_from_outside(sig), job.err()[-3000:]
        assert classify(rc, last).restartable
        return
    # Open MPI's prterun sends every rank SIGTERM, whichever of the two it was sent
    got = signal.SIGINT if sig == signal.SIGINT and not is_openmpi(mpiexec()) else \
        signal.SIGTERM
    assert rc == 128 + got, (rc, job.err()[-3000:])
    assert last == stopped_from_outside(got), job.err()[-3000:]
    assert classify(rc, job.err()) == (False, 'the job was stopped by %s'
                                       % signal.Signals(got).name)


def the_ranks(job):
    """The PIDs of the job's ranks (by their command line and MPI rank variable)."""
    return [p for p in descendants(job.proc.pid) if rank_of(p) is not None]


@pytest.mark.parametrize('sig', [signal.SIGTERM, signal.SIGINT, signal.SIGQUIT],
                         ids=lambda s: signal.Signals(s).name)
def test_a_signal_to_each_rank_blames_no_rank(tmp_path, sig):
    """``sig`` sent to each rank itself, not to the launcher nor to mpiexec (a scheduler
    that signals the job's tasks, ``kill`` of the ranks' PIDs): the job was stopped from
    outside, as for a signal sent to mpiexec alone, and no rank is blamed; mpiexec's
    banners of it are held (hydra's, MPICH's line of a rank's abort after SIGINT, and
    Open MPI's framed messages of SIGINT and SIGQUIT: a rank's MPI_ABORT, prterun's
    report, each blaming the first rank to end). Under Open MPI a SIGTERM to each rank
    is told as the first rank's death (15, named): prterun sends the other ranks SIGTERM
    itself after a rank's own death, which marks them the same way; it never sends
    SIGINT or SIGQUIT (measured, 5.0.11). Before, under Open MPI, SIGQUIT named the
    first rank to die, and Open MPI's messages of either came before the line."""
    out = tmp_path / 'run'
    job = Job(NO_CORE + CLI + LONG + ['--out', str(out)], tmp_path)
    took, rc = signalled_when(job, lambda: (out / checkpoint.PREV_FILENAME).exists() and
                              len(the_ranks(job)) == 2, 'the first checkpoints', sig,
                              lambda: the_ranks(job))
    text = job.out() + job.err()
    last = job.err().replace('\0', '').strip().splitlines()[-1]
    assert took is not None and took < 8, (took, text[-3000:])
    assert good_checkpoint(out / checkpoint.FILENAME) >= 1
    if sig == signal.SIGTERM and is_openmpi(mpiexec()):
        assert rc == 15, (rc, text[-3000:])
        assert re.match(r'theanompi-ext: rank [01] of 2 \(pid \d+ on \S+\) died: Terminated '
                        r'\(signal 15\); mpiexec stopped the other ranks \(exit status 15\)$',
                        last), text[-3000:]
        return
    assert rc == (3 if sig == signal.SIGQUIT else 128 + sig), (rc, text[-3000:])
    assert last == stopped_from_outside(sig), text[-3000:]
    assert 'died' not in text and 'ended the job' not in text, text[-3000:]
    for banner in ('BAD TERMINATION', 'MPI_ABORT was invoked', 'prterun has exited',
                   'prterun noticed'):
        assert banner not in text, text[-3000:]
    assert not re.search(r'^Abort\(\d+\) on node', text, re.M), text[-3000:]


def test_mpich_proxy_killed_is_said_and_ends_every_rank(tmp_path):
    """MPICH's proxy (``hydra_pmi_proxy``, the ranks' parent) SIGKILLed, as the OOM
    killer may: mpiexec says only its own trail (``assert (!closed) failed``) and
    exits 255. The launcher sums that trail up in one line and its last line
    names the proxy and its host, status 3 (restartable); every rank ends, the
    checkpoint verifies (launch/proxy_lost.py). Before: status 255, hydra's
    four lines and "mpiexec gave no report"."""
    if is_openmpi(mpiexec()):
        pytest.skip("Open MPI starts no daemon on the launcher's host (prterun is the "
                    "ranks' parent: test_mpiexec_killed_from_outside_is_said...); its "
                    "daemons on other hosts: test_faults_across_hosts.py")
    from theanompi_ext.train.restarts import classify
    out = tmp_path / 'run'
    job = Job(CLI + LONG + ['--out', str(out)], tmp_path)

    def proxies():
        return [p for p in descendants(job.proc.pid)
                if os.path.basename(command_words(p)[0]) == 'hydra_pmi_proxy']
    took, rc = signalled_when(job, lambda: (out / checkpoint.PREV_FILENAME).exists() and
                              proxies(), 'the first checkpoints', signal.SIGKILL, proxies)
    print('\nSIGKILL to hydra_pmi_proxy -> every process of the job gone in %s s'
          % (took and '%.2f' % took))
    assert took is not None and took < 8, took
    err = job.err()
    last = err.strip().splitlines()[-1]
    assert rc == 3, (rc, err[-3000:])
    assert re.fullmatch(r"theanompi-ext: mpiexec lost the MPI proxy \(hydra_pmi_proxy\) of "
                        r"host %s during the run: the proxy ended \(killed, or the OOM "
                        r"killer\), or its host or the launcher's connection to it was lost; "
                        r"ranks 0, 1 of 2 ended without finishing training, with it "
                        r"\(exit status 3\)" % re.escape(socket.gethostname()), last), err
    # hydra's trail is summed up, not shown
    assert 'assert (!closed) failed' not in err and \
        re.search(r"\d+ lines of mpiexec's own while the job ended not shown \(the last: "
                  r"process manager error", err), err
    assert classify(rc, last).restartable
    assert good_checkpoint(out / checkpoint.FILENAME) >= 1


def test_closed_output_stops_every_rank(tmp_path):
    """The reader of the launcher's output goes away (``| head -1`` ended): the job
    is stopped as SIGPIPE would stop it (141), the launcher's last line says so on
    standard error, nothing is left, the checkpoint verifies. Before, the thread
    copying mpiexec's output died of the broken pipe, the ranks' next lines filled
    the unread pipe and the job blocked on them (measured: a 60-epoch run was still
    there 400 s later)."""
    from theanompi_ext.output_faults import CLOSED_WHY
    out = tmp_path / 'run'
    verbose = [a for a in LONG if a != '--quiet'] + ['--progress-every', '1']
    job = Job(['bash', '-c', 'set -o pipefail; "$@" | head -1', 'head'] + CLI + verbose +
              ['--out', str(out)], tmp_path)
    try:
        rc = job.wait(120)
        took = job.gone_within(20)
    finally:
        job.finish()
    assert rc == 128 + signal.SIGPIPE, (rc, job.err()[-3000:])
    assert took is not None, job.err()[-3000:]
    assert job.err().rstrip().endswith(
        'theanompi-ext: stopped %s: every rank of the job ended (exit status 141)'
        % CLOSED_WHY), job.err()[-3000:]
    assert 'Traceback' not in job.err(), job.err()[-3000:]
    assert not temporaries(out)
    if (out / checkpoint.FILENAME).exists():
        good_checkpoint(out / checkpoint.FILENAME)


@pytest.mark.parametrize('buffering', ['buffered', 'unbuffered'])
def test_output_that_cannot_be_written_is_dropped_and_the_job_goes_on(tmp_path, buffering):
    """Standard output on a full disk (/dev/full): one warning, the job's lines are
    dropped and it runs to its end (0), its outputs whole. Before, the thread
    copying mpiexec's output died of the error with a traceback, and the job's
    next 1,500 progress lines filled the unread pipe and blocked it; and with the
    launcher's output buffered (a user's default, not PYTHONUNBUFFERED) what it
    still held failed again at exit (status 120)."""
    out = tmp_path / 'run'
    argv = [a for a in LONG if a != '--quiet'] + ['--progress-every', '1', '--max-steps', '1500',
                                                  '--checkpoint-every', '500']
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONUNBUFFERED'}
    if buffering == 'unbuffered':
        env['PYTHONUNBUFFERED'] = '1'
    with open('/dev/full', 'w') as full:
        r = subprocess.run(CLI + argv + ['--out', str(out)], stdout=full, stderr=subprocess.PIPE,
                           text=True, timeout=JOB_TIMEOUT, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stderr.count("could not write the job's output to standard output ([Errno 28] "
                          "No space left on device): its lines are dropped from here; the job "
                          "goes on") == 1, r.stderr[-3000:]
    assert 'Traceback' not in r.stderr and 'Exception ignored' not in r.stderr, r.stderr[-3000:]
    assert json.loads((out / 'summary.json').read_text())['iterations'] == 1500
    assert good_checkpoint(out / checkpoint.FILENAME) == 1500


# Steps of the job whose output is not read for a while: enough that it still trains
# when the reader comes back after 15 s (about 1,700 steps/s here; 24,000 once ended
# within the 15 s in CI)
UNREAD_STEPS = 72000


def test_output_not_read_for_a_while(tmp_path):
    """The launcher's standard output is a pipe nobody reads for 15 s, 7 step timeouts (a
    frozen ssh terminal, Ctrl-S, a pager left open), then read to its end: the job
    ran on and ends well (0, every step), with a line where the lines it could not
    hold are missing, and lines the job wrote after the reader came back. Before,
    the copy blocked, then mpiexec, then the rank printing progress, and its peer's
    step timeout ended the job (measured: hydra's and the launcher's pipes took 6 s
    of this job's lines; after 15 s, exit 4, or 255 with no rank's line shown)."""
    out = tmp_path / 'run'
    argv = [a for a in LONG if a != '--quiet'] + [
        '--progress-every', '1', '--max-steps', str(UNREAD_STEPS), '--checkpoint-every',
        str(UNREAD_STEPS // 3), '--collective-timeout-s', '2']
    r, w = os.pipe()
    # a pipe of one page and a hold of 2 kB: lines are dropped under either MPI (Open
    # MPI's ranks write to a terminal of its own, so their progress, rewritten in place,
    # is a few lines a second)
    fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 4096)
    job = Job(CLI + argv + ['--out', str(out)], tmp_path, stdout=w,
              env={'THEANOMPI_EXT_OUTPUT_HOLD_MB': '0.002'})
    os.close(w)
    # read to its end whatever happens: a launcher left writing to a pipe held open
    # would be a process left behind, hiding this test's own failure
    reader = os.fdopen(r, 'rb')
    try:
        time.sleep(15)
        ended_early = job.proc.poll() is not None or (out / 'summary.json').exists()
        text = reader.read().decode()
        rc = job.wait()
    finally:
        reader.close()
        job.finish()
    # still training when the reader came back: else this job proved nothing
    assert not ended_early, ('the job ended within 15 s: raise UNREAD_STEPS', rc,
                             job.err()[-3000:])
    assert rc == 0, (rc, job.err()[-3000:])
    assert json.loads((out / 'summary.json').read_text())['iterations'] == UNREAD_STEPS
    # the first gap is the stall's (a hold of 2 kB also drops bursts after it)
    notes = [m for m in re.finditer(
        r"^theanompi-ext: (\d+) lines? \(.*?\) of the job's standard output (?:was|were) dropped "
        r"here over (\d+) s: it was not read as fast as the job wrote \(2000 bytes waited\); the "
        r"job went on$", text, re.M)]
    # repr: progress lines are rewritten in place (\r), which a terminal would hide
    assert notes and int(notes[0].group(2)) >= 5, repr(text[-3000:])
    after = text[notes[0].end():]
    assert re.search(r'progress: epoch \d+/1000 it \d+/\d+ ', after), repr(after[-3000:])
    assert 'no progress' not in job.err(), job.err()[-3000:]
    assert good_checkpoint(out / checkpoint.FILENAME) == UNREAD_STEPS


# a launcher started as nohup starts it (SIGHUP ignored), and as a shell without job
# control starts `cmd &` (SIGINT ignored)
IGNORING = [sys.executable, '-c', 'import os, signal, sys\n'
            'for s in (signal.SIGHUP, signal.SIGINT): signal.signal(s, signal.SIG_IGN)\n'
            'os.execv(sys.executable, [sys.executable] + sys.argv[1:])']


def test_signals_ignored_at_start_stay_ignored(tmp_path):
    """A launcher started with SIGHUP and SIGINT ignored (``nohup cmd &`` in a script)
    trains on through both, as its starter asked: a terminal's hangup must not end
    a run under nohup. SIGTERM still stops every rank (143)."""
    out = tmp_path / 'run'
    job = Job(IGNORING + ['-m', 'theanompi_ext'] + LONG + ['--out', str(out)], tmp_path)
    try:
        wait_for(lambda: (out / checkpoint.PREV_FILENAME).exists() or job.proc.poll() is not None,
                 120, 'the first checkpoints')
        assert job.proc.poll() is None, job.err()[-3000:]
        before = good_checkpoint(out / checkpoint.FILENAME)
        os.kill(job.proc.pid, signal.SIGHUP)
        signal_a_helper_thread(job.proc.pid, signal.SIGINT)
        os.kill(job.proc.pid, signal.SIGINT)
        time.sleep(2.0)
        assert job.proc.poll() is None, job.err()[-3000:]
        wait_for(lambda: good_checkpoint(out / checkpoint.FILENAME) > before, 30,
                 'training to go on after SIGHUP and SIGINT')
        os.kill(job.proc.pid, signal.SIGTERM)
        took = job.gone_within(20)
        rc = job.wait()
    finally:
        job.finish()
    assert took is not None and took < 8, took
    assert rc == 128 + signal.SIGTERM, (rc, job.err()[-3000:])
    err = job.err()
    assert 'stopped by SIGTERM: every rank of the job ended' in err
    assert 'SIGHUP' not in err and 'SIGINT' not in err, err[-3000:]
    assert good_checkpoint(out / checkpoint.FILENAME) > before


# Ctrl-C as a terminal gives it: SIGINT not ignored, whatever this test's starter did
DEFAULTING = [sys.executable, '-c', 'import os, signal, sys\n'
              'signal.signal(signal.SIGINT, signal.SIG_DFL)\n'
              'os.execv(sys.executable, [sys.executable] + sys.argv[1:])']


def test_ctrl_c_of_a_one_process_run_is_a_stop_not_a_failure(tmp_path):
    """``train --workers 1`` runs in the launcher's own process: Ctrl-C there ends it
    as it ends a job of several ranks, 130 and "stopped by SIGINT", its checkpoint
    whole and its folder free for ``--resume``. Before, it said "rank 0 of 1
    failed: KeyboardInterrupt" and ended with 3 (a failure, to a script)."""
    out = tmp_path / 'run'
    one = LONG[:LONG.index('--workers') + 1] + ['1'] + LONG[LONG.index('--workers') + 2:]
    job = Job(DEFAULTING + ['-m', 'theanompi_ext'] + one + ['--out', str(out)], tmp_path)
    try:
        wait_for(lambda: (out / checkpoint.PREV_FILENAME).exists() or job.proc.poll() is not None,
                 120, 'the first checkpoints')
        assert job.proc.poll() is None, job.err()[-3000:]
        os.kill(job.proc.pid, signal.SIGINT)
        took = job.gone_within(20)
        rc = job.wait()
    finally:
        job.finish()
    assert took is not None, job.err()[-3000:]
    assert rc == 128 + signal.SIGINT, (rc, job.err()[-3000:])
    err = job.err()
    assert err.rstrip().splitlines()[-1] == 'theanompi-ext: stopped by SIGINT (exit status 130)'
    assert 'failed' not in err and 'Traceback' not in err, err[-3000:]
    assert not temporaries(out)
    at = good_checkpoint(out / checkpoint.FILENAME)
    r = cli(*(one + ['--out', out, '--resume', '--max-steps', at + 2]), timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert good_checkpoint(out / checkpoint.FILENAME) == at + 2


@pytest.mark.parametrize('sig', [signal.SIGTERM, signal.SIGKILL],
                         ids=lambda s: signal.Signals(s).name)
def test_signal_during_checkpoint_write(tmp_path, sig):
    """The launcher is signalled while rank 0 is inside a checkpoint write (held
    there for 1 s after the data is written): with SIGTERM the write finishes and
    then the ranks stop; with SIGKILL the new checkpoint or the previous one is
    on disk, whole."""
    path = write_cfg(str(tmp_path / 'cfg.json'), out=str(tmp_path / 'run'), checkpoint_every=1,
                     max_steps=0, epochs=1000)
    job = Job(explained(mpi_cmd(2, 'run_faults.py', path, tmp_path, 'slowwrite', 0, 3, 1.0), 2),
              tmp_path)
    took, rc = signalled_when(job, lambda: 'FAULT slowwrite' in job.err(), 'the slow write',
                              sig)
    _, _, writing = fault_line(job.err())
    print('\n%s to the launcher during a write -> every process gone in %s s'
          % (signal.Signals(sig).name, took and '%.2f' % took))
    assert took is not None and took < 8, took
    on_disk = good_checkpoint(tmp_path / 'run' / checkpoint.FILENAME)
    if sig == signal.SIGTERM:
        assert rc == 143, job.err()[-3000:]
        assert on_disk == writing          # the write was finished, then the job stopped
        assert not temporaries(tmp_path / 'run')
    else:
        assert on_disk in (writing - 1, writing)


# --------------------------------------------------------------------------- hung writes

@pytest.mark.parametrize('fault,rank', [('stopwrite', 0), ('stopwrite', 1), ('stopfinal', 0)])
def test_rank_stopped_in_a_write_ends_the_job_naming_it(tmp_path, fault, rank):
    """SIGSTOP of a rank inside the checkpoint write after step 4 (rank 0 writes,
    rank 1 waits for it) or inside the final outputs: the watchdog's
    write_timeout_s ends the job with exit status 4, naming the stopped rank and
    the file; the previous checkpoint is on disk, whole (under Open MPI, or the one
    the stopped rank was about to write, whole; or that write cut by Open MPI's
    SIGKILL, its temporary then removed by the next start)."""
    run = tmp_path / 'run'
    path = write_cfg(str(tmp_path / 'cfg.json'), out=str(run), checkpoint_every=2,
                     write_timeout_s=3, stall_warn_s=1)
    job = Job(explained(mpi_cmd(2, 'run_faults.py', path, tmp_path, fault, rank, 4), 2),
              tmp_path)
    try:
        rc = job.wait()
        job.gone_within(5)
    finally:
        job.finish()
    err = job.err()
    pid, t_stop, _ = fault_line(err)
    what = ("final outputs in %s (written by rank 0)" % run if fault == 'stopfinal'
            else "checkpoint %s (written by rank 0)" % (run / checkpoint.FILENAME))
    assert rc == 4, (rc, err[-3000:])
    other = 1 - rank
    assert re.search(r"rank %d of 2 \(pid \d+ on \S+\): no progress for [0-9.]+ s in '%s' at "
                     r"step \d+ \(write_timeout_s=3\); not arrived: rank %d \(pid %d on \S+\) "
                     r"no answer" % (other, re.escape(what), rank, pid), err), err[-3000:]
    previous = 6 if fault == 'stopfinal' else 2
    left = temporaries(run)
    if left and is_openmpi(mpiexec()) and rank == 0:
        # Open MPI's SIGKILL 0.5 s after its SIGCONT can cut the write the stopped
        # writer resumed (a loaded machine: once in CI): its temporary stays, as any
        # SIGKILLed writer's, and the next start on the folder removes it
        from theanompi_ext.files.stale import remove_stale_temporaries
        assert all(n.endswith('.tmp-%d' % pid) for n in left), (pid, left)   # the writer's
        assert sorted(remove_stale_temporaries(str(run))) == sorted(left)
        left = temporaries(run)
    assert not left
    if not is_openmpi(mpiexec()):
        # hydra SIGKILLs every rank on MPI_Abort, the stopped one included
        assert good_checkpoint(run / checkpoint.FILENAME) == previous
        assert not (run / 'summary.json').exists()
        return
    # Open MPI's abort sends SIGCONT, SIGTERM (held in a write) and SIGKILL only
    # 0.5 s later: the stopped rank may finish the write it was stopped before;
    # what is on disk is whole either way (docs/openmpi.md)
    assert good_checkpoint(run / checkpoint.FILENAME) in (previous, 4 if rank == 0 else 2)
    if (run / 'summary.json').exists():
        assert fault == 'stopfinal'
        outputs = json.loads((run / 'summary.json').read_text())['outputs']
        for name, sha in outputs.items():
            assert sealed.sha256_of((run / name).read_bytes()) == sha


# --------------------------------------------------------------------------- corrupt checkpoints

@pytest.fixture(scope='module')
def finished_run(tmp_path_factory):
    """One short 2-rank run through the launcher (checkpoints every 2 steps, 6 steps)."""
    out = tmp_path_factory.mktemp('finished') / 'run'
    argv = SHORT + ['--out', str(out)]
    r = cli(*argv, timeout=JOB_TIMEOUT)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


SHORT = ['train', '--workers', '2', '--model', 'mlp', '--batch-per-worker', '8', '--epochs',
         '2', '--warmup', 'none', '--max-steps', '6', '--checkpoint-every', '2', '--quiet']


def copy_run(src, tmp_path):
    dst = tmp_path / 'run'
    shutil.copytree(str(src), str(dst))
    return dst


def test_finished_run_outputs_are_whole_and_recorded(finished_run):
    """summary.json names the SHA-256 of every other output; two good checkpoints kept."""
    s = json.loads((finished_run / 'summary.json').read_text())
    assert set(s['outputs']) == {'params.npz', 'curves.png'}
    for name, sha in s['outputs'].items():
        assert sealed.sha256_of((finished_run / name).read_bytes()) == sha
    assert good_checkpoint(finished_run / checkpoint.FILENAME) == 6
    assert good_checkpoint(finished_run / checkpoint.PREV_FILENAME) == 4
    assert not temporaries(finished_run)


@pytest.mark.parametrize('damage', ['flip', 'truncate'])
def test_corrupt_checkpoint_is_refused_with_the_way_back(finished_run, tmp_path, damage):
    """8 flipped bytes in the middle, or half the file: --resume exits 2 before
    launching, names the file and the cause, and says how to resume from the
    previous checkpoint, which then passes the same checks."""
    run = copy_run(finished_run, tmp_path)
    ck = run / checkpoint.FILENAME
    data = bytearray(ck.read_bytes())
    if damage == 'flip':
        mid = len(data) // 2
        data[mid:mid + 8] = bytes(b ^ 0xff for b in data[mid:mid + 8])
    else:
        data = data[:len(data) // 2]
    ck.write_bytes(bytes(data))
    r = cli(*(SHORT + ['--out', run, '--resume']))
    assert r.returncode == 2, r.stderr
    why = 'checksum mismatch' if damage == 'flip' else 'truncated'
    assert re.search(r'error: \S+checkpoint.h5: %s.*the previous checkpoint (\S+) \(iteration '
                     r'4\) is good: to resume from it, run `mv \1 \S+checkpoint.h5`' % why,
                     r.stderr), r.stderr
    assert ck.read_bytes() == bytes(data)                    # nothing was overwritten
    os.replace(str(run / checkpoint.PREV_FILENAME), str(ck))    # what the message says
    c = TrainConfig(model='mlp', batch_per_worker=8, epochs=2, warmup='none', max_steps=6,
                    checkpoint_every=2, quiet=True, out=str(run), resume=True)
    outdir.prepare(c).release()
    # both damaged: no way back but a new run
    ck.write_bytes(bytes(data))
    shutil.copy(str(ck), str(run / checkpoint.PREV_FILENAME))
    r = cli(*(SHORT + ['--out', run, '--resume']))
    assert r.returncode == 2 and 'is not good either' in r.stderr, r.stderr


def test_every_flipped_byte_and_every_cut_is_refused(finished_run):
    """A byte flipped anywhere (50 random places, the header included) or the file
    cut at any length (20 lengths) fails the check before HDF5 reads it."""
    data = (finished_run / checkpoint.FILENAME).read_bytes()
    rng = random.Random(3)
    for pos in [rng.randrange(len(data)) for _ in range(50)] + [0, 100, 511, 512]:
        bad = bytearray(data)
        bad[pos] ^= 1 << rng.randrange(8)
        with pytest.raises(sealed.CorruptFile):
            sealed.unseal(bytes(bad), 'ck')
    for cut in [rng.randrange(len(data)) for _ in range(20)]:
        with pytest.raises(sealed.CorruptFile):
            sealed.unseal(data[:cut], 'ck')
    assert sealed.unseal(data, 'ck') == data


def test_unsealed_hdf5_is_refused(tmp_path):
    import h5py
    p = tmp_path / 'old.h5'
    with h5py.File(p, 'w') as f:
        f['x'] = np.zeros(3)
    with pytest.raises(sealed.CorruptFile, match='has no checksum'):
        sealed.read_sealed(str(p))


# --------------------------------------------------------------------------- divergence

def test_diverged_state_is_never_saved(tmp_path):
    """--checkpoint-every 1 and an infinity in rank 1's parameters after step 3: every
    rank stops (exit 3) naming rank 1; the newest checkpoint is iteration 3, finite."""
    run = tmp_path / 'run'
    path = write_cfg(str(tmp_path / 'cfg.json'), out=str(run), checkpoint_every=1)
    job = Job(mpi_cmd(2, 'run_faults.py', path, tmp_path, 'corrupt', 1, 3, 'inf'), tmp_path)
    try:
        rc = job.wait()
    finally:
        job.finish()
    err = job.err()
    assert rc == 3, err[-3000:]
    assert re.search(r'DivergedState: the state after iteration 4 is not finite \(rank 1: '
                     r'parameters\); it was not saved: \S+checkpoint.h5 still holds '
                     r'the last good checkpoint', err), err[-3000:]
    assert good_checkpoint(run / checkpoint.FILENAME) == 3
    assert good_checkpoint(run / checkpoint.PREV_FILENAME) == 2


def test_non_finite_state_is_refused_before_writing(tmp_path):
    """checkpoint.save on a state with a NaN in the BN statistics: nothing written."""
    sys.path.insert(0, MPI_DIR)
    try:
        import ckpt_writer
    finally:
        sys.path.remove(MPI_DIR)
    tr = ckpt_writer.fake_trainer(str(tmp_path), 64)
    ckpt_writer.set_version(tr, 5)
    path = str(tmp_path / checkpoint.FILENAME)
    checkpoint.save(tr, path)
    before = (tmp_path / checkpoint.FILENAME).read_bytes()
    ckpt_writer.set_version(tr, 6)
    tr.net.stats[0].value[3] = np.nan
    with pytest.raises(checkpoint.DivergedState, match='rank 0: BN statistic bn.mean'):
        checkpoint.save(tr, path)
    assert (tmp_path / checkpoint.FILENAME).read_bytes() == before
    assert not (tmp_path / checkpoint.PREV_FILENAME).exists()


# --------------------------------------------------------------------------- full disks

@pytest.fixture
def full_disk(tmp_path):
    """A 64 KB tmpfs (needs root and mount)."""
    where = tmp_path / 'full'
    where.mkdir()
    if os.geteuid() != 0 or not shutil.which('mount'):
        pytest.skip('mounting a tmpfs needs root (CI runs as root)')
    r = subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=64k', 'tmpfs', str(where)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip('cannot mount a tmpfs here: %s' % r.stderr.strip())
    try:
        yield where
    finally:
        subprocess.run(['umount', '-l', str(where)])


@pytest.mark.root
def test_convert_into_a_full_disk(full_disk, monkeypatch, capsys):
    """convert: exit 3 and one line naming the file and the cause, nothing left on
    the disk; also when the free-space check is bypassed and HDF5's own write fails
    (the pinned HDF5 segfaults there: the writer runs in a child process)."""
    from theanompi_ext.data import convert
    target = str(full_disk / 'digits.h5')
    r = cli('convert', 'sklearn:digits', target)
    assert r.returncode == 3, r.stderr
    assert r.stderr.strip().count('\n') == 0
    assert re.match(r'theanompi-ext convert: error: %s: not enough free space to write the '
                    r'data set: needs [0-9.]+ KB, [0-9.]+ KB free$' % re.escape(target),
                    r.stderr.strip()), r.stderr
    assert os.listdir(str(full_disk)) == []
    monkeypatch.setattr(atomic, 'check_space', lambda *a, **k: None)
    assert convert.main(['sklearn:digits', target]) == 3
    err = capsys.readouterr().err.strip()
    assert err.count('\n') == 0 and err.startswith('theanompi-ext convert: error: %s: '
                                                   % target), err
    assert 'No space left on device' in err, err
    assert os.listdir(str(full_disk)) == []


@pytest.mark.root
def test_train_into_a_full_disk(full_disk, tmp_path):
    """train --workers 2 --out on a full disk: exit 3, rank 0 names the checkpoint and
    the cause in one line, no segfault, no temporary file left."""
    job = Job(CLI + SHORT + ['--out', str(full_disk)], tmp_path)
    try:
        rc = job.wait()
    finally:
        job.finish()
    err = job.err()
    assert rc == 3, (rc, err[-3000:])
    assert re.search(r'rank 0 of 2 failed: WriteError: %s: not enough free space to write the '
                     r'checkpoint: needs' % re.escape(str(full_disk / checkpoint.FILENAME)),
                     err), err[-3000:]
    assert 'Traceback' not in err and 'Segmentation' not in err
    assert not temporaries(full_disk)


@pytest.mark.root
def test_write_failing_mid_way_keeps_the_old_files(full_disk, monkeypatch):
    """The space check bypassed, a write that hits ENOSPC: WriteError naming the path
    and the cause; the old file (and, for a set of outputs, every old file) intact."""
    monkeypatch.setattr(atomic, 'free_bytes', lambda folder: None)
    small, big = full_disk / 'a.json', full_disk / 'b.npz'
    atomic.write_all({str(small): b'old a', str(big): b'old b'})
    with pytest.raises(atomic.WriteError, match=r'b.npz: could not write the checkpoint: '
                                                r'No space left on device'):
        atomic.write_atomic(str(big), os.urandom(200000), 'the checkpoint')
    with pytest.raises(atomic.WriteError, match='No space left on device'):
        atomic.write_all({str(small): b'new a', str(big): os.urandom(200000)}, 'the outputs')
    assert small.read_bytes() == b'old a' and big.read_bytes() == b'old b'
    assert sorted(os.listdir(str(full_disk))) == ['a.json', 'b.npz']


@pytest.mark.root
def test_json_and_figures_are_written_whole_or_not_at_all(full_disk, tmp_path, monkeypatch):
    """The benchmarks', timelines' and plots' files: a document that cannot be
    encoded, a figure that cannot be drawn, and a full disk all leave the old file."""
    path = tmp_path / 'r.json'
    atomic.write_json(str(path), {'a': [1, 2.5]}, indent=1)
    assert json.loads(path.read_text()) == {'a': [1, 2.5]}
    with pytest.raises(TypeError):
        atomic.write_json(str(path), {'a': object()})
    assert json.loads(path.read_text()) == {'a': [1, 2.5]}
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig = plt.figure()
    png = tmp_path / 'f.png'
    atomic.write_figure(fig, str(png), dpi=20)
    good = png.read_bytes()
    assert good[:8] == b'\x89PNG\r\n\x1a\n'
    with pytest.raises(ValueError, match='nosuch'):
        atomic.write_figure(fig, str(tmp_path / 'f.nosuch'))
    monkeypatch.setattr(atomic, 'free_bytes', lambda folder: None)
    for where in (full_disk / 'r.json', full_disk / 'f.png'):
        where.write_bytes(b'old')
    with pytest.raises(atomic.WriteError, match=r'r.json: could not write the results: No space'):
        atomic.write_json(str(full_disk / 'r.json'), list(range(100000)), 'the results')
    fig.gca().imshow(np.random.RandomState(0).rand(300, 300))    # noise: no compression
    with pytest.raises(atomic.WriteError, match=r'f.png: could not write the chart: No space'):
        atomic.write_figure(fig, str(full_disk / 'f.png'), 'the chart', dpi=100)
    plt.close(fig)
    assert sorted(os.listdir(str(tmp_path))) == ['f.png', 'full', 'r.json']
    assert png.read_bytes() == good
    assert {p.read_bytes() for p in full_disk.iterdir()} == {b'old'}


def test_isolated_writer_that_crashes_is_an_error(tmp_path):
    """run_isolated: a child killed by SIGSEGV becomes a WriteError with the cause;
    the temporary it left is removed; results and bad input come back as such."""
    target = str(tmp_path / 'x.h5')

    def crash():
        with open(target + '.tmp-%d' % os.getpid(), 'w') as f:
            f.write('partial')
        sys.stderr.write("HDF5-DIAG: error message = 'No space left on device'\n")
        os.kill(os.getpid(), signal.SIGSEGV)
    with pytest.raises(atomic.WriteError, match=r'x.h5: could not write the data set: No space '
                                                r'left on device; the writer crashed \(SIGSEGV\)'):
        isolated.run_isolated(crash, target, 'the data set')
    assert os.listdir(str(tmp_path)) == []
    assert isolated.run_isolated(lambda: {'n': 3}, target) == {'n': 3}
    with pytest.raises(ValueError, match='bad size'):
        isolated.run_isolated(lambda: (_ for _ in ()).throw(ValueError('bad size')), target)


def test_signal_during_a_write_waits_for_it(tmp_path):
    """SIGTERM sent while a file is being written: the write completes, then the
    process dies of SIGTERM."""
    target = tmp_path / 'f.bin'
    code = ('import os, signal, sys; from theanompi_ext.files import atomic, signals\n'
            'with signals.deferred_signals():\n'
            '    os.kill(os.getpid(), signal.SIGTERM)\n'
            '    atomic.write_atomic(sys.argv[1], b"x" * 1000)\n'
            'print("not reached")\n')
    r = subprocess.run([sys.executable, '-c', code, str(target)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == -signal.SIGTERM and 'not reached' not in r.stdout
    assert target.read_bytes() == b'x' * 1000 and os.listdir(str(tmp_path)) == ['f.bin']


# --------------------------------------------------------------------------- output folders

def test_forgotten_resume_is_refused(finished_run, tmp_path):
    run = copy_run(finished_run, tmp_path)
    before = (run / checkpoint.FILENAME).read_bytes()
    t0 = time.monotonic()
    r = cli(*(SHORT + ['--out', run]))
    assert r.returncode == 2, r.stderr
    assert re.search(r'--out \S+ holds another run \(checkpoint.h5, summary.json\); add --resume '
                     r'to continue it, or --overwrite', r.stderr), r.stderr
    assert time.monotonic() - t0 < 30            # refused before anything was launched
    assert (run / checkpoint.FILENAME).read_bytes() == before


def test_resume_with_options_that_change_the_trajectory_is_refused(finished_run, tmp_path):
    run = copy_run(finished_run, tmp_path)
    argv = [a for a in SHORT]
    argv[argv.index('--batch-per-worker') + 1] = '4'
    r = cli(*(argv + ['--out', run, '--resume', '--data-seed', '2', '--epochs', '3']))
    assert r.returncode == 2, r.stderr
    error = [ln for ln in r.stderr.splitlines() if 'error:' in ln]   # not the warnings
    assert len(error) == 1, r.stderr
    assert '--batch-per-worker 4 (the checkpoint has 8); --data-seed 2 (the checkpoint has 0)' \
        in error[0] and '--epochs' not in error[0].split('only')[0], r.stderr


def test_bad_output_paths_are_refused_before_launch(tmp_path):
    afile = tmp_path / 'afile'
    afile.write_text('x')
    for argv, msg in ((['--out', afile / 'sub'], '--out %s: cannot create the folder'
                       % (afile / 'sub')),
                      (['--timeline', tmp_path / 'missing' / 'trace'],
                       '--timeline %s: the folder %s does not exist'
                       % (tmp_path / 'missing' / 'trace', tmp_path / 'missing'))):
        r = cli(*(SHORT + argv))
        assert r.returncode == 2, r.stderr
        assert msg in r.stderr, r.stderr
    r = cli(*(SHORT + ['--out', tmp_path / 'r', '--resume', '--overwrite']))
    assert r.returncode == 2 and '--resume continues' in r.stderr, r.stderr


def test_a_relative_out_in_a_removed_working_directory_says_so(tmp_path, monkeypatch):
    """The shell's working directory removed under it (another job's clean-up):
    a relative ``--out`` names that, not a bare "No such file or directory"."""
    gone = tmp_path / 'gone'
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    with pytest.raises(OutputFolderError) as err:
        outdir.prepare(TrainConfig(out='run'))
    assert str(err.value) == ('--out run: cannot create the folder: the working directory it '
                              'is relative to was removed; give an absolute path')


def test_lock_refuses_a_second_job_and_a_dead_jobs_lock_is_no_obstacle(tmp_path):
    c = TrainConfig(out=str(tmp_path / 'run'))
    lock = outdir.prepare(c)
    try:
        r = cli(*(SHORT + ['--out', tmp_path / 'run']))
        assert r.returncode == 2, r.stderr
        assert '--out %s is in use by another job (pid %d on ' % (tmp_path / 'run', os.getpid()) \
            in r.stderr, r.stderr
    finally:
        lock.release()
    # the lock file of a job that died (SIGKILL) stays, but its flock died with it
    code = ('import os, sys; from theanompi_ext.train import outdir; '
            'from theanompi_ext.train.config import TrainConfig; '
            'outdir.prepare(TrainConfig(out=sys.argv[1])); os.kill(os.getpid(), 9)')
    subprocess.run([sys.executable, '-c', code, str(tmp_path / 'run')], timeout=60)
    assert 'pid' in (tmp_path / 'run' / outdir.LOCK_NAME).read_text()
    (tmp_path / 'run' / 'checkpoint.h5.tmp-999999').write_text('left by a killed writer')
    outdir.prepare(c).release()
    assert not temporaries(tmp_path / 'run')
