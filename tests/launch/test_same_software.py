"""Every rank of a job runs the same software (launch/same_software.py).

The digest of the package's sources against one computed here with hashlib,
the message's parts from made-up descriptors, the check with a stand-in
communicator, and 2 real MPI ranks of ``train`` inside the user's own
mpiexec, rank 1 importing a copy of the package with one line added (as a
host with another install would): refused before training (exit status 2,
naming both copies) and, with ``THEANOMPI_EXT_MIXED_SOFTWARE=1``, trained
with a warning. Across emulated hosts: tests/launch/test_emulated_hosts.py.
"""
import hashlib
import json
import os
import pathlib
import platform
import shutil
import sys
import time

import numpy as np
import pytest

from support.installs import PACKAGE, another_install
from support.paths import root_on_path
from support.procs import job, mpiexec
from theanompi_ext import __version__
from theanompi_ext.errors import EXIT_BAD_INPUT, EXIT_FAILED, exit_status, raised_on_all_ranks
from theanompi_ext.launch import same_software as ss


def _tree(folder, files):
    for rel, body in files.items():
        path = os.path.join(str(folder), rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, 'wb') as f:
            f.write(body)
    return str(folder)


def test_source_digest_of_a_small_tree(tmp_path):
    """By hand: each .py file in path order, as 'relative path NUL size NUL body'."""
    files = {'a.py': b'x = 1\n', 'sub/b.py': b'y = 2\n'}
    folder = _tree(tmp_path / 'pkg', files)
    h = hashlib.sha256()
    for rel in ('a.py', 'sub/b.py'):
        h.update(rel.encode() + b'\0' + str(len(files[rel])).encode() + b'\0' + files[rel])
    assert ss.source_digest(folder) == h.hexdigest()


def test_source_digest_sees_a_change_and_nothing_else(tmp_path):
    files = {'a.py': b'x = 1\n', 'sub/b.py': b'y = 2\n'}
    base = ss.source_digest(_tree(tmp_path / 'base', files))
    # the same sources elsewhere, with compiled files and other files beside them
    same = _tree(tmp_path / 'same', dict(files, **{'__pycache__/a.cpython-311.pyc': b'\0',
                                                  'sub/notes.txt': b'not source'}))
    assert ss.source_digest(same) == base
    for name, changed in [('a byte', {'a.py': b'x = 2\n'}),
                          ('a line added', {'sub/b.py': b'y = 2\n# edited\n'}),
                          ('a file added', {'c.py': b''}),
                          ('a file moved', {'a.py': None, 'sub/a.py': b'x = 1\n'})]:
        tree = dict(files, **changed)
        tree = {k: v for k, v in tree.items() if v is not None}
        got = ss.source_digest(_tree(tmp_path / name.replace(' ', '_'), tree))
        assert got != base, name


def test_this_software():
    import mpi4py
    from importlib import metadata
    mine = ss.this_software('MPICH Version: 9')
    assert mine['theanompi_ext'] == '%s, source %s' % (__version__,
                                                       ss.source_digest(PACKAGE)[:12])
    assert mine['Python'] == platform.python_version()
    assert mine['numpy'] == np.__version__ and mine['mpi4py'] == mpi4py.__version__
    assert mine['Theano'] == metadata.version('Theano')
    assert mine['MPI library'] == 'MPICH Version: 9'
    assert mine['where'] == PACKAGE and mine['format'] == ss.FORMAT


def _sw(**changes):
    base = {'format': ss.FORMAT, 'theanompi_ext': '0.1.0, source aaaaaaaaaaaa',
            'Python': '3.11.2', 'numpy': '1.23.5', 'Theano': '1.0.5', 'mpi4py': '4.1.2',
            'MPI library': 'MPICH Version: 5.0.2', 'where': '/opt/a/theanompi_ext',
            'mixed': False}
    base.update(changes)
    return base


