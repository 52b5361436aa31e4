"""Standard output closed or unwritable: every command answers as documented.

* **Closed** (``info | head -1``, ``train --workers 1 ... | head -3``,
  ``tmxlauncher -cfg=S --dry-run | less`` quit early): status 141 (128 +
  SIGPIPE), no traceback, and, unless the command's work is what it prints,
  one line on standard error saying why.
* **Unwritable** (``> log`` on a full disk, here /dev/full): a command that
  trains drops its lines after one warning and finishes (0); any other ends
  with 3 and one line naming the error.

Each with Python's output buffered (a user's default: the write that fails
may be a flush, even the one at exit) and unbuffered (``PYTHONUNBUFFERED``).
Before: ``info`` and ``simulate`` into a closed pipe ended in a
BrokenPipeError traceback (1; 120 and "Exception ignored" when the failing
write was the flush at exit), ``train --dry-run`` called it bad input (2),
``train --workers 1`` a failed rank (3); a training launcher on a full disk
ended with 120 when its output was buffered. The launcher of several ranks:
tests/launch/test_stop_and_disk.py.
"""
import io
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from theanompi_ext import output_faults
from support.paths import ROOT

CLI = [sys.executable, '-m', 'theanompi_ext']
BIN = os.path.dirname(sys.executable)            # the venv's console scripts
SESSION_DIR = os.path.join(ROOT, 'examples', 'theanompi_style')
TM_DRY_RUN = [os.path.join(BIN, 'tmxlauncher'), '-cfg=resnet20_tm.session', '--dry-run']
SAID = 'stopped %s (exit status 141)' % output_faults.CLOSED_WHY
FULL = 'could not write its output to standard output ([Errno 28] No space left on device)'
DROPPED = ("theanompi-ext: warning: could not write the job's output to standard output "
           "([Errno 28] No space left on device): its lines are dropped from here; the job "
           "goes on")
BUFFERING = ['buffered', 'unbuffered']


def widowed_pipe():
    """The write end of a pipe whose reader has already gone."""
    r, w = os.pipe()
    os.close(r)
    return w


def python_env(buffering):
    """The environment with Python's standard output ``'buffered'`` or
    ``'unbuffered'`` (PYTHONUNBUFFERED: each write fails at once)."""
    env = dict(os.environ)
    env.pop('PYTHONUNBUFFERED', None)
    if buffering == 'unbuffered':
        env['PYTHONUNBUFFERED'] = '1'
    return env


def run_into(output, argv, buffering, cwd=SESSION_DIR, timeout=300):
    """Run ``argv`` with its standard output ``'closed'`` (a pipe nobody reads) or
    ``'full'`` (/dev/full); (status, stderr)."""
    fd = widowed_pipe() if output == 'closed' else os.open('/dev/full', os.O_WRONLY)
    try:
        r = subprocess.run(argv, stdout=fd, stderr=subprocess.PIPE, text=True, cwd=cwd,
                           timeout=timeout, env=python_env(buffering))
    finally:
        os.close(fd)
    return r.returncode, r.stderr


def stream_on(fd):
    return open(fd, 'w', closefd=False)


# --------------------------------------------------------------------------- the module

def test_is_closed_tells_a_readerless_pipe_from_a_read_pipe_a_file_and_a_full_disk(
        monkeypatch, tmp_path):
    r, w = os.pipe()
    dead = widowed_pipe()
    with open(tmp_path / 'f', 'w') as f, open('/dev/full', 'w') as full:
        for fd, closed in ((w, False), (f.fileno(), False), (full.fileno(), False),
                           (dead, True)):
            monkeypatch.setattr(sys, 'stdout', stream_on(fd))
            monkeypatch.setattr(sys, 'stderr', stream_on(f.fileno()))
            assert output_faults.is_closed() is closed, fd
            assert output_faults.is_closed(BrokenPipeError(32, 'x')) is closed, fd
            # another error is never a closed output, whatever the streams
            assert output_faults.is_closed(OSError(28, 'No space left')) is False
            assert output_faults.is_closed(ValueError('x')) is False
        # the stream that is not a file (pytest's capture, StringIO) is not closed
        monkeypatch.setattr(sys, 'stdout', io.StringIO())
        assert output_faults.is_closed(BrokenPipeError(32, 'x')) is False
        # standard error closed counts too (`cmd 2>&1 | head`)
        monkeypatch.setattr(sys, 'stderr', stream_on(dead))
        assert output_faults.is_closed(BrokenPipeError(32, 'x')) is True
    for fd in (r, w, dead):
        os.close(fd)


