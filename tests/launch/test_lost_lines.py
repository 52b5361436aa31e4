"""A rank's own line on why it ended the job reaches the user even when the job's
output path lost it (``launch/lost_lines.py``), and a rank blocked on its own
output is said to be (``collective/watchdog.unread_output``).

The pieces without MPI, then one job: the launcher SIGSTOPped while its ranks
print progress (a debugger, a mistaken ``kill -STOP``), so that nobody reads
the job's output.
"""
import os
import re
import signal
import sys
import time


from theanompi_ext.collective import abort_alone
from theanompi_ext.collective.watchdog import PeerState, unread_output
from theanompi_ext.launch.launcher_report import LauncherReport
from theanompi_ext.launch.lost_lines import SaidLines, lost_lines
from theanompi_ext.launch.mpiexec import is_openmpi
from theanompi_ext.launch.rank_notes import (WHY_CHARS, read_rank_notes, read_rank_why,
                                             write_rank_note, write_rank_why)
from theanompi_ext.launch.why_ended import explain
from theanompi_ext.train import faults

from support.jobs import Job, wait_for
from support.pipes import full_pipe
from support.procs import alive, command_words, mpiexec

TIMEOUT_LINE = ("theanompi-ext: rank 1 of 2 (pid 22 on vm): no progress for 5.2 s in 'loss "
                "stats' at step 9 (collective_timeout_s=5); not arrived: rank 0 (pid 21 on vm) "
                "between steps (the last begun: step 8) for 5.2 s; aborting the job (exit "
                "status 4)")


def test_a_why_is_kept_whole_and_read_back(tmp_path):
    folder = str(tmp_path)
    assert read_rank_why(folder, 1) is None
    write_rank_why(folder, 1, TIMEOUT_LINE + '\n')
    assert read_rank_why(folder, 1) == TIMEOUT_LINE
    write_rank_why(folder, 2, 'x' * (WHY_CHARS + 50))
    assert read_rank_why(folder, 2) == 'x' * WHY_CHARS
    assert sorted(os.listdir(folder)) == ['rank1.why', 'rank2.why']    # no temporary left
    write_rank_note(folder, 1, 'failed 4')
    assert read_rank_notes(folder) == {1: (os.getpid(), os.uname()[1], 'failed 4')}


def test_the_abort_note_leaves_the_line_said(tmp_path, monkeypatch):
    """A rank's own failure line, said (train/faults), is left beside its note when it
    aborts; a rank that said none leaves only the note."""
    monkeypatch.setattr(abort_alone, '_REASON', [])
    folder = str(tmp_path)
    faults._AbortNote(folder, 0)(3)
    assert read_rank_notes(folder)[0][2] == 'failed 3' and read_rank_why(folder, 0) is None
    faults._OwnLine('theanompi-ext: rank 1 of 2 failed: ValueError: bad [at x.py:3]').say()
    faults._AbortNote(folder, 1)(3)
    assert read_rank_notes(folder)[1][2] == 'failed 3'
    assert read_rank_why(folder, 1) == 'theanompi-ext: rank 1 of 2 failed: ValueError: bad ' \
        '[at x.py:3]'


def test_only_lines_not_seen_are_lost(tmp_path):
    folder = str(tmp_path)
    said = SaidLines()
    for line in (b'epoch 1/2 loss 0.3\n', (TIMEOUT_LINE + '\n').encode(),
                 b'theanompi-ext: warning: something\n'):
        said.feed(line)
    assert said.lines == {TIMEOUT_LINE}          # only the ranks' own lines are kept
    write_rank_why(folder, 1, TIMEOUT_LINE)
    write_rank_why(folder, 0, 'theanompi-ext: rank 0 of 2 failed: OSError: disk')
    assert lost_lines(folder, [0, 1, 3], said) == {
        0: 'theanompi-ext: rank 0 of 2 failed: OSError: disk'}
    assert lost_lines(folder, [1], said) == {}


def _notes():
    return {0: (21, 'vm', 'running'), 1: (22, 'vm', 'failed 4')}


def test_the_launcher_says_a_lost_line_itself():
    """The rank that ended the job named with its own line when that line did not come
    through; hydra's 255 (its proxy ended by the rank's own bound) gives way to the
    rank's status; a line that came through is pointed at, as before."""
    report = LauncherReport()
    msg, status = explain(255, report, _notes(), 2, lost={1: TIMEOUT_LINE})
    assert status == 4
    assert msg == (
        "theanompi-ext: rank 1 of 2 (pid 22 on vm) ended the job (exit status 4); its own line "
        "did not come through (the job's output was held up or cut on its way here), and "
        "said: " + TIMEOUT_LINE[len('theanompi-ext: '):])
    msg, status = explain(4, report, _notes(), 2, lost={})
    assert (msg, status) == ('theanompi-ext: rank 1 of 2 (pid 22 on vm) ended the job (exit '
                             'status 4); its own line above says why', 4)
    # two ranks failed, one line lost
    notes = {0: (21, 'vm', 'failed 3'), 1: (22, 'vm', 'failed 3'), 2: (23, 'vm', 'running')}
    msg, _ = explain(3, report, notes, 3, lost={0: 'theanompi-ext: rank 0 of 3 failed: X: y'})
    assert msg.endswith('ended the job (exit status 3); their own line did not come through '
                        "(the job's output was held up or cut on its way here), and said: "
                        'rank 0 of 3 failed: X: y'), msg


