"""A SIGTERM, SIGINT or SIGQUIT that reached a rank is marked as it comes
(launch/signal_marks.py).

Each case runs a small process that marks itself as a rank does
(``mark_signal``), then signals it: the mark is there, and the process still
ends by SIGTERM's (SIGQUIT's) default action, at once, or raises
KeyboardInterrupt for SIGINT. No MPI: the jobs that use the marks are in
test_stop_and_disk.py and test_faults.py.
"""
import os
import resource
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from theanompi_ext import stop_signals
from theanompi_ext.launch import signal_marks
from theanompi_ext.launch.signal_marks import (signalled_ranks, stop_from_outside,
                                               stopped_from_outside)

from support.paths import ROOT

# the process prints "ready" once marked (and once in the block, for "held")
_MARKED = textwrap.dedent('''
    import os, signal, sys, time
    from theanompi_ext.launch.signal_marks import mark_signal
    marked = sorted(int(s) for s in mark_signal(sys.argv[1], 3))
    how = sys.argv[2]
    if how == 'interrupted':
        try:
            print(marked, flush=True)   # in the try: a SIGINT right after it is caught
            time.sleep(60)
        except KeyboardInterrupt:
            print('KeyboardInterrupt', flush=True)
        sys.exit(0)
    print(marked, flush=True)
    if how == 'spin':
        while True:
            sum(range(1000))
    elif how == 'held':
        from theanompi_ext.files.signals import deferred_signals
        try:
            with deferred_signals():
                print('in the block', flush=True)
                time.sleep(2.0)
            print('after the block', flush=True)
            time.sleep(60)
        except KeyboardInterrupt:
            print('KeyboardInterrupt', flush=True)
    elif how == 'fork':
        pid = os.fork()
        if pid == 0:
            print(os.getpid(), flush=True)      # once the fork's hooks have run
            time.sleep(60)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        print('child', os.WTERMSIG(status) if os.WIFSIGNALED(status) else -1, flush=True)
    else:
        time.sleep(60)
''')


ALL = '[2, 3, 15]'        # SIGINT, SIGQUIT, SIGTERM


def _start(folder, how, **popen):
    proc = subprocess.Popen([sys.executable, '-c', _MARKED, str(folder), how], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True, **popen)
    return proc, proc.stdout.readline().strip()


def _gone_within(proc, seconds):
    t0 = time.monotonic()
    try:
        proc.wait(seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None
    return time.monotonic() - t0


@pytest.mark.parametrize('how', ['sleep', 'spin'])
def test_a_marked_rank_still_dies_by_sigterm_at_once_and_leaves_its_mark(tmp_path, how):
    """Sleeping in C, or busy in Python: the default action still ends it (status
    -15, well within a second; measured 3-5 ms), and rank 3's mark holds its stack."""
    proc, ready = _start(tmp_path, how)
    assert ready == ALL
    assert signalled_ranks(tmp_path) == set()          # opened, not yet written
    assert (tmp_path / 'rank3.sigterm').exists()
    os.kill(proc.pid, signal.SIGTERM)
    took = _gone_within(proc, 5)
    assert took is not None and took < 1, took
    assert proc.returncode == -signal.SIGTERM
    assert signalled_ranks(tmp_path) == {3}
    assert 'most recent call first' in (tmp_path / 'rank3.sigterm').read_text()


def _held_and_marked(folder, sig):
    """A process marked, inside a write's block (2 s: room for a loaded machine) when
    ``sig`` comes: marked at once, still in the block 0.3 s later. Returns the
    process."""
    proc, ready = _start(folder, 'held')
    assert ready == ALL
    assert proc.stdout.readline().strip() == 'in the block'
    os.kill(proc.pid, sig)
    time.sleep(0.3)
    assert proc.poll() is None                  # still in its 2 s block
    assert signalled_ranks(folder, sig) == {3}
    return proc


def test_a_sigterm_held_by_a_file_write_is_marked_when_it_comes(tmp_path):
    """A write holds SIGTERM (files/signals.deferred_signals sets a handler of
    Python's for its time): the mark is written when the signal comes, while the
    write goes on (Open MPI's prterun SIGKILLs 0.25 s after its SIGTERM: a mark
    left for the end of the write would be lost), and the signal then ends the
    process after the block, by the default action, marked again."""
    proc = _held_and_marked(tmp_path, signal.SIGTERM)
    took = _gone_within(proc, 5)
    assert took is not None and 0.5 < took < 4, took      # the block's 1.7 s left
    assert proc.returncode == -signal.SIGTERM
    assert proc.stdout.read() == ''        # ended as the block ended, by the default
    assert (tmp_path / 'rank3.sigterm').read_text().count('most recent call first') == 2


def test_a_sigint_is_marked_and_still_raises_keyboard_interrupt(tmp_path):
    """SIGINT (hydra passes a ``kill -INT`` of mpiexec on to every rank): the mark is
    written, then Python's handler runs as before (KeyboardInterrupt: the rank says
    ``stopped by SIGINT`` and aborts); no SIGTERM mark."""
    proc, ready = _start(tmp_path, 'interrupted')
    assert ready == ALL
    os.kill(proc.pid, signal.SIGINT)
    assert proc.stdout.readline().strip() == 'KeyboardInterrupt'
    assert _gone_within(proc, 5) is not None and proc.returncode == 0
    assert signalled_ranks(tmp_path, signal.SIGINT) == {3}
    assert signalled_ranks(tmp_path) == set()
    assert 'most recent call first' in (tmp_path / 'rank3.sigint').read_text()


def test_a_sigquit_is_marked_and_still_ends_the_rank(tmp_path):
    """SIGQUIT (hydra passes it on too): marked, then its default action ends the
    process (no core file: its limit is 0 here)."""
    proc, ready = _start(tmp_path, 'sleep',
                         preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_CORE, (0, 0)))
    assert ready == ALL
    os.kill(proc.pid, signal.SIGQUIT)
    assert _gone_within(proc, 5) is not None
    assert proc.returncode == -signal.SIGQUIT
    assert signalled_ranks(tmp_path, signal.SIGQUIT) == {3}
    assert signalled_ranks(tmp_path, signal.SIGINT) == signalled_ranks(tmp_path) == set()


