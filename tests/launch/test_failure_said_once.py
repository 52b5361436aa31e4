"""An error every rank finds at once is said once, by rank 0, for all ranks
(train/faults.say_failure); the launcher names the ranks as spans
(docs/faults.md, "Ending every rank")."""
import re
import threading
import time

import pytest

from theanompi_ext.collective import CollectiveTimeout
from theanompi_ext.errors import NonFiniteLoss
from theanompi_ext.launch.rank_notes import rank_list
from theanompi_ext.train import faults

from support.procs import job, mpi_cmd


@pytest.mark.parametrize('ranks, text', [
    ([0], '0'), ([0, 1], '0, 1'), ([0, 1, 2], '0-2'), ([5, 0, 2, 1, 3], '0-3, 5'),
    ([0, 1, 3, 4, 6, 7, 8], '0, 1, 3, 4, 6-8'), (list(range(256)), '0-255'),
    ([2, 2, 9], '2, 9')])
def test_rank_list(ranks, text):
    assert rank_list(ranks) == text


def test_said_once_one_line_for_one_text_else_one_per_text():
    assert faults.said_once(['E: x'] * 64, 64) == ['theanompi-ext: all 64 ranks failed: E: x']
    lines = ['E: a'] * 32 + ['E: b'] + ['E: a'] * 31
    assert faults.said_once(lines, 64) == [
        'theanompi-ext: ranks 0-31, 33-63 of 64 failed: E: a',
        'theanompi-ext: rank 32 of 64 failed: E: b']


class _Comm(object):
    """A job of ``size`` ranks seen from ``rank``; its agreement answers ``lines``
    after ``delay_s`` (or raises CollectiveTimeout when ``lines`` is None)."""

    def __init__(self, rank, size, lines, delay_s=0.0):
        self.rank, self.size, self.lines, self.delay_s = rank, size, lines, delay_s
        self.gathered = []

    def allgather_bounded(self, obj, timeout_s, label=None):
        self.gathered.append((obj, timeout_s, label))
        time.sleep(self.delay_s)
        if self.lines is None:
            raise CollectiveTimeout('not every rank took part')
        return self.lines


@pytest.fixture
def world(monkeypatch):
    def make(rank, size, lines, delay_s=0.0):
        comm = _Comm(rank, size, lines, delay_s)
        monkeypatch.setattr(faults, '_world', comm)
        return comm
    return make


NAN = NonFiniteLoss('non-finite loss (nan) at iteration 7')
TEXT = 'NonFiniteLoss: non-finite loss (nan) at iteration 7 [at step.py:9 in f]'


def test_agreed_rank_0_says_it_for_all_and_the_others_say_nothing(world, capsys):
    comm = world(0, 3, [TEXT] * 3)
    assert faults.say_failure(comm, NAN, 'step.py:9 in f') is True
    assert capsys.readouterr().err == 'theanompi-ext: all 3 ranks failed: %s\n' % TEXT
    (obj, timeout_s, label), = comm.gathered
    assert obj == TEXT and timeout_s == faults.AGREE_TIMEOUT_S and 'NonFiniteLoss' in label
    assert faults.say_failure(world(2, 3, [TEXT] * 3), NAN, 'step.py:9 in f') is True
    assert capsys.readouterr().err == ''


def test_no_agreement_says_the_own_line_once_and_aborts(world, capsys):
    comm = world(1, 2, None)
    assert faults.say_failure(comm, NAN, 'step.py:9 in f') is False
    assert capsys.readouterr().err == 'theanompi-ext: rank 1 of 2 failed: %s\n' % TEXT


def test_an_agreement_that_fails_otherwise_is_no_agreement(world, capsys, monkeypatch):
    # MPI's own error (a peer gone) instead of the bound's timeout: abort, line said
    comm = world(1, 2, [TEXT] * 2)
    monkeypatch.setattr(comm, 'allgather_bounded', lambda *a, **k: 1 / 0)
    assert faults.say_failure(comm, NAN, 'step.py:9 in f') is False
    assert capsys.readouterr().err == 'theanompi-ext: rank 1 of 2 failed: %s\n' % TEXT


def test_a_slow_agreement_has_the_own_line_said_first_and_once(world, capsys, monkeypatch):
    monkeypatch.setattr(faults, 'SAY_ALONE_S', 0.05)
    said = []
    comm = world(1, 2, None, delay_s=0.5)
    t0 = time.monotonic()
    thread = threading.Thread(target=lambda: said.append(faults.say_failure(comm, NAN, None)))
    thread.start()
    time.sleep(0.3)         # the timer has said it, the agreement still waits
    assert capsys.readouterr().err == ('theanompi-ext: rank 1 of 2 failed: NonFiniteLoss: '
                                       'non-finite loss (nan) at iteration 7\n')
    thread.join(5)
    assert said == [False] and time.monotonic() - t0 >= 0.5
    assert capsys.readouterr().err == ''


def test_not_all_ranks_errors_and_one_rank_say_their_own_line_at_once(world, capsys):
    comm = world(0, 2, [TEXT] * 2)
    assert faults.say_failure(comm, MemoryError('x'), None) is False
    assert comm.gathered == []
    assert capsys.readouterr().err == 'theanompi-ext: rank 0 of 2 failed: MemoryError: x\n'
    assert faults.say_failure(world(0, 1, [TEXT]), NAN, None) is True
    assert capsys.readouterr().err.startswith('theanompi-ext: rank 0 of 1 failed: NonFiniteLoss')


def _run(case, ranks):
    rc, out, err, _ = job(mpi_cmd(ranks, 'run_failing_together.py', case), timeout=120)
    return rc, err


def test_three_ranks_failing_alike_give_one_line():
    rc, err = _run('alike', 3)
    assert rc == 3, err[-3000:]
    said = [ln for ln in err.splitlines() if 'failed' in ln]
    assert said == ['theanompi-ext: all 3 ranks failed: NonFiniteLoss: non-finite loss (nan) at '
                    'iteration 7 [at %s]' % re.search(r'\[at (.*run_failing_together\.py:\d+ '
                                                      r'in fail)\]', err).group(1)], err[-3000:]


def test_three_ranks_failing_with_two_texts_give_a_line_per_text():
    rc, err = _run('differ', 3)
    assert rc == 3, err[-3000:]
    said = sorted(ln.split(' [at ')[0] for ln in err.splitlines() if 'failed' in ln)
    assert said == [
        'theanompi-ext: rank 1 of 3 failed: ReplicaMismatch: parameters differ; this rank '
        'holds copy B',
        'theanompi-ext: ranks 0, 2 of 3 failed: ReplicaMismatch: parameters differ; this rank '
        'holds copy A'], err[-3000:]


def test_a_rank_that_aborts_does_not_hide_the_others_errors():
    # rank 0 aborts 0.5 s after its line; ranks 1, 2 wait for an agreement that
    # cannot come, and say their own lines after SAY_ALONE_S, before the abort
    rc, err = _run('mixed', 3)
    assert rc == 3, err[-3000:]          # MemoryError's status, by MPI_Abort
    assert 'rank 0 of 3 failed: MemoryError: injected on rank 0' in err, err[-3000:]
    for r in (1, 2):
        assert err.count('rank %d of 3 failed: NonFiniteLoss: non-finite loss (inf)' % r) == 1, \
            err[-3000:]
    assert 'ranks failed' not in err, err[-3000:]