def test_end_points_the_closed_stream_at_devnull_and_says_why_on_the_other(
        monkeypatch, tmp_path):
    dead = widowed_pipe()
    try:
        with pytest.raises(BrokenPipeError):
            os.write(dead, b'x')
        err_path = tmp_path / 'err'
        with open(err_path, 'w') as err:
            monkeypatch.setattr(sys, 'stdout', stream_on(dead))
            monkeypatch.setattr(sys, 'stderr', err)
            assert output_faults.end('cmd: stopped, why') == 128 + signal.SIGPIPE == 141
            # the same descriptor now takes writes (what Python flushes at exit)
            assert os.write(dead, b'dropped') == 7
            assert output_faults.is_closed() is False
        assert err_path.read_text() == 'cmd: stopped, why\n'
    finally:
        os.close(dead)


def test_end_with_standard_error_closed_too_writes_nothing_and_does_not_raise(monkeypatch):
    dead = widowed_pipe()
    try:
        monkeypatch.setattr(sys, 'stdout', stream_on(dead))
        monkeypatch.setattr(sys, 'stderr', stream_on(dead))
        assert output_faults.end('not written') == 141
    finally:
        os.close(dead)


@pytest.mark.parametrize('trains', [True, False])
def test_run_command_on_a_full_output(monkeypatch, tmp_path, trains):
    """A command that trains loses its lines (one warning) and keeps its status; any
    other ends with 3, its error named; an error of its own is not taken for one."""
    with open('/dev/full', 'w') as full, open(tmp_path / 'err', 'w') as err:
        monkeypatch.setattr(sys, 'stdout', full)
        monkeypatch.setattr(sys, 'stderr', err)

        def command():
            for i in range(3000):               # past any buffer: a write fails here
                print('line %d' % i)
            return 7
        assert output_faults.run_command(command, 'cmd', trains=trains) == (7 if trains else 3)
        assert sys.stdout is full               # put back
        with open('/dev/full', 'w') as other, pytest.raises(OSError):
            # a write of the command's own that fails is its error, not its output's
            output_faults.run_command(lambda: os.write(other.fileno(), b'x'), 'cmd',
                                      trains=trains)
    said = (tmp_path / 'err').read_text()
    assert said == (DROPPED + '\n' if trains else 'cmd: error: %s\n' % FULL), said


def test_run_command_with_standard_error_on_a_full_disk(monkeypatch, tmp_path):
    """Warnings that cannot be written are dropped: the command's status stands."""
    with open('/dev/full', 'w') as full, open(tmp_path / 'out', 'w') as out:
        monkeypatch.setattr(sys, 'stdout', out)
        monkeypatch.setattr(sys, 'stderr', full)

        def command():
            for i in range(3000):
                sys.stderr.write('warning %d\n' % i)
            print('result')
            return 5
        assert output_faults.run_command(command, 'cmd', trains=False) == 5
        assert sys.stderr is full and sys.stdout is out
    assert (tmp_path / 'out').read_text() == 'result\n'


def test_a_commands_lines_reach_a_file_as_they_are_written(tmp_path):
    """Python block-buffers a file or a pipe: a run's lines reached ``> log`` (and
    ``tail -f``) in 8 KB blocks or at its end (measured: `train --workers 1 > log`
    of 40 epochs wrote nothing for 20 s, then all 55 lines at the end). A command
    under run_command writes each line when it ends."""
    from support.paths import root_on_path
    code = ('import sys\nfrom theanompi_ext import output_faults\n'
            'sys.exit(output_faults.run_command(\n'
            '    lambda: print("first line") or len(sys.stdin.readline()) - 1, "cmd", True))')
    log = tmp_path / 'log'
    env = root_on_path(python_env('buffered'))
    with open(log, 'w') as f:
        proc = subprocess.Popen([sys.executable, '-c', code], stdout=f, stdin=subprocess.PIPE,
                                env=env)
    try:
        deadline = time.monotonic() + 30
        while log.read_text() != 'first line\n' and time.monotonic() < deadline:
            time.sleep(0.05)
        assert log.read_text() == 'first line\n'
        assert proc.poll() is None               # still running: not the flush at exit
        proc.stdin.write(b'\n')
        proc.stdin.close()
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


# --------------------------------------------------------------------------- every command