def test_a_sigint_held_by_a_file_write_is_marked_when_it_comes(tmp_path):
    """A rank inside a checkpoint write holds SIGINT too: marked at once (the first
    rank's abort may kill this one before its write ends), then raised as
    KeyboardInterrupt as the block ends."""
    proc = _held_and_marked(tmp_path, signal.SIGINT)
    assert proc.stdout.readline().strip() == 'KeyboardInterrupt'
    assert _gone_within(proc, 5) is not None and proc.returncode == 0


def test_a_forked_childs_sigterm_is_not_the_ranks(tmp_path):
    """A forked child (the isolated writer of files/isolated.py) sent SIGTERM dies
    by it but writes no mark for the rank."""
    proc, _ = _start(tmp_path, 'fork')
    child = int(proc.stdout.readline())
    os.kill(child, signal.SIGTERM)
    assert proc.stdout.readline().strip() == 'child %d' % signal.SIGTERM
    assert _gone_within(proc, 10) is not None
    assert signalled_ranks(tmp_path) == set()


def test_sigterm_ignored_at_start_is_left_ignored_and_unmarked(tmp_path):
    """Whoever started the rank ignored SIGTERM: it stays ignored, no mark file."""
    proc, ready = _start(tmp_path, 'sleep',
                         preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN))
    try:
        assert ready == '[2, 3]'                       # SIGINT, SIGQUIT
        os.kill(proc.pid, signal.SIGTERM)
        assert _gone_within(proc, 0.5) is None        # still there: killed by the wait
    finally:
        proc.kill()
        proc.wait()
    assert not (tmp_path / 'rank3.sigterm').exists()


def test_a_mark_that_cannot_be_opened_is_no_error(tmp_path):
    proc, ready = _start(tmp_path / 'missing', 'sleep')
    proc.kill()
    proc.wait()
    assert ready == '[]'


def test_every_rank_marked_needs_one_signal_on_each(tmp_path):
    """What holds mpiexec's banner (launch/exit_noise.py): each rank marked the same
    signal (SIGINT too: Open MPI's banners then report the abort of a rank that took
    it; SIGTERM not under Open MPI); different signals, or some ranks, are not enough."""
    from theanompi_ext.launch.signal_marks import every_rank_marked
    assert not every_rank_marked(str(tmp_path), 2)
    (tmp_path / 'rank0.sigterm').write_text('Stack:\n')
    (tmp_path / 'rank1.sigquit').write_text('Stack:\n')
    assert not every_rank_marked(str(tmp_path), 2)
    (tmp_path / 'rank0.sigint').write_text('Stack:\n')
    (tmp_path / 'rank1.sigint').write_text('')          # opened, never written
    assert not every_rank_marked(str(tmp_path), 2)
    (tmp_path / 'rank1.sigint').write_text('Stack:\n')
    assert every_rank_marked(str(tmp_path), 2) and not every_rank_marked(str(tmp_path), 3)
    assert every_rank_marked(str(tmp_path), 2, openmpi=True)
    (tmp_path / 'rank1.sigint').unlink()
    (tmp_path / 'rank1.sigterm').write_text('Stack:\n')
    assert every_rank_marked(str(tmp_path), 2) and not every_rank_marked(str(tmp_path), 3)
    assert not every_rank_marked(str(tmp_path), 0)
    # Open MPI: prterun's own SIGTERM reaches every rank after one rank's death
    assert not every_rank_marked(str(tmp_path), 2, openmpi=True)


