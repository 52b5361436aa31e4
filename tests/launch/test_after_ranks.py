"""An mpiexec that does not hear of its ranks' end (launch/after_ranks.py) and a
finished rank stuck in MPI_Finalize (collective/abort_alone.watch_finalize): the
launcher's watch on the ranks' notes, its last line and status, the rank's own
bound. Across emulated hosts with the launcher cut off: test_faults_across_hosts.py
(root)."""
import io
import os
import re
import subprocess
import sys
import time

import pytest

from support.procs import alive
from theanompi_ext.errors import BadInput
from theanompi_ext.launch.after_ranks import (AFTER_RANKS_S, AFTER_RANKS_VAR,
                                              FINALIZE_MARGIN_S, AfterRanks, after_ranks_s,
                                              ended, finalize_alone_s,
                                              settled)
from theanompi_ext.launch.rank_notes import read_rank_notes, write_rank_note


def test_the_wait_and_bad_values():
    assert after_ranks_s({}) == AFTER_RANKS_S == 20
    assert after_ranks_s({AFTER_RANKS_VAR: '2.5'}) == 2.5
    for bad in ('0', '-1', 'nan', 'inf', 'soon'):
        with pytest.raises(BadInput, match=re.escape("THEANOMPI_EXT_AFTER_RANKS_S=%r: not a "
                                                     "number of seconds > 0" % bad)):
            after_ranks_s({AFTER_RANKS_VAR: bad})
    # in a rank: the launcher's wait and a margin (a bad value: the default's)
    assert finalize_alone_s({AFTER_RANKS_VAR: '5'}) == 5 + FINALIZE_MARGIN_S
    assert finalize_alone_s({AFTER_RANKS_VAR: 'soon'}) == AFTER_RANKS_S + FINALIZE_MARGIN_S


def test_ended_rule():
    done = {0: (1, 'a', 'done 0'), 1: (2, 'b', 'failed 3')}
    assert ended(done, 2) and settled(done, 2)
    assert settled({0: (1, 'a', 'failed 4'), 1: (2, 'b', 'running')}, 2)
    assert not settled({0: (1, 'a', 'done 0'), 1: (2, 'b', 'running')}, 2)
    assert not ended(done, 3)                        # a rank has not noted itself
    assert not ended({**done, 2: (3, 'b', 'running')}, 3)
    assert not ended({}, 0)                          # the size unknown: never


def _job(seconds=30):
    return subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(%d)' % seconds])


def _watch(folder, size, wait_s=0.3):
    proc, stops = _job(), []

    def stop():
        stops.append(time.monotonic())
        proc.kill()
    watch = AfterRanks(proc, folder, size, stop, wait_s=wait_s, interval=0.05, reread_s=0.5)
    watch.start()
    return proc, watch, stops


def test_mpiexec_is_stopped_once_every_rank_has_ended(tmp_path):
    folder = str(tmp_path)
    write_rank_note(folder, 0, 'done 0')
    proc, watch, stops = _watch(folder, 2)
    time.sleep(0.8)
    assert not stops and proc.poll() is None          # rank 1 has not noted its end
    t0 = time.monotonic()
    write_rank_note(folder, 1, 'done 0')
    watch.join(10)
    assert watch.fired and stops and 0.3 <= stops[0] - t0 < 3
    assert proc.wait(5) is not None


def test_a_failed_rank_is_enough(tmp_path):
    """A rank that failed (it aborts the job) and one still running: mpiexec that has
    not ended the job by then cannot reach its hosts, and is stopped too."""
    folder = str(tmp_path)
    write_rank_note(folder, 1, 'running')
    proc, watch, stops = _watch(folder, 2)
    write_rank_note(folder, 0, 'failed 4')
    watch.join(10)
    assert watch.fired and stops
    assert proc.wait(5) is not None


def test_nothing_is_stopped_while_a_rank_runs(tmp_path):
    folder = str(tmp_path)
    write_rank_note(folder, 0, 'done 0')
    write_rank_note(folder, 1, 'running')
    proc, watch, stops = _watch(folder, 2)
    time.sleep(1.0)
    proc.kill()                                      # mpiexec ends by itself
    watch.join(5)
    assert not watch.is_alive() and not watch.fired and not stops