def test_differences_name_what_differs_where():
    same = [('h0', _sw()), ('h0', _sw(where='/elsewhere/theanompi_ext')), ('h1', _sw())]
    assert ss.differences(same) == []          # where it was loaded from is not compared
    other = _sw(**{'theanompi_ext': '0.1.0, source bbbbbbbbbbbb', 'where': '/opt/b/x',
                   'numpy': '1.26.4'})
    every = [('h0', _sw()), ('h0', _sw()), ('h1', other), ('h1', other), ('h2', _sw())]
    assert ss.differences(every) == [
        'theanompi_ext 0.1.0, source aaaaaaaaaaaa (ranks 0,1,4 on h0, h2 from '
        '/opt/a/theanompi_ext) vs 0.1.0, source bbbbbbbbbbbb (ranks 2-3 on h1 from /opt/b/x)',
        'numpy 1.23.5 (ranks 0,1,4 on h0, h2) vs 1.26.4 (ranks 2-3 on h1)']
    # no majority: the lower rank's first
    assert ss.differences([('h0', _sw(Python='3.12.1')), ('h1', _sw())]) == [
        'Python 3.12.1 (rank 0 on h0) vs 3.11.2 (rank 1 on h1)']


def test_a_rank_with_another_start_up():
    """An answer that is no descriptor of this format: another version's first exchange."""
    for odd, host in ((('h1', True), 'h1'), (('h1', _sw(format=ss.FORMAT + 1)), 'h1'),
                      (True, 'a host not said'), ([1, 2], 'a host not said'),
                      (_sw(), 'a host not said'), (('h1', 2, 3), 'a host not said')):
        parts = ss.differences([('h0', _sw()), odd])
        assert parts == ["rank 1 on %s answered the start-up's first exchange with something "
                         "else: another theanompi_ext runs there (a version without this "
                         "check, or a later format)" % host], odd
        with pytest.raises(ss.SoftwareMismatch, match='rank 1 on %s answered' % host):
            ss.check_same_software(Ranks(0, [odd]))


def test_a_stranger_for_rank_0_is_refused_though_this_rank_allows_mixing(monkeypatch):
    monkeypatch.setenv(ss.MIXED_VAR, '1')        # rank 0's would decide: it has none
    with pytest.raises(ss.SoftwareMismatch, match='rank 0 on a host not said answered'):
        ss.check_same_software(Ranks(1, [True]))


class Ranks(object):
    """Rank ``rank`` of a job whose other ranks answer ``others`` (host, software)."""

    def __init__(self, rank, others):
        self.rank, self.size, self.others = rank, len(others) + 1, others

    def allgather_bounded(self, obj, timeout_s, label=None):
        assert timeout_s == ss.FIRST_EXCHANGE_S, timeout_s
        out = list(self.others)
        out.insert(self.rank, obj)
        return json.loads(json.dumps(out))       # as the values travel


def test_check_refuses_on_every_rank(monkeypatch):
    monkeypatch.delenv(ss.MIXED_VAR, raising=False)
    other = ss.this_software('MPICH Version: 9')
    assert ss.check_same_software(Ranks(0, [('far', other)]), 'MPICH Version: 9') == []
    other = dict(other, numpy='0.0.1')
    for rank in (0, 1):
        with pytest.raises(ss.SoftwareMismatch) as e:
            ss.check_same_software(Ranks(rank, [('far', other)]), 'MPICH Version: 9')
        assert ' software: numpy ' in str(e.value)
        assert '%s (rank %d on ' % (np.__version__, rank) in str(e.value)
        assert '0.0.1 (rank %d on far)' % (1 - rank) in str(e.value)
        assert str(e.value).endswith('or set THEANOMPI_EXT_MIXED_SOFTWARE=1 to run anyway')
        assert exit_status(e.value) == EXIT_BAD_INPUT and raised_on_all_ranks(e.value)
    # another MPI library on a rank: named too
    with pytest.raises(ss.SoftwareMismatch, match=r'MPI library Open MPI v5 \(rank 0 on '):
        ss.check_same_software(Ranks(0, [('far', ss.this_software('MPICH'))]), 'Open MPI v5')