# (argv, what stderr ends with when closed: None when the command's work is what it
# prints; the name its error on a full output begins with). Not here: argparse's
# --help, which ignores a failed write itself (status 0).
COMMANDS = {
    'info': (CLI + ['info'], None, 'theanompi-ext info'),
    'simulate': (CLI + ['simulate'], None, 'theanompi-ext simulate'),
    'train-dry-run': (CLI + ['train', '--workers', '2', '--model', 'mlp', '--dry-run'],
                      'theanompi-ext train: ' + SAID, 'theanompi-ext train'),
    'check-equivalence': (CLI + ['check-equivalence', '--workers', '2', '--model', 'mlp'],
                          'theanompi-ext check-equivalence: ' + SAID,
                          'theanompi-ext check-equivalence'),
    'bench-casts': (CLI + ['bench', 'casts'], 'theanompi-ext bench: ' + SAID,
                    'theanompi-ext bench'),
    'tmxlauncher-help': ([os.path.join(BIN, 'tmxlauncher'), '--help'], None, 'tmxlauncher'),
    'tmxlauncher-dry-run': (TM_DRY_RUN, 'tmxlauncher: ' + SAID, 'tmxlauncher'),
}


@pytest.mark.parametrize('buffering', BUFFERING)
@pytest.mark.parametrize('name', sorted(COMMANDS))
def test_command_into_a_closed_pipe_ends_with_141(name, buffering):
    argv, said, _ = COMMANDS[name]
    assert os.path.exists(argv[0]), 'console script not installed: %s' % argv[0]
    rc, err = run_into('closed', argv, buffering)
    assert rc == 141, (rc, err[-3000:])
    assert 'Traceback' not in err and 'Exception ignored' not in err, err[-3000:]
    if said is None:
        assert err == '', err[-3000:]
    else:
        assert err.rstrip().endswith(said), err[-3000:]


@pytest.mark.parametrize('buffering', BUFFERING)
@pytest.mark.parametrize('name', sorted(COMMANDS))
def test_command_that_does_not_train_on_a_full_disk_ends_with_3(name, buffering):
    argv, _, prog = COMMANDS[name]
    rc, err = run_into('full', argv, buffering)
    assert rc == 3, (rc, err[-3000:])
    assert err.rstrip().splitlines()[-1] == '%s: error: %s' % (prog, FULL), err[-3000:]
    assert 'Traceback' not in err and 'Exception ignored' not in err, err[-3000:]


def one_process_run(out, steps=None):
    return CLI + ['train', '--workers', '1', '--model', 'mlp', '--batch-per-worker', '8',
                  '--epochs', '1000', '--warmup', 'none', '--checkpoint-every', '1',
                  '--eval-every', '1000', '--progress-every', '1', '--out', str(out)] + \
        (['--max-steps', str(steps)] if steps else [])


@pytest.mark.parametrize('buffering', BUFFERING)
def test_training_in_one_process_stops_when_its_reader_goes(tmp_path, buffering):
    """``train --workers 1`` (one process, no mpiexec) piped into ``head -3``: a
    write after the reader went stops it, 141, its folder without temporaries and
    its checkpoint (if one was written) whole."""
    from theanompi_ext.files import sealed
    out = tmp_path / 'run'
    r = subprocess.run(['bash', '-c', 'set -o pipefail; "$@" | head -3 >/dev/null', 'head']
                       + one_process_run(out), stderr=subprocess.PIPE, text=True,
                       timeout=300, env=python_env(buffering))
    assert r.returncode == 141, r.stderr[-3000:]
    # said by the run (a line failed while training) or by the command (its last flush)
    assert re.search(r'theanompi-ext( train)?: %s$' % re.escape(SAID), r.stderr.rstrip()), \
        r.stderr[-3000:]
    assert 'Traceback' not in r.stderr, r.stderr[-3000:]
    names = os.listdir(out)
    assert not [n for n in names if '.tmp' in n], names
    if 'checkpoint.h5' in names:
        sealed.read_sealed(str(out / 'checkpoint.h5'))    # raises if torn


@pytest.mark.parametrize('buffering', BUFFERING)
def test_training_in_one_process_on_a_full_disk_goes_on(tmp_path, buffering):
    """``train --workers 1 > log`` on a full disk: one warning, the lines dropped,
    the run to its end (0), as the launcher of several ranks does. Before, the
    first failed write ended it as a failed rank (3)."""
    out = tmp_path / 'run'
    rc, err = run_into('full', one_process_run(out, steps=300), buffering, cwd=None)
    assert rc == 0, err[-3000:]
    assert err.count(DROPPED) == 1, err[-3000:]
    assert 'Traceback' not in err and 'Exception ignored' not in err, err[-3000:]
    assert json.loads((out / 'summary.json').read_text())['iterations'] == 300