def _message(notes, size=2, times=None, lost=None):
    watch = AfterRanks(None, '', size, None, wait_s=20)
    return watch.message(notes, times, lost)


def test_the_launchers_line_says_what_the_ranks_did():
    text, status = _message({0: (11, 'a', 'done 0'), 1: (12, 'b', 'done 0')})
    assert status == 0
    assert text == ('theanompi-ext: every rank finished training; mpiexec had not ended 20 s '
                    'after every rank had (it lost its connection to their hosts, a, b?) and '
                    'was stopped (exit status 0)')
    text, status = _message({0: (11, 'a', 'done 0'), 1: (12, 'b', 'failed 3'),
                             2: (13, 'b', 'failed 4')}, size=3)
    assert status == 3
    assert text == ('theanompi-ext: rank 1 of 3 (pid 12 on b) ended the job (exit status 3); '
                    'mpiexec had not ended 20 s after every rank had (it lost its connection to '
                    'their hosts, a, b?) and was stopped; its own line, if it is not above, was '
                    'lost with that connection'), text
    # the same, its line kept beside its note (launch/lost_lines.py) and not seen
    text, _ = _message({0: (11, 'a', 'done 0'), 1: (12, 'b', 'failed 3')},
                       lost={1: 'theanompi-ext: rank 1 of 2 failed: OSError: [Errno 5] I/O'})
    assert text.endswith('was stopped; its own line did not come through (lost with that '
                         'connection), and said: rank 1 of 2 failed: OSError: [Errno 5] I/O'), text
    # a rank failed (its abort not passed on), another still running
    text, status = _message({0: (11, 'a', 'failed 4'), 1: (12, 'b', 'running')})
    assert status == 4
    assert 'ended the job (exit status 4); mpiexec had not ended 20 s after rank 0 failed' in text
    text, status = _message({0: (11, 'a', 'stopped 75'), 1: (12, 'b', 'stopped 75')})
    assert status == 75
    assert text.startswith('theanompi-ext: all 2 ranks stopped after the checkpoint, as asked: '
                           'the job can be resumed; mpiexec had not ended'), text


def test_a_rank_that_died_without_a_word():
    """A keeper's ``died`` (launch/rank_keeper.py) settles the job like a failure; the
    first rank to end badly, by its note's time, is the one named."""
    assert settled({0: (1, 'a', 'running'), 1: (2, 'b', 'died')}, 2)
    assert ended({0: (1, 'a', 'died'), 1: (2, 'b', 'died')}, 2)
    text, status = _message({0: (11, 'a', 'running'), 1: (12, 'b', 'died')})
    assert status == 3
    assert text == ("theanompi-ext: rank 1 of 2 (pid 12 on b) died: it ended without finishing "
                    "training and without a word (killed, or ended by MPI's own error handler; "
                    "its keeper on b noted it); mpiexec had not ended 20 s after rank 1 died (it "
                    "lost its connection to their hosts, a, b?) and was stopped (exit status 3)")
    # Open MPI: rank 1 killed, rank 0 then ended by the error handler: both died, the
    # first is named (and the restart supervisor restarts it, blaming that host)
    from theanompi_ext.train.restarts import classify, culprit
    both = {0: (11, 'a', 'died'), 1: (12, 'b', 'died')}
    text, status = _message(both, times={0: 2000, 1: 1000})
    assert status == 3 and text.startswith('theanompi-ext: rank 1 of 2 (pid 12 on b) died: ')
    assert 'after every rank had' in text
    assert classify(status, text).restartable and culprit(text) == (1, 'b')
    text, _ = _message(both, times={0: 1000, 1: 2000})
    assert text.startswith('theanompi-ext: rank 0 of 2 (pid 11 on a) died: ')
    # a rank's own failure noted first, a death after it (its abort's effect): the failure
    text, status = _message({0: (11, 'a', 'died'), 1: (12, 'b', 'failed 4')},
                            times={0: 2000, 1: 1000})
    assert status == 4 and 'rank 1 of 2 (pid 12 on b) ended the job (exit status 4)' in text
    # and the other way round: the death first, a watchdog's timeout after it
    text, status = _message({0: (11, 'a', 'failed 4'), 1: (12, 'b', 'died')},
                            times={0: 2000, 1: 1000})
    assert status == 3 and 'rank 1 of 2 (pid 12 on b) died' in text