def test_mixed_is_rank_0s_choice(monkeypatch):
    """Rank 0's THEANOMPI_EXT_MIXED_SOFTWARE=1 turns the refusal into its warning on
    every rank; another rank's alone does not (each rank decides from rank 0's)."""
    other = dict(ss.this_software(), numpy='0.0.1')
    warned = []
    monkeypatch.setenv(ss.MIXED_VAR, '1')
    parts = ss.check_same_software(Ranks(0, [('far', other)]), warn=warned.append)
    assert parts == ['numpy %s (rank 0 on %s) vs 0.0.1 (rank 1 on far)'
                     % (np.__version__, __import__('socket').gethostname())]
    assert warned == ['theanompi-ext: warning: the ranks do not all run the same software: '
                      '%s (going on: THEANOMPI_EXT_MIXED_SOFTWARE=1)' % parts[0]]
    # rank 1 whose rank 0 allows it: no refusal, and only rank 0 warns
    warned = []
    assert ss.check_same_software(Ranks(1, [('h0', dict(other, mixed=True))]),
                                  warn=warned.append) and warned == []
    # rank 1 allows it, rank 0 does not
    with pytest.raises(ss.SoftwareMismatch):
        ss.check_same_software(Ranks(1, [('h0', dict(other, mixed=False))]))
    monkeypatch.setenv(ss.MIXED_VAR, '0')
    with pytest.raises(ss.SoftwareMismatch):
        ss.check_same_software(Ranks(0, [('far', other)]))


def test_one_rank_checks_nothing():
    assert ss.check_same_software(Ranks(0, [])) == []


TRAIN = ['-m', 'theanompi_ext', 'train', '--workers', '2', '--model', 'mlp',
         '--batch-per-worker', '8', '--max-steps', '3', '--warmup', 'none',
         '--eval-every', '1000']


def _own_mpiexec(tmp_path, copy_parent, monkeypatch, **env):
    """``train`` on 2 ranks of the user's own mpiexec, rank 1 importing the package
    from ``copy_parent`` first; run in ``tmp_path`` (not the checkout, which a
    rank's ``python -m`` would put first on its path)."""
    out = tmp_path / ('run%d' % len(list(tmp_path.iterdir())))
    argv = TRAIN + ['--out', str(out)]
    cmd = [mpiexec(), '-n', '1', sys.executable] + argv + [
        ':', '-n', '1', 'env', 'PYTHONPATH=%s' % copy_parent, sys.executable] + argv
    monkeypatch.chdir(tmp_path)
    rc, stdout, stderr, _ = job(cmd, env=dict(root_on_path(), **env))
    return rc, stdout, stderr, out


@pytest.fixture
def edited_copy(tmp_path):
    """The folder holding a copy of the package with one comment line added."""
    return pathlib.Path(another_install(tmp_path)[1]).parent


def test_two_ranks_with_different_sources_are_refused(tmp_path, edited_copy, monkeypatch):
    """Both copies named with their digests and folders, exit status 2, nothing trained."""
    rc, stdout, stderr, out = _own_mpiexec(tmp_path, edited_copy, monkeypatch)
    ours = ss.source_digest(PACKAGE)[:12]
    theirs = ss.source_digest(str(edited_copy / 'theanompi_ext'))[:12]
    assert ours != theirs
    assert rc == EXIT_BAD_INPUT, stdout + stderr[-3000:]
    # each rank's line names its own copy ([at ...]): rank 0 says both, one a line
    expected = ('rank 0 of 2 failed: SoftwareMismatch: the ranks do not all run the same '
                'software: theanompi_ext %s, source %s (rank 0 on ' % (__version__, ours))
    assert expected in stderr, stderr[-3000:]
    assert ' from %s) vs %s, source %s (rank 1 on ' % (PACKAGE, __version__, theirs) in stderr
    assert ' from %s)' % (edited_copy / 'theanompi_ext') in stderr
    assert 'epoch' not in stdout and not (out / 'params.npz').exists()


