"""CI starts from its own settings (.ci/clean-env.sh, sourced by .ci/run): a
caller's variables that would steer the clone's phases elsewhere (our caches,
a venv, an MPI's settings) are cleared and named, pip's are kept."""
import subprocess

from support.paths import ROOT


def _sourced(env):
    """The environment after .ci/clean-env.sh, and what it printed."""
    script = 'set -euo pipefail; source .ci/clean-env.sh; echo ===; env -0'
    res = subprocess.run(['bash', '-c', script], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=30, check=True)
    said, _, rest = res.stdout.partition('===\n')
    return dict(kv.split('=', 1) for kv in rest.split('\0') if kv), said


def test_the_callers_settings_are_cleared_and_named(tmp_path):
    venv = tmp_path / 'venv'
    (venv / 'bin').mkdir(parents=True)
    (venv / 'pyvenv.cfg').write_text('home = /usr/bin\n')
    caller = {
        'PATH': '%s/bin:/usr/local/bin::/usr/bin:/bin' % venv,
        'VIRTUAL_ENV': str(venv), 'PYTHONPATH': '/elsewhere',
        'THEANOMPI_EXT_CACHE': '/root/tree/.cache/theano', 'POCL_CACHE_DIR': '/root/p',
        'THEANOMPI_EXT_MPIEXEC': '/root/tree/mpiexec', 'OMPI_MCA_btl': 'self',
        'MPIR_CVAR_CH4_NETMOD': 'ofi', 'FI_PROVIDER': 'tcp', 'THEANO_FLAGS': 'device=cuda',
        'PIP_INDEX_URL': 'http://mirror.example/simple', 'HOME': str(tmp_path),
        'LANG': 'C.UTF-8',
    }
    env, said = _sourced(caller)
    for var in ('VIRTUAL_ENV', 'PYTHONPATH', 'THEANOMPI_EXT_CACHE', 'POCL_CACHE_DIR',
                'THEANOMPI_EXT_MPIEXEC', 'OMPI_MCA_btl', 'MPIR_CVAR_CH4_NETMOD',
                'FI_PROVIDER', 'THEANO_FLAGS'):
        assert var not in env, var
        assert var in said, said
    assert env['PATH'] == '/usr/local/bin:/usr/bin:/bin'
    assert 'PATH:%s/bin' % venv in said
    # pip's settings, HOME and the locale are the machine's, kept
    for var in ('PIP_INDEX_URL', 'HOME', 'LANG'):
        assert env[var] == caller[var]
    # the script's own names do not stay behind in .ci/run
    assert not {'cleared', 'path', 'dirs', 'dir'} & set(env)


def test_a_clean_caller_is_left_as_it_was():
    caller = {'PATH': '/usr/local/bin:/usr/bin:/bin', 'HOME': '/root', 'PIP_NO_INPUT': '1'}
    env, said = _sourced(caller)
    assert said == ''
    assert {k: env[k] for k in caller} == caller