def test_signalled_ranks_reads_only_written_marks(tmp_path):
    (tmp_path / 'rank0.sigterm').write_text('Stack (most recent call first):\n')
    (tmp_path / 'rank12.sigterm').write_text('x')
    (tmp_path / 'rank1.sigterm').write_text('')          # opened, never signalled
    (tmp_path / 'rank2').write_text('1 host running\n')  # a note, not a mark
    (tmp_path / 'rankx.sigterm').write_text('x')
    (tmp_path / 'rank3.sigterm.tmp').write_text('x')
    assert signalled_ranks(tmp_path) == {0, 12}
    assert signalled_ranks(tmp_path / 'missing') == set()


@pytest.mark.parametrize('signalled, size, failed, reported, openmpi, outside', [
    ({0, 1}, 2, [], signal.SIGTERM, False, True),     # hydra's report of the first death
    ({0, 1}, 2, [], None, False, True),
    ({0, 1}, 2, [], None, True, True),                # prterun signalled: no report
    ({0, 1, 2, 3}, 4, [], signal.SIGTERM, False, True),
    ({1}, 2, [], signal.SIGTERM, False, False),       # one rank killed alone
    ({0, 2, 3}, 4, [], signal.SIGTERM, False, False),
    ({0, 1}, 2, [], signal.SIGTERM, True, False),     # prterun's report: rank 1 first
    ({0, 1}, 2, [1], signal.SIGTERM, False, False),   # a rank's own error first
    ({0, 1}, 2, [], signal.SIGKILL, False, False),
    ({0, 1}, 2, [], 0, False, False),                 # a rank exited with a code
    (set(), 0, [], None, False, False),
])
def test_stopped_from_outside(signalled, size, failed, reported, openmpi, outside):
    assert stopped_from_outside(signalled, size, failed, reported, openmpi) is outside


def _notes(*states):
    return {r: (100 + r, 'vm', state) for r, state in enumerate(states)}


@pytest.mark.parametrize('marks, states, reported, openmpi, within, found', [
    ({'sigterm': [0, 1]}, ['running', 'running'], signal.SIGTERM, False, False, 'SIGTERM'),
    ({'sigterm': [0, 1]}, ['running', 'running'], None, False, True, None),  # ours
    # hydra passed SIGINT on: each rank that took it noted its stop and aborted, one
    # inside a write was killed first (no note); the abort is no report of a death
    ({'sigint': [0, 1]}, ['failed 130', 'running'], None, False, False, 'SIGINT'),
    ({'sigint': [0, 1]}, ['failed 130', 'failed 130'], None, False, True, 'SIGINT'),
    ({'sigint': [1]}, ['running', 'failed 130'], None, False, False, None),  # one rank
    ({'sigint': [0, 1]}, ['failed 3', 'failed 130'], None, False, False, None),
    ({'sigint': [0, 1]}, ['failed 130', 'failed 130'], signal.SIGKILL, False, False, None),
    # Open MPI, SIGINT to one rank: its abort, then prterun's SIGTERM to the other
    ({'sigint': [1], 'sigterm': [0]}, ['running', 'failed 130'], None, True, False, None),
    ({'sigterm': [0, 1]}, ['failed 143', 'running'], None, False, False, 'SIGTERM'),
    # hydra passed SIGQUIT on: it reports the first death by it
    ({'sigquit': [0, 1]}, ['running', 'running'], signal.SIGQUIT, False, True, 'SIGQUIT'),
    ({'sigquit': [1]}, ['running', 'running'], signal.SIGQUIT, False, False, None),
    # Open MPI: prterun reports the first death, then sends the others SIGTERM, never
    # SIGQUIT (or SIGINT): every rank marked SIGQUIT is a SIGQUIT to each from outside
    ({'sigquit': [0, 1]}, ['running', 'running'], signal.SIGQUIT, True, False, 'SIGQUIT'),
    ({'sigquit': [1], 'sigterm': [0]}, ['running', 'running'], signal.SIGQUIT, True, False,
     None),
    ({'sigquit': [0, 1]}, ['running', 'running'], signal.SIGSEGV, True, False, None),
])
def test_which_signal_stopped_the_job_from_outside(tmp_path, marks, states, reported,
                                                   openmpi, within, found):
    """``stop_from_outside`` over the marks in a folder and the ranks' notes: a
    rank's note of its stop by the signal itself is no error of its own; SIGTERM
    marks count only where nothing within the job sent SIGTERM."""
    for suffix, ranks in marks.items():
        for rank in ranks:
            (tmp_path / ('rank%d.%s' % (rank, suffix))).write_text('Stack:\n')
    sig = stop_from_outside(str(tmp_path), len(states), _notes(*states), reported, openmpi,
                            sigterm_from_within=within)
    assert (None if sig is None else signal.Signals(sig).name) == found


