"""Build the wheel, install it in a fresh venv, and run it from outside the tree.

What a user of ``pip install theanompi_ext-*.whl`` gets, not the editable
checkout: the wheel must hold every module of the package (a folder without
``__init__.py`` would be left out silently) and both console scripts, and
``theanompi-ext info``, ``check-equivalence`` and a short ``train`` must run
from a folder where the source tree cannot be imported. The new venv takes
its packages under ``constraints.txt`` (from the pip cache when warm).

Run with the project's venv (``make check-wheel``); ``--keep DIR`` leaves the
venv and the run there. Exits 1 naming the first step that failed.
"""
import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = os.environ.get('PYTHON', 'python3.11')


def step(label, cmd, cwd, timeout=900, env=None):
    """Run one step; its standard output as lines; SystemExit naming it if it fails."""
    print('== %s: %s' % (label, ' '.join(cmd)))
    sys.stdout.flush()
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    if r.returncode != 0:
        print('\n'.join((r.stdout + r.stderr).strip().splitlines()[-25:]))
        raise SystemExit('check-wheel: %s failed (exit %d)' % (label, r.returncode))
    return r.stdout.strip().splitlines() or ['']


def wheel_modules(path):
    """The .py files of the package inside the wheel, as repository paths."""
    with zipfile.ZipFile(path) as z:
        return sorted(n for n in z.namelist()
                      if n.startswith('theanompi_ext/') and n.endswith('.py'))


def tree_modules():
    """The .py files of the package that git tracks."""
    out = subprocess.run(['git', 'ls-files', 'theanompi_ext'], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return sorted(p for p in out.split() if p.endswith('.py'))


def entry_points(path):
    """The console_scripts section of the wheel's entry_points.txt."""
    with zipfile.ZipFile(path) as z:
        name = next(n for n in z.namelist() if n.endswith('.dist-info/entry_points.txt'))
        return z.read(name).decode()


def main(argv=None):
    """Build, install, run; one line per step."""
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--keep', help='build here and leave it (default: a temporary folder)')
    args = p.parse_args(argv)
    work = args.keep or tempfile.mkdtemp(prefix='tmx-wheel-')
    os.makedirs(work, exist_ok=True)
    try:
        dist = os.path.join(work, 'dist')
        step('build', [sys.executable, '-m', 'pip', 'wheel', '-q', '--no-deps',
                       '--no-build-isolation', '-w', dist, ROOT], cwd=work)
        wheel = glob.glob(os.path.join(dist, 'theanompi_ext-*.whl'))[0]
        missing = sorted(set(tree_modules()) - set(wheel_modules(wheel)))
        if missing:
            raise SystemExit('check-wheel: the wheel lacks %d module(s): %s (a folder '
                             'without __init__.py?)' % (len(missing), ', '.join(missing[:8])))
        scripts = entry_points(wheel)
        for name in ('theanompi-ext', 'tmxlauncher'):
            if name not in scripts:
                raise SystemExit('check-wheel: console script %s missing from the wheel' % name)
        print('   %s: %d modules, console scripts theanompi-ext and tmxlauncher'
              % (os.path.basename(wheel), len(wheel_modules(wheel))))
        venv = os.path.join(work, 'venv')
        step('venv', [PYTHON, '-m', 'venv', venv], cwd=work)
        bindir = os.path.join(venv, 'bin')
        step('install', [os.path.join(bindir, 'python'), '-m', 'pip', 'install', '-q',
                         '-c', os.path.join(ROOT, 'constraints.txt'), wheel + '[mpich]'],
             cwd=work)
        run = os.path.join(work, 'run')   # outside the tree: only the wheel imports
        os.makedirs(run, exist_ok=True)
        where = step('import', [os.path.join(bindir, 'python'), '-c',
                                'import theanompi_ext; print(theanompi_ext.__file__)'], cwd=run)
        if not where[-1].startswith(venv):
            raise SystemExit('check-wheel: theanompi_ext imported from %s, not the venv'
                             % where[-1])
        env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get('PATH', ''))
        env.pop('PYTHONPATH', None)
        env.pop('THEANOMPI_EXT_MPIEXEC', None)
        info = step('info', [os.path.join(bindir, 'theanompi-ext'), 'info'], cwd=run, env=env)
        print('   ' + '\n   '.join(info))
        eq = step('check-equivalence', [os.path.join(bindir, 'theanompi-ext'),
                                        'check-equivalence', '--workers', '2', '--steps', '2'],
                  cwd=run, env=env)
        print('   ' + eq[-1])
        out = os.path.join(run, 'train')
        tr = step('train', [os.path.join(bindir, 'theanompi-ext'), 'train', '--workers', '2',
                            '--model', 'digits_cnn', '--epochs', '1', '--batch-per-worker', '32',
                            '--warmup-epochs', '0', '--out', out], cwd=run, env=env)
        print('   ' + tr[-1])
        if not os.path.exists(os.path.join(out, 'summary.json')):
            raise SystemExit('check-wheel: train wrote no summary.json in %s' % out)
        step('tmxlauncher', [os.path.join(bindir, 'tmxlauncher'), '--help'], cwd=run, env=env)
        print('check-wheel: ok')
        return 0
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == '__main__':
    sys.exit(main())