@pytest.mark.parametrize('workers', [1, 2])
def test_training_with_standard_error_on_a_full_disk_goes_on(tmp_path, workers):
    """``train ... 2> log`` on a full disk: its warnings are lost, silently (nowhere
    is left to say so), and it trains to its end. Before, the first warning (here:
    the batch below --ref-batch) ended it before anything ran, status 120."""
    out = tmp_path / 'run'
    argv = CLI + ['train', '--workers', str(workers), '--model', 'mlp', '--batch-per-worker',
                  '8', '--epochs', '2', '--warmup-epochs', '1', '--out', str(out)]
    with open('/dev/full', 'w') as full:
        r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=full, text=True, timeout=300,
                           env=python_env('buffered'))
    assert r.returncode == 0, r.stdout[-3000:]
    assert r.stdout.splitlines()[-1].startswith('summary: %d workers' % workers), r.stdout
    assert len(json.loads((out / 'summary.json').read_text())['history']) == 2


def test_tmxlauncher_dry_run_finds_the_model_in_the_working_directory():
    """The console script (whose ``sys.path`` does not hold the working directory,
    unlike ``python -m``) plans a session whose MODELFILE is a module there, as
    the ranks find it. Before, the dry run ended in ModuleNotFoundError."""
    r = subprocess.run(TM_DRY_RUN, capture_output=True, text=True, cwd=SESSION_DIR,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert lines[0].startswith('dry run: ResNet20TM on 2 ranks (cpu0,cpu1), sync_type=kn')
    chunks = [ln for ln in lines if ' parameter(s), ' in ln]
    # the stem, nine residual blocks, the classifier
    assert len(chunks) == 11, r.stdout
    # ResNet-20 for CIFAR-10: a 3x3 stem of 16, 3 stages of 3 basic blocks of 16/32/64
    # channels (two 3x3 convolutions, each with BN's gamma and beta; a stage's first
    # block that widens has a 1x1 projection with BN), a 64 x 10 softmax with bias

    def block(cin, c):
        return 9 * cin * c + 2 * c + 9 * c * c + 2 * c + (cin * c + 2 * c if cin != c else 0)
    blocks = sum(block(cin, c) + 2 * block(c, c) for cin, c in ((16, 16), (16, 32), (32, 64)))
    assert sum(int(ln.split('scalars')[0].split(',')[-1]) for ln in chunks) == \
        9 * 3 * 16 + 2 * 16 + blocks + 64 * 10 + 10


# --------------------------------------------------------------------------- started without it

MISSING = ('could not write its output to standard output ([Errno 9] standard output was '
           'closed when the command started)')
CLOSE = {'stdout': '>&-', 'stderr': '2>&-', 'all three': '<&- >&- 2>&-'}


def run_without(streams, argv, cwd=SESSION_DIR, timeout=300):
    """Run ``argv`` started without the standard ``streams`` (a key of CLOSE:
    the shell's ``>&-``, ``2>&-``); a stream not closed is captured. The
    CompletedProcess."""
    return subprocess.run(['bash', '-c', 'exec "$@" ' + CLOSE[streams], 'run'] + argv,
                          capture_output=True, text=True, cwd=cwd, timeout=timeout,
                          env=python_env('buffered'))


@pytest.mark.parametrize('name', sorted(COMMANDS))
def test_command_started_without_standard_output_ends_with_3(name):
    """``cmd >&-``: standard output unwritable, as on a full disk, with the
    errno that ``ls >&-`` reports. Before: an AttributeError traceback (1), since
    Python leaves ``sys.stdout`` None."""
    argv, _, prog = COMMANDS[name]
    r = run_without('stdout', argv)
    assert r.returncode == 3, (r.returncode, r.stderr[-3000:])
    assert r.stderr.rstrip().splitlines()[-1] == '%s: error: %s' % (prog, MISSING), \
        r.stderr[-3000:]
    assert 'Traceback' not in r.stderr, r.stderr[-3000:]


def test_command_started_without_standard_error_prints_and_fails_as_usual():
    """``cmd 2>&-``: its output as ever; bad input still ends with 2 (before: 1,
    from an AttributeError that could not even be shown)."""
    r = run_without('stderr', CLI + ['info'])
    assert r.returncode == 0 and 'topology' in r.stdout, r.returncode
    assert run_without('stderr', CLI + ['train', '--workers', '0']).returncode == 2
    assert run_without('stderr', CLI + ['no-such-command']).returncode == 2
    assert run_without('stderr', [os.path.join(BIN, 'tmxlauncher'), '-cfg=nowhere']) \
        .returncode == 2


@pytest.mark.parametrize('job', ['train 1 rank', 'train 2 ranks', 'Theano-MPI session'])
@pytest.mark.parametrize('streams', sorted(CLOSE))
def test_training_started_without_standard_streams_goes_on(tmp_path, job, streams):
    """``train ... >&-``, ``2>&-``, or all three closed (a daemon's start), and a
    Theano-MPI session so: /dev/null goes under each missing descriptor before
    anything is opened, so that no file of the run (a checkpoint) takes
    descriptor 1 or 2 and the lines printed after it, and the children
    (mpiexec, the ranks) inherit it; a missing standard output gets the one
    warning of a full disk, the run ends with 0, its files whole. Before: a
    traceback (1) before anything ran; the session's job, a traceback of its
    copying thread."""
    from support.every_path import session_argv
    from theanompi_ext.files import sealed
    out = tmp_path / 'run'
    if job == 'Theano-MPI session':
        argv, ranks = [sys.executable, '-m'] + session_argv(tmp_path, 'cpu0,cpu1'), 2
    else:
        ranks = int(job.split()[1])
        argv = CLI + ['train', '--workers', str(ranks), '--model', 'mlp', '--batch-per-worker',
                      '8', '--epochs', '3', '--warmup-epochs', '1', '--checkpoint-every', '5',
                      '--out', str(out)]
    r = run_without(streams, argv, cwd=None)
    assert r.returncode == 0, (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
    assert 'Traceback' not in r.stderr, r.stderr[-3000:]
    if streams == 'stdout':
        assert r.stderr.count(DROPPED.replace('[Errno 28] No space left on device',
                                              MISSING.split('(', 1)[1][:-1])) == 1, r.stderr
    if streams == 'stderr':
        assert r.stdout.splitlines()[-1].startswith(
            'summary: %d %s' % (ranks, 'ranks' if 'session' in job else 'workers')), r.stdout
    if 'session' not in job:
        assert len(json.loads((out / 'summary.json').read_text())['history']) == 3
        sealed.read_sealed(str(out / 'checkpoint.h5'))    # whole: no line was written into it
        assert not [n for n in os.listdir(out) if '.tmp' in n]


# --------------------------------------------------------------------------- any character

@pytest.mark.parametrize('case', ['ascii output, 1 rank', 'ascii output, 2 ranks',
                                  'undecodable byte, 2 ranks'])
def test_a_character_the_output_cannot_encode_does_not_end_a_run(tmp_path, case):
    """An ``--out`` path with ``ü`` on an ASCII output (``PYTHONIOENCODING=ascii``,
    as a Latin-1 or ASCII locale gives for other characters), or with a byte that
    is not UTF-8 (a file name's, ``os.fsdecode``): the plan's line shows it
    escaped, as standard error does, and the run ends with 0. Before: the plan's
    print raised UnicodeEncodeError on the rank, a failed job (3)."""
    ranks = int(case.split(', ')[1][0])
    name = 'ü run' if case.startswith('ascii') else os.fsdecode(b'run \xff')
    shown = '\\xfc run' if case.startswith('ascii') else 'run \\udcff'
    out = os.path.join(str(tmp_path), name)
    env = python_env('buffered')
    if case.startswith('ascii'):
        env['PYTHONIOENCODING'] = 'ascii'
    r = subprocess.run(CLI + ['train', '--workers', str(ranks), '--model', 'mlp',
                              '--max-steps', '5', '--out', out],
                       capture_output=True, timeout=300, env=env)
    stdout, stderr = (r.stdout.decode('utf-8', 'replace'), r.stderr.decode('utf-8', 'replace'))
    assert r.returncode == 0, (r.returncode, stderr[-3000:])
    assert ('outputs       %s/' % os.path.join(str(tmp_path), shown)) in stdout, stdout
    assert json.loads(open(os.path.join(out, 'summary.json')).read())['iterations'] == 5
