"""Where Theano's compile cache goes, and a clear error when it cannot go there
(engine/flags.cache_dir).

``$THEANOMPI_EXT_CACHE`` chosen by the user and unusable (missing and not
creatable, not a folder, a full disk) is bad input (2), said before anything
starts, or by each rank under the user's own mpiexec (or on another host).
Without it, a home that cannot hold ``~/.cache/theanompi_ext`` (read-only
or full, as on some clusters' compute nodes) falls back to a folder of this
user's in the temporary directory, with one warning. Before: a rank failed
with a bare FileNotFoundError (3), and ``tmxlauncher`` ended in a traceback.
"""
import os
import subprocess
import sys

import pytest

from theanompi_ext.engine import flags
from theanompi_ext.errors import BadInput, exit_status
from support.every_path import session_argv

VAR = flags.CACHE_VAR


@pytest.fixture
def isolated(monkeypatch, tmp_path):
    """No cache variable, a home and a temporary directory of the test's own."""
    monkeypatch.delenv(VAR, raising=False)
    monkeypatch.setenv('HOME', str(tmp_path / 'home'))
    (tmp_path / 'tmp').mkdir()
    monkeypatch.setattr('tempfile.tempdir', str(tmp_path / 'tmp'))
    return tmp_path


def test_the_chosen_folder_is_made_and_used(isolated, capsys, monkeypatch):
    chosen = isolated / 'a' / 'b'
    os.environ[VAR] = str(chosen)
    assert flags.cache_dir() == str(chosen) and chosen.is_dir()
    assert os.listdir(chosen) == []               # the probe leaves nothing behind
    assert capsys.readouterr().err == ''
    # a chosen folder may be another user's (a group's shared cache) if writable
    monkeypatch.setattr(os, 'getuid', lambda: 424242)
    assert flags.cache_dir() == str(chosen)


@pytest.mark.parametrize('where', ['under a file', 'a file'])
def test_a_chosen_folder_that_cannot_be_used_is_bad_input_naming_it(isolated, where):
    (isolated / 'f').write_text('x')
    chosen = isolated / 'f' / 'cache' if where == 'under a file' else isolated / 'f'
    os.environ[VAR] = str(chosen)
    with pytest.raises(flags.CacheUnusable) as err:
        flags.cache_dir()
    assert isinstance(err.value, BadInput) and exit_status(err.value) == 2
    msg = str(err.value)
    assert msg.startswith('the compile cache %s=%s cannot be used ([Errno ' % (VAR, chosen)), msg
    assert msg.endswith('point %s at a folder this user can write' % VAR), msg
    assert (isolated / 'f').read_text() == 'x'     # nothing of the user's touched


def test_the_home_folder_without_a_warning(isolated, capsys):
    home = isolated / 'home' / '.cache' / 'theanompi_ext'
    assert flags.cache_dir() == str(home) and home.is_dir()
    assert VAR not in os.environ
    assert capsys.readouterr().err == ''


def test_a_home_that_cannot_hold_it_falls_back_to_the_temporary_directory(
        isolated, monkeypatch, capsys):
    (isolated / 'home').write_text('not a folder')     # as read-only: makedirs fails
    fallback = isolated / 'tmp' / ('theanompi_ext-cache-%d' % os.getuid())
    assert flags.cache_dir() == str(fallback) and fallback.is_dir()
    err = capsys.readouterr().err
    assert err.count('\n') == 1 and err.startswith(
        'theanompi-ext: warning: the compile cache %s cannot be used ([Errno 20] Not a '
        "directory: '%s'): compiling into %s instead (set %s to choose)"
        % (isolated / 'home' / '.cache' / 'theanompi_ext', isolated / 'home' / '.cache',
           fallback, VAR)), err
    # the ranks started from here inherit the choice, and do not warn again
    assert os.environ[VAR] == str(fallback)
    assert flags.cache_dir() == str(fallback) and capsys.readouterr().err == ''


def test_a_fallback_folder_of_another_user_is_not_used(isolated, monkeypatch):
    (isolated / 'home').write_text('not a folder')
    monkeypatch.setattr(os, 'getuid', lambda: 424242)   # the folder below is not "ours"
    (isolated / 'tmp' / 'theanompi_ext-cache-424242').mkdir()
    with pytest.raises(flags.CacheUnusable) as err:
        flags.cache_dir()
    msg = str(err.value)
    assert 'theanompi_ext-cache-424242 (owned by another user)' in msg, msg
    assert msg.endswith('set %s to a folder this user can write' % VAR), msg


@pytest.mark.root
def test_a_chosen_folder_on_a_full_disk_is_refused_before_any_compile(isolated):
    mnt = isolated / 'full'
    mnt.mkdir()
    subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=32k', 'tmpfs', str(mnt)], check=True)
    try:
        os.environ[VAR] = str(mnt)
        with pytest.raises(flags.CacheUnusable) as err:
            flags.cache_dir()
        assert '[Errno 28] No space left on device' in str(err.value)
        assert os.listdir(mnt) == []
    finally:
        subprocess.run(['umount', str(mnt)], check=True)


# --------------------------------------------------------------------------- the commands

TRAIN = [sys.executable, '-m', 'theanompi_ext', 'train', '--model', 'mlp', '--max-steps', '3']


def launches(tmp_path):
    return {
        'train 2 ranks': TRAIN + ['--workers', '2'],
        'train 1 rank': TRAIN + ['--workers', '1'],
        'train --dry-run': TRAIN + ['--workers', '2', '--dry-run'],
        'Theano-MPI session': [sys.executable, '-m'] + session_argv(tmp_path, 'cpu0,cpu1'),
    }


@pytest.mark.parametrize('name', ['train 2 ranks', 'train 1 rank', 'train --dry-run',
                                  'Theano-MPI session'])
def test_a_launch_with_an_unusable_cache_is_refused_before_it_starts(tmp_path, name):
    (tmp_path / 'f').write_text('x')
    bad = str(tmp_path / 'f' / 'cache')
    r = subprocess.run(launches(tmp_path)[name], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, **{VAR: bad}))
    prog = 'tmxlauncher' if 'session' in name else 'theanompi-ext train'
    assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
    assert r.stderr.splitlines()[-1] == (
        "%s: error: the compile cache %s=%s cannot be used ([Errno 20] Not a directory: '%s'): "
        'point %s at a folder this user can write' % (prog, VAR, bad, bad, VAR)), r.stderr
    assert 'Traceback' not in r.stderr and 'rank 0' not in r.stderr, r.stderr[-3000:]


def test_under_the_users_own_mpiexec_each_rank_says_it(tmp_path):
    """No launcher of ours checks first: every rank finds it, ends with 2 and its
    line; the job ends (rank 0 alone ending before MPI started would leave the
    others waiting for it: checked in the launcher only, this hung)."""
    from support.procs import mpiexec
    from theanompi_ext.launch.mpiexec import mpiexec_command
    (tmp_path / 'f').write_text('x')
    bad = str(tmp_path / 'f' / 'cache')
    try:
        r = subprocess.run(mpiexec_command(2, TRAIN, mpiexec=mpiexec()), capture_output=True,
                           text=True, timeout=120, env=dict(os.environ, **{VAR: bad}),
                           start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        pytest.fail('the job hung: %s' % exc.stderr)
    assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
    for rank in (0, 1):
        assert ('theanompi-ext: rank %d of 2 failed: CacheUnusable: the compile cache %s=%s '
                'cannot be used' % (rank, VAR, bad)) in r.stderr, r.stderr[-3000:]
