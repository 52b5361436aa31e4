"""A failed compiler probe ends the process (engine/core._check_compiler).

Theano's import runs ``g++ -v`` once; when that fails (a signal sent to the
process group killed it: docs/faults.md) Theano quietly runs its Python
implementations in that process, and a rank then computes with other roundings
than the rest. Here ``g++`` on PATH is a script that fails, as the killed probe did.
"""
import os
import subprocess
import sys

IMPORT = ('from theanompi_ext.engine.core import theano\n'
          'print(repr(theano.config.cxx))\n')


def _import_with(tmp_path, flags):
    fake = tmp_path / 'bin'
    fake.mkdir()
    (fake / 'g++').write_text('#!/bin/sh\nexit 1\n')
    (fake / 'g++').chmod(0o755)
    env = dict(os.environ, PATH=os.pathsep.join([str(fake), os.environ.get('PATH', '')]))
    env.pop('THEANO_FLAGS', None)
    if flags:
        env['THEANO_FLAGS'] = flags
    return subprocess.run([sys.executable, '-c', IMPORT], capture_output=True, text=True,
                          env=env, timeout=300)


def test_a_failed_probe_with_a_compiler_on_path_is_an_error(tmp_path):
    r = _import_with(tmp_path, None)
    assert r.returncode != 0
    assert 'CompilerProbeFailed' in r.stderr, r.stderr[-2000:]
    assert "found no C++ compiler, though %s is there" % (tmp_path / 'bin' / 'g++') in r.stderr
    assert 'THEANO_FLAGS=cxx=' in r.stderr


def test_no_compiler_asked_for_is_not_an_error(tmp_path):
    r = _import_with(tmp_path, 'cxx=')
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "''"