def test_mixed_software_allowed_trains_with_a_warning(tmp_path, edited_copy, monkeypatch):
    rc, stdout, stderr, out = _own_mpiexec(tmp_path, edited_copy, monkeypatch,
                                           THEANOMPI_EXT_MIXED_SOFTWARE='1')
    assert rc == 0, stdout + stderr[-3000:]
    assert stderr.count('theanompi-ext: warning: the ranks do not all run the same '
                        'software: theanompi_ext') == 1, stderr[-3000:]
    assert '(going on: THEANOMPI_EXT_MIXED_SOFTWARE=1)' in stderr
    assert (out / 'params.npz').exists()


# --------------------------------------------------------------------------- model code

def test_model_code_is_the_package_or_the_file(tmp_path, monkeypatch):
    """A model in a package is compared by the whole package (its layers live beside
    it); one in a module of its own by that file."""
    import importlib
    _tree(tmp_path, {'zoo/__init__.py': b'', 'zoo/layers.py': b'W = 1\n',
                     'zoo/nets.py': b'class Net(object):\n    pass\n',
                     'solo.py': b'class Net(object):\n    pass\n'})
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ('zoo', 'zoo.nets', 'zoo.layers', 'solo'):
        monkeypatch.delitem(sys.modules, name, raising=False)
    net = importlib.import_module('zoo.nets').Net
    assert ss.model_code(net) == ('zoo', str(tmp_path / 'zoo'))
    assert ss.code_digest(str(tmp_path / 'zoo')) == ss.source_digest(str(tmp_path / 'zoo'))
    solo = importlib.import_module('solo').Net
    assert ss.model_code(solo) == ('solo', str(tmp_path / 'solo.py'))
    body = b'class Net(object):\n    pass\n'
    expected = hashlib.sha256(b'solo.py\0' + str(len(body)).encode() + b'\0' + body)
    assert ss.code_digest(str(tmp_path / 'solo.py')) == expected.hexdigest()
    assert ss.model_code(type('Made', (object,), {'__module__': 'nowhere'})) is None


def test_model_code_refused_or_warned(monkeypatch):
    class Net(object):
        pass
    monkeypatch.delenv(ss.MIXED_VAR, raising=False)
    name, path = ss.model_code(Net)
    theirs = {'format': ss.FORMAT, 'mixed': False, 'model': '%s, source 000000000000' % name,
              'where': '/far/' + name}
    with pytest.raises(ss.SoftwareMismatch) as e:
        ss.check_same_model_code(Ranks(0, [('far', theirs)]), Net)
    digest = ss.code_digest(path)[:12]
    assert str(e.value).startswith(
        'the ranks do not all run the same software: model %s, source %s (rank 0 on %s from '
        '%s) vs %s, source 000000000000 (rank 1 on far from /far/%s). Give every host the '
        'same model files' % (name, digest, __import__('socket').gethostname(), path, name,
                              name)), str(e.value)
    mine = dict(theirs, model='%s, source %s' % (name, digest))
    assert ss.check_same_model_code(Ranks(1, [('h0', mine)]), Net) == []
    warned = []
    monkeypatch.setenv(ss.MIXED_VAR, '1')
    assert ss.check_same_model_code(Ranks(0, [('far', theirs)]), Net, warn=warned.append)
    assert len(warned) == 1