def test_the_order_is_the_notes_order(tmp_path):
    """Without ``times``, the notes' own times in the folder give the order."""
    folder = str(tmp_path)
    write_rank_note(folder, 1, 'died')
    time.sleep(0.05)
    write_rank_note(folder, 0, 'died')
    watch = AfterRanks(None, folder, 2, None, wait_s=20)
    text, _ = watch.message(read_rank_notes(folder))
    assert text.startswith('theanompi-ext: rank 1 of 2 (pid %d on ' % os.getpid()), text
    os.utime(os.path.join(folder, 'rank0'), ns=(1, 1))      # rank 0's note the older
    text, _ = watch.message(read_rank_notes(folder))
    assert text.startswith('theanompi-ext: rank 0 of 2 '), text


def test_the_launcher_refuses_a_bad_wait_before_it_starts_anything():
    from theanompi_ext.launch.postmortem import run_explained
    err = io.StringIO()
    old = os.environ.get(AFTER_RANKS_VAR)
    os.environ[AFTER_RANKS_VAR] = '-3'
    try:
        status = run_explained(['/nonexistent/mpiexec'], size=2, err=err)
    finally:
        if old is None:
            del os.environ[AFTER_RANKS_VAR]
        else:
            os.environ[AFTER_RANKS_VAR] = old
    assert status == 2
    assert err.getvalue() == ("theanompi-ext: THEANOMPI_EXT_AFTER_RANKS_S='-3': not a number of "
                              'seconds > 0\n')


# A pretend MPI daemon: a process that calls itself prted, starts the rank, prints
# the watcher's and the rank's PIDs, then the rank's status, then waits ``linger`` s.
DAEMON = ('import ctypes, subprocess, sys, time\n'
          'ctypes.CDLL(None).prctl(15, b"prted", 0, 0, 0)\n'
          'rank = subprocess.Popen([sys.executable, "-c", %r], stdout=subprocess.PIPE, '
          'text=True)\n'
          'print(rank.stdout.readline().strip(), flush=True)\n'
          'print(rank.wait(), flush=True)\n'
          'time.sleep(%g)\n')
RANK = ('import os, time\nfrom theanompi_ext.collective.abort_alone import watch_finalize\n'
        'print(watch_finalize(%g).pid, os.getpid(), flush=True)\n'
        'time.sleep(%g)\n')


def _gone_soon(pid, within=2.0):
    deadline = time.monotonic() + within
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not alive(pid)


def test_a_finished_rank_stuck_in_finalize_ends_with_its_daemon():
    """The rank hangs (in MPI_Finalize, here a sleep) and its daemon waits for a
    launcher it cannot reach: both are SIGKILLed ``alone_s`` after the rank's work
    was done."""
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, '-c', DAEMON % (RANK % (0.5, 30), 30)],
                         timeout=20, capture_output=True, text=True)
    assert res.returncode == -9, res
    assert time.monotonic() - t0 < 10
    watcher, rank = res.stdout.split()[:2]
    # a SIGKILL is delivered, not waited for: the rank may take a moment to go
    assert _gone_soon(int(rank)) and _gone_soon(int(watcher))


def test_a_rank_that_ends_leaves_its_daemon_alone():
    """A rank that ends by itself (MPI_Finalize returned) and a daemon that ends by
    itself: nothing killed, and the watcher gone with them."""
    res = subprocess.run([sys.executable, '-c', DAEMON % (RANK % (3, 0), 0.2)],
                         timeout=20, capture_output=True, text=True)
    watcher, _, status = res.stdout.split()
    assert status == '0' and res.returncode == 0, res
    assert _gone_soon(int(watcher))