def test_a_rank_blocked_on_its_output_says_so():
    r, w = full_pipe()
    room_r, room_w = os.pipe()
    try:
        assert unread_output(((w, 1), (room_w, 2))) == 1
        assert unread_output(((room_w, 1), (w, 2))) == 2
        os.read(r, 8192)
        assert unread_output(((w, 1), (room_w, 2))) == 0
    finally:
        for fd in (r, w, room_r, room_w):
            os.close(fd)
    where = PeerState(0, 7, 8, '', False, 5.2, False, unread=1).describe()
    assert where == ("between steps (the last begun: step 8) for 5.2 s, its standard output "
                     "full: not read (mpiexec, its MPI daemon or the launcher held up, or the "
                     "launcher's own output not read), a line it prints blocks it")
    assert PeerState(0, 7, 8, '', False, 5.2, False).describe() == \
        'between steps (the last begun: step 8) for 5.2 s'


def _ranks(job):
    """The job's rank processes still running (Python running the worker, not mpiexec,
    whose command line names it too; not a rank ended, not yet reaped)."""
    return [p for p in job.alive() if alive(p) and os.path.basename(
        command_words(p)[0]).startswith('python') and 'theanompi_ext.train.worker'
        in command_words(p)]


def test_the_launcher_held_up_while_its_ranks_print(tmp_path):
    """The launcher SIGSTOPped while rank 0 prints a progress line every step.

    MPICH: hydra blocks on its full pipe to the launcher, then rank 0 on its
    output; rank 1's watchdog ends the job naming rank 0 blocked on its output,
    and its bound ends rank 1's proxy with the line inside. Once continued, the
    launcher says that line itself: status 4, the line said once. Open MPI's
    prterun keeps its ranks' output without bound: the job goes on to its end.
    No checkpoints: a rank blocked so while the others wait in a checkpoint's
    phase holds them up to ``write_timeout_s`` (300 s), which is the bound there."""
    openmpi = is_openmpi(mpiexec())
    steps = 8000 if openmpi else 400000
    out = tmp_path / 'run'
    job = Job([sys.executable, '-m', 'theanompi_ext', 'train', '--workers', '2', '--model',
               'mlp', '--batch-per-worker', '8', '--epochs', '1000', '--warmup', 'none',
               '--progress-every', '1', '--max-steps', str(steps), '--eval-every', '1000',
               '--collective-timeout-s', '3', '--checkpoint', 'false', '--out', str(out)],
              tmp_path)
    try:
        wait_for(lambda: 'progress: epoch' in job.out() or job.proc.poll() is not None, 120,
                 'training')
        job.proc.send_signal(signal.SIGSTOP)
        t0 = time.monotonic()
        try:
            # MPICH: the job ends under the stopped launcher; Open MPI: it runs on
            while _ranks(job) and time.monotonic() - t0 < (8 if openmpi else 60):
                time.sleep(0.2)
            ranks_left = _ranks(job)
        finally:
            job.proc.send_signal(signal.SIGCONT)
        rc = job.wait(180)
    finally:
        job.finish()
    err = job.err()
    if openmpi:
        assert ranks_left, 'the ranks ended under the stopped launcher:\n' + err[-3000:]
        assert rc == 0, err[-3000:]
        assert 'no progress' not in err, err[-3000:]
        return
    assert not ranks_left, 'the job went on with the launcher stopped for 60 s'
    assert rc == 4, err[-3000:]
    why = re.findall(r"rank 1 of 2 \(pid \d+ on [^)]+\): no progress for [^;]+; not arrived: "
                     r"rank 0 \(pid \d+ on [^)]+\) [^;]*its standard output full[^;]*; "
                     r"aborting the job \(exit status 4\)", err)
    assert len(why) == 1, err[-3000:]                      # said once, wherever it came
    last = err.strip().splitlines()[-1]
    assert re.match(r'theanompi-ext: rank 1 of 2 \(pid \d+ on [^)]+\) ended the job \(exit '
                    r'status 4\); ', last), last
    assert why[0] in last or 'its own line above says why' in last, last
    # hydra's trail of the proxy that the rank's own bound ended: one line of ours
    assert not re.search(r'^\s*\[mpiexec@', err, re.M), err[-3000:]
