"""Progress inside an epoch (issue 19): a line refreshed in place on a terminal,
plain lines elsewhere, nothing with --quiet."""
import io
import os
import pty
import re
import subprocess
import sys

import pytest

from theanompi_ext.train.progress import Progress, auto_every, stream_is_terminal

LINE = re.compile(r'progress: epoch (\d+)/(\d+) it (\d+)/(\d+)  (\d+) img/s  loss ([0-9.]+)  '
                  r'left (\S+) epoch, (\S+) run  data wait (\d+)%  exchange wait (\d+)%')


class Clock(object):
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def drive(progress, clock, steps, step_s=0.5, wait_s=0.125, exch_s=0.25, loss=2.0):
    """``steps`` iterations of ``step_s`` each, a quarter of it waiting for data."""
    progress.start_epoch(0, 0)
    data_wait = 0.0
    for i in range(1, steps + 1):
        clock.t += step_s
        data_wait += wait_s
        progress.step(i, i, loss + i, data_wait, exch_s)


def test_plain_lines_every_n_iterations_with_the_figures_by_hand():
    clock, out = Clock(), io.StringIO()
    p = Progress(iters_per_epoch=10, epochs=3, total_iters=30, total_batch=64, every=4,
                 stream=out, terminal=False, clock=clock)
    drive(p, clock, 10)
    p.end_epoch()
    lines = out.getvalue().splitlines()
    assert '\r' not in out.getvalue() and len(lines) == 2         # at 4 and 8, not at 10
    m = [LINE.fullmatch(l).groups() for l in lines]
    # after 4 steps of 0.5 s: 64/0.5 = 128 img/s; mean loss (3+4+5+6)/4 = 4.5;
    # 6 steps left in the epoch = 3 s, 26 in the run = 13 s; data 0.5/2 s = 25%,
    # exchange 1.0/2 s = 50%
    assert m[0] == ('1', '3', '4', '10', '128', '4.5000', '0:03', '0:13', '25', '50')
    assert m[1][2] == '8' and m[1][5] == '6.5000' and m[1][6:8] == ('0:01', '0:11')


def test_terminal_line_is_refreshed_in_place_and_cleared():
    clock, out = Clock(), io.StringIO()
    p = Progress(10, 1, 10, 64, stream=out, terminal=True, clock=clock)
    drive(p, clock, 10)
    p.end_epoch()
    text = out.getvalue()
    assert '\n' not in text
    shown = [s for s in text.split('\r') if s.startswith('progress:')]
    assert len(shown) == 10                # 0.5 s apart: above the refresh interval
    assert LINE.match(shown[-1]).group(3) == '10'
    assert text.endswith('\r\033[K')      # the epoch line then starts on a clean line


def test_terminal_refresh_is_throttled():
    clock, out = Clock(), io.StringIO()
    p = Progress(100, 1, 100, 64, stream=out, terminal=True, clock=clock)
    drive(p, clock, 100, step_s=0.01)     # 1 s in all: about 4 refreshes + the last
    assert 3 <= out.getvalue().count('\r') <= 6


def test_quiet_or_other_ranks_write_nothing():
    for enabled, terminal in [(False, True), (False, False)]:
        clock, out = Clock(), io.StringIO()
        p = Progress(10, 1, 10, 64, enabled=enabled, every=1, stream=out,
                     terminal=terminal, clock=clock)
        drive(p, clock, 10)
        p.end_epoch()
        assert out.getvalue() == ''


def test_automatic_interval_and_terminal_detection():
    assert auto_every(50) == 0 and auto_every(100) == 10 and auto_every(5004) == 500
    assert not stream_is_terminal(io.StringIO(), {})
    assert stream_is_terminal(io.StringIO(), {'THEANOMPI_EXT_STDOUT_TTY': '1'}) is False
    r, w = os.pipe()
    with os.fdopen(w, 'w') as f:
        assert not stream_is_terminal(f, {})
        assert stream_is_terminal(f, {'THEANOMPI_EXT_STDOUT_TTY': '1'})
    os.close(r)


# --------------------------------------------------------------------------- end to end

TRAIN = [sys.executable, '-m', 'theanompi_ext', 'train', '--model', 'mlp', '--epochs', '2',
         '--batch-per-worker', '8', '--max-steps', '40', '--warmup', 'none',
         '--decay-epochs', '', '--ref-batch', '16']


def run_in_pty(argv, timeout=240):
    """Run ``argv`` with stdout and stderr on a pseudo-terminal; return its output."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:          # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=timeout) == 0, b''.join(chunks).decode(errors='replace')
    return b''.join(chunks).decode(errors='replace')


@pytest.mark.parametrize('workers', ['1', '2'])
def test_a_terminal_gets_a_line_refreshed_in_place(workers):
    # with 2 workers rank 0 writes to mpiexec's pipe: the launcher passes the terminal on
    text = run_in_pty(TRAIN + ['--workers', workers])
    assert re.search(r'\rprogress: epoch 1/2 it \d+/%d ' % (1438 // (8 * int(workers))), text)
    assert '\r\033[K' in text and 'plan: mlp on digits' in text
    assert not re.search(r'(^|\n)progress:', text)        # never a plain line here


def test_not_a_terminal_gets_plain_lines_every_n():
    r = subprocess.run(TRAIN + ['--workers', '1', '--progress-every', '15'],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    # the plan is the run's first output, as train --dry-run prints it
    assert r.stdout.splitlines()[:2] == ['plan: mlp on digits (1438 training examples)',
                                         '  k x n         1 x 8 = 8 examples per iteration']
    lines = [l for l in r.stdout.splitlines() if l.startswith('progress:')]
    assert [LINE.match(l).group(3) for l in lines] == ['15', '30']
    assert '\r' not in r.stdout


def test_quiet_shows_no_progress_on_a_terminal():
    text = run_in_pty(TRAIN + ['--workers', '1', '--quiet', '--progress-every', '1'])
    assert 'progress' not in text and 'plan:' not in text