def test_the_launchers_line_for_a_sigquit_from_outside():
    """SIGQUIT is a kill, as the launcher and prterun take it: status 3."""
    assert signal_marks.message(4, signal.SIGQUIT) == (
        'theanompi-ext: every rank of the job (0-3 of 4) was sent SIGQUIT, and not by this '
        'launcher: mpiexec passes a SIGQUIT it is sent on to every rank (`kill` of mpiexec), '
        'or a batch scheduler or `kill` signalled the ranks; each ended by it, as killed '
        '(exit status 3)', 3)


def test_the_launchers_line_for_a_sigint_from_outside():
    assert signal_marks.message(2, signal.SIGINT) == (
        'theanompi-ext: every rank of the job (0, 1 of 2) was sent SIGINT, and not by '
        'this launcher: mpiexec passes a stop signal it is sent on to every rank (`kill` of '
        'mpiexec), or a batch scheduler or `kill` signalled the ranks; the job was stopped '
        '(exit status 130)', 130)


def test_the_launchers_line_for_a_stop_from_outside():
    assert signal_marks.message(256) == (
        'theanompi-ext: every rank of the job (0-255 of 256) was sent SIGTERM, and not by '
        'this launcher: mpiexec passes a stop signal it is sent on to every rank (`kill` of '
        'mpiexec), or a batch scheduler or `kill` signalled the ranks; the job was stopped '
        '(exit status 143)', 143)


def test_each_handler_is_set_through_the_setter():
    """stop_signals.set_through: catch and restore set each handler of that signal
    through the setter (which returns the previous one), and only of it."""
    calls = []

    def setter(sig, handler):
        calls.append(handler)
        return signal.signal(sig, handler)
    stop_signals.set_through(signal.SIGUSR2, setter)
    try:
        handler = lambda s, f: None                # noqa: E731
        old = stop_signals.catch({signal.SIGUSR2: handler, signal.SIGUSR1: handler})
        assert calls == [handler] and signal.getsignal(signal.SIGUSR2) is handler
        assert old == {signal.SIGUSR2: signal.SIG_DFL, signal.SIGUSR1: signal.SIG_DFL}
        stop_signals.restore(old)
        assert calls == [handler, signal.SIG_DFL]
    finally:
        stop_signals.set_through(signal.SIGUSR2, None)
        signal.signal(signal.SIGUSR2, signal.SIG_DFL)
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    stop_signals.restore({signal.SIGUSR2: None})
    assert len(calls) == 2


# A rank that does little but swap handlers (file writes of nothing, each holding
# the stop signals), with threads of its own beside it, as a rank has: a signal
# then comes mostly while a handler is being swapped
_SWAPPING = textwrap.dedent('''
    import os, signal, sys, threading, time
    from theanompi_ext import stop_signals
    from theanompi_ext.files.signals import deferred_signals
    from theanompi_ext.launch.signal_marks import mark_signal
    mark_signal(sys.argv[1], 0)
    for _ in range(int(sys.argv[2])):
        stop_signals.start_thread(threading.Thread(target=time.sleep, args=(60,), daemon=True))
    print('ready', flush=True)
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < 5:
            with deferred_signals():
                sum(range(100))
            sum(range(100))
        print('still running: the signal was dropped', flush=True)
    except KeyboardInterrupt:
        print('KeyboardInterrupt', flush=True)
''')


@pytest.mark.parametrize('sig, threads', [(signal.SIGTERM, 0), (signal.SIGINT, 3)],
                         ids=['SIGTERM', 'SIGINT-3-threads'])
