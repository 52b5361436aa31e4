"""A closed output ends every command as SIGPIPE ends other Unix tools.

``theanompi-ext info | head -1``, ``train --workers 1 ... | head -3``,
``tmxlauncher -cfg=S --dry-run | less`` quit early: each command ends with
status 141 (128 + SIGPIPE), no traceback, and, unless its work is what it
prints, one line on standard error saying why. Before, ``info`` and
``simulate`` ended in a BrokenPipeError traceback (status 1), ``train
--dry-run`` called the broken pipe bad input (2) and ``train --workers 1``
a failed rank (3). The launcher of several ranks: tests/launch/test_stop_and_disk.py.
"""
import io
import os
import signal
import subprocess
import sys

import pytest

from theanompi_ext import closed_output
from support.paths import ROOT

CLI = [sys.executable, '-m', 'theanompi_ext']
BIN = os.path.dirname(sys.executable)            # the venv's console scripts
SESSION_DIR = os.path.join(ROOT, 'examples', 'theanompi_style')
TM_DRY_RUN = [os.path.join(BIN, 'tmxlauncher'), '-cfg=resnet20_tm.session', '--dry-run']
SAID = 'stopped %s (exit status 141)' % closed_output.WHY


def widowed_pipe():
    """The write end of a pipe whose reader has already gone."""
    r, w = os.pipe()
    os.close(r)
    return w


def run_into_closed_pipe(argv, cwd=None, timeout=300):
    """Run ``argv`` with its standard output a pipe nobody reads; (status, stderr)."""
    w = widowed_pipe()
    try:
        r = subprocess.run(argv, stdout=w, stderr=subprocess.PIPE, text=True, cwd=cwd,
                           timeout=timeout)
    finally:
        os.close(w)
    return r.returncode, r.stderr


# --------------------------------------------------------------------------- the module

def stream_on(fd):
    return open(fd, 'w', closefd=False)


def test_is_closed_tells_a_readerless_pipe_from_a_read_pipe_a_file_and_a_full_disk(
        monkeypatch, tmp_path):
    r, w = os.pipe()
    dead = widowed_pipe()
    with open(tmp_path / 'f', 'w') as f, open('/dev/full', 'w') as full:
        for fd, closed in ((w, False), (f.fileno(), False), (full.fileno(), False),
                           (dead, True)):
            monkeypatch.setattr(sys, 'stdout', stream_on(fd))
            monkeypatch.setattr(sys, 'stderr', stream_on(f.fileno()))
            assert closed_output.is_closed() is closed, fd
            assert closed_output.is_closed(BrokenPipeError(32, 'x')) is closed, fd
            # another error is never a closed output, whatever the streams
            assert closed_output.is_closed(OSError(28, 'No space left')) is False
            assert closed_output.is_closed(ValueError('x')) is False
        # the stream that is not a file (pytest's capture, StringIO) is not closed
        monkeypatch.setattr(sys, 'stdout', io.StringIO())
        assert closed_output.is_closed(BrokenPipeError(32, 'x')) is False
        # standard error closed counts too (`cmd 2>&1 | head`)
        monkeypatch.setattr(sys, 'stderr', stream_on(dead))
        assert closed_output.is_closed(BrokenPipeError(32, 'x')) is True
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
            assert closed_output.end('cmd: stopped, why') == 128 + signal.SIGPIPE == 141
            # the same descriptor now takes writes (what Python flushes at exit)
            assert os.write(dead, b'dropped') == 7
            assert closed_output.is_closed() is False
        assert err_path.read_text() == 'cmd: stopped, why\n'
    finally:
        os.close(dead)


def test_end_with_standard_error_closed_too_writes_nothing_and_does_not_raise(monkeypatch):
    dead = widowed_pipe()
    try:
        out, err = stream_on(dead), stream_on(dead)
        monkeypatch.setattr(sys, 'stdout', out)
        monkeypatch.setattr(sys, 'stderr', err)
        assert closed_output.end('not written') == 141
    finally:
        os.close(dead)


# --------------------------------------------------------------------------- every command

# (argv, what stderr ends with: None when the command's work is what it prints).
# Not here: argparse's --help, which ignores a failed write itself (status 0).
COMMANDS = {
    'info': (CLI + ['info'], None),
    'simulate': (CLI + ['simulate'], None),
    'train-dry-run': (CLI + ['train', '--workers', '2', '--model', 'mlp', '--dry-run'],
                      'theanompi-ext train: ' + SAID),
    'check-equivalence': (CLI + ['check-equivalence', '--workers', '2', '--model', 'mlp'],
                          'theanompi-ext check-equivalence: ' + SAID),
    'bench-casts': (CLI + ['bench', 'casts'], 'theanompi-ext bench: ' + SAID),
    'tmxlauncher-help': ([os.path.join(BIN, 'tmxlauncher'), '--help'], None),
    'tmxlauncher-dry-run': (TM_DRY_RUN, 'tmxlauncher: ' + SAID),
}


@pytest.mark.parametrize('name', sorted(COMMANDS))
def test_command_into_a_closed_pipe_ends_with_141(name):
    argv, said = COMMANDS[name]
    assert os.path.exists(argv[0]), 'console script not installed: %s' % argv[0]
    rc, err = run_into_closed_pipe(argv, cwd=SESSION_DIR)
    assert rc == 141, (rc, err[-3000:])
    assert 'Traceback' not in err and 'Exception ignored' not in err, err[-3000:]
    if said is None:
        assert err == '', err[-3000:]
    else:
        assert err.rstrip().endswith(said), err[-3000:]


def test_training_in_one_process_stops_when_its_reader_goes(tmp_path):
    """``train --workers 1`` (one process, no mpiexec) piped into ``head -3``: the
    first write after the reader went stops it, 141, its folder without
    temporaries and its checkpoint (if one was written) whole."""
    from theanompi_ext.files import sealed
    out = tmp_path / 'run'
    argv = CLI + ['train', '--workers', '1', '--model', 'mlp', '--batch-per-worker', '8',
                  '--epochs', '1000', '--warmup', 'none', '--checkpoint-every', '1',
                  '--eval-every', '1000', '--progress-every', '1', '--out', str(out)]
    r = subprocess.run(['bash', '-c', 'set -o pipefail; "$@" | head -3 >/dev/null', 'head']
                       + argv, stderr=subprocess.PIPE, text=True, timeout=300)
    assert r.returncode == 141, r.stderr[-3000:]
    assert r.stderr.rstrip().endswith('theanompi-ext: ' + SAID), r.stderr[-3000:]
    assert 'Traceback' not in r.stderr, r.stderr[-3000:]
    names = os.listdir(out)
    assert not [n for n in names if '.tmp' in n], names
    if 'checkpoint.h5' in names:
        sealed.read_sealed(str(out / 'checkpoint.h5'))    # raises if torn


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