def test_a_session_whose_model_differs_on_a_rank_is_refused(tmp_path, monkeypatch):
    """A Theano-MPI session's worker on 2 real ranks, rank 1 importing a copy of the
    model's package with one line added: status 2 before the model is built, both
    copies named (the software is the same: only the model differs)."""
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    dropin, lasagne = os.path.join(tests, 'dropin'), os.path.join(tests, 'fake_lasagne')
    copy = tmp_path / 'far' / 'tmzoo'
    shutil.copytree(os.path.join(dropin, 'tmzoo'), str(copy),
                    ignore=shutil.ignore_patterns('__pycache__'))
    with open(str(copy / 'subbatch.py'), 'a') as f:
        f.write('# edited on one host\n')
    worker = ['-m', 'theanompi_ext.theanompi_compat.worker', 'tmzoo.subbatch', 'Cifar10Like',
              'kn', 'ar', 'cpu0,cpu1']
    path = root_on_path()['PYTHONPATH']
    cmd = [mpiexec(), '-n', '1', 'env', 'PYTHONPATH=%s' % os.pathsep.join([dropin, lasagne,
                                                                            path]),
           sys.executable] + worker + [
        ':', '-n', '1', 'env', 'PYTHONPATH=%s' % os.pathsep.join([str(copy.parent), lasagne,
                                                                   path]),
        sys.executable] + worker
    monkeypatch.chdir(tmp_path)       # the worker looks for the model module here first
    rc, stdout, stderr, _ = job(cmd, env={'HOME': str(tmp_path)}, unset=('THEANO_FLAGS',))
    assert rc == EXIT_BAD_INPUT, stdout + stderr[-3000:]
    ours = ss.code_digest(os.path.join(dropin, 'tmzoo'))[:12]
    theirs = ss.code_digest(str(copy))[:12]
    assert ('SoftwareMismatch: the ranks do not all run the same software: model tmzoo, '
            'source %s (rank 0 on ' % ours) in stderr, stderr[-3000:]
    assert ' from %s) vs tmzoo, source %s (rank 1 on ' % (os.path.join(dropin, 'tmzoo'),
                                                         theirs) in stderr
    assert 'theanompi_ext ' not in stderr.split('SoftwareMismatch')[1].split('\n')[0]


def test_a_rank_that_never_takes_part_ends_the_job(tmp_path, monkeypatch):
    """Rank 1 stands in for a version older than the check: it starts MPI, makes the
    same two communicators, then waits in another collective. Rank 0 (``train``)
    ends the job once THEANOMPI_EXT_FIRST_EXCHANGE_S (3 s) has passed, naming the
    first exchange (exit status 3, every process gone); against two real older
    versions of the package the job used to hang until killed."""
    stand_in = ('from mpi4py import MPI\nw = MPI.COMM_WORLD\nw.Dup(); w.Dup()\n'
                'w.allgather("an older start-up")\n')
    out = tmp_path / 'run'
    cmd = [mpiexec(), '-n', '1', sys.executable] + TRAIN + ['--out', str(out)] + [
        ':', '-n', '1', sys.executable, '-c', stand_in]
    monkeypatch.chdir(tmp_path)
    t0 = time.monotonic()
    rc, stdout, stderr, _ = job(cmd, timeout=120,
                                env=dict(root_on_path(), THEANOMPI_EXT_FIRST_EXCHANGE_S='3'))
    took = time.monotonic() - t0
    assert rc == EXIT_FAILED, stdout + stderr[-3000:]
    assert ("rank 0 of 2 failed: CollectiveTimeout: rank 0 of 2: not every rank took part "
            "in the job's first exchange (which software each rank runs) within 3 s: a rank "
            "runs another theanompi_ext") in stderr, stderr[-3000:]
    assert took < 60, took
    assert not (out / 'params.npz').exists()


def test_first_exchange_limit_from_the_environment():
    assert ss.first_exchange_s({}) == ss.FIRST_EXCHANGE_S
    assert ss.first_exchange_s({ss.FIRST_EXCHANGE_VAR: '2.5'}) == 2.5
    for bad in ('0', '-1', 'nan', 'inf', 'soon'):
        with pytest.raises(ValueError, match='THEANOMPI_EXT_FIRST_EXCHANGE_S=%r: not a number '
                                             'of seconds > 0' % bad):
            ss.first_exchange_s({ss.FIRST_EXCHANGE_VAR: bad})