def test_a_signal_while_a_handler_is_swapped_is_marked_and_acted_on(tmp_path, sig, threads):
    """12 processes, each signalled once at a random moment of a loop of handler
    swaps: each signal is marked, and acted on (SIGTERM: the default action;
    SIGINT: KeyboardInterrupt), SIGINT also with ``threads`` threads beside the
    main one (stop_signals.start_thread: they leave it to the main thread). Before
    (the mark unregistered after the new handler was set, the signal not held
    meanwhile), of 20 such runs without threads: SIGTERM 5 unmarked and 3 more
    dropped, SIGINT 10 unmarked and 1 dropped; the launcher then blamed a rank for
    a stop sent to every rank. A SIGTERM may still go to another thread while the
    main one holds it: not tested with threads (docs/faults.md)."""
    import random
    suffix = signal_marks.MARKS[sig]
    outcomes = []
    for i in range(12):
        folder = tmp_path / str(i)
        folder.mkdir()
        proc = subprocess.Popen([sys.executable, '-c', _SWAPPING, str(folder), str(threads)],
                                cwd=ROOT, stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == 'ready'
            time.sleep(random.uniform(0.02, 0.1))
            proc.send_signal(sig)
            said = proc.communicate(timeout=30)[0].strip()
        finally:
            proc.kill()
            proc.wait()
        marked = (folder / ('rank0' + suffix)).stat().st_size > 0
        acted = (proc.returncode == -sig if sig == signal.SIGTERM
                 else said == 'KeyboardInterrupt')
        outcomes.append((marked, acted, proc.returncode, said))
    assert all(marked and acted for marked, acted, _, _ in outcomes), outcomes


def test_a_thread_started_so_leaves_sigint_to_the_main_thread():
    """stop_signals.start_thread: the new thread blocks SIGINT (one sent to the
    process then goes to the main thread), the caller's own mask is as it was."""
    import threading
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    seen = []
    t = stop_signals.start_thread(threading.Thread(
        target=lambda: seen.append(signal.pthread_sigmask(signal.SIG_BLOCK, []))))
    t.join(10)
    assert seen and set(stop_signals.LEFT_TO_MAIN) <= seen[0], seen
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before


def _blocked_in(pid):
    """The signals blocked in process ``pid``'s main thread (/proc)."""
    with open('/proc/%d/status' % pid) as f:
        mask = int(next(l for l in f if l.startswith('SigBlk:')).split()[1], 16)
    return {s for s in stop_signals.LEFT_TO_MAIN if mask & (1 << (s - 1))}


def test_a_process_started_from_such_a_thread_blocks_nothing():
    """A process keeps its creator's mask through exec: started from a thread of
    start_thread's (the watchdog's abort starts a watcher), it would block SIGINT
    and ignore it until it ended by itself. Inside stop_signals.for_children it
    blocks none of them; outside, it blocks them (what the test would catch), and
    the thread's own block is back afterwards."""
    import threading
    got = {}

    def start_two():
        with stop_signals.for_children():
            freed = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])
        plain = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])
        got['after'] = signal.pthread_sigmask(signal.SIG_BLOCK, [])
        try:
            time.sleep(0.3)
            got['freed'], got['plain'] = _blocked_in(freed.pid), _blocked_in(plain.pid)
        finally:
            for p in (freed, plain):
                p.kill()
                p.wait()
    stop_signals.start_thread(threading.Thread(target=start_two)).join(60)
    assert got['freed'] == set(), got
    assert got['plain'] == set(stop_signals.LEFT_TO_MAIN), got
    assert set(stop_signals.LEFT_TO_MAIN) <= got['after'], got


def test_a_mark_runs_before_a_handler_of_pythons_set_after_it(tmp_path):
    """A rank's handler of Python's for SIGTERM, set through stop_signals after the
    mark: the mark is written and the handler still runs (chained), in this
    process; restore then leaves the default action, marked."""
    script = textwrap.dedent('''
        import os, signal, sys, time
        from theanompi_ext import stop_signals
        from theanompi_ext.launch.signal_marks import mark_signal, signalled_ranks
        mark_signal(sys.argv[1], 5)
        got = []
        old = stop_signals.catch({signal.SIGTERM: lambda s, f: got.append(s)})
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
        print(got, sorted(signalled_ranks(sys.argv[1])), flush=True)
        stop_signals.restore(old)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    ''')
    proc = subprocess.run([sys.executable, '-c', script, str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=30)
    assert proc.stdout == '[%d] [5]\n' % signal.SIGTERM, proc
    assert proc.returncode == -signal.SIGTERM, proc
    assert (tmp_path / 'rank5.sigterm').read_text().count('most recent call first') == 2
