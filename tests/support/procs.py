"""Processes the tests start: mpiexec jobs under a hard timeout, process trees.

Every job a test starts ends within its timeout: a hang fails the test
instead of hanging the suite.
"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from theanompi_ext.collective.world import SINGLETON_ENV
from theanompi_ext.launch.mpiexec import mpiexec_command
from theanompi_ext.launch.postmortem import explained_command
from support.paths import MPI_DIR

JOB_TIMEOUT = 240


def mpiexec():
    """The mpiexec of this Python's environment (the mpich wheel's), else the one on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), 'mpiexec')
    return here if os.path.exists(here) else 'mpiexec'


def mpi_cmd(nprocs, script, *args):
    """The command line running tests/mpi/<script> on ``nprocs`` ranks, as the
    launcher writes it (Open MPI: more ranks than cores allowed)."""
    return mpiexec_command(nprocs, [sys.executable, os.path.join(MPI_DIR, script)]
                           + [str(a) for a in args], mpiexec=mpiexec())


def explained(cmd, size):
    """``cmd`` (an mpiexec line) run the way ``theanompi-ext train --workers`` runs it."""
    return explained_command(cmd, size)


def run_mpi(nprocs, script, *args, timeout=300, env=None):
    """Run tests/mpi/<script> on ``nprocs`` ranks; a hang fails the test.

    Returns the CompletedProcess (stdout/stderr as text).
    """
    full_env = dict(os.environ)
    full_env.update(env or {})
    try:
        return subprocess.run(mpi_cmd(nprocs, script, *args), capture_output=True, text=True,
                              timeout=timeout, env=full_env, start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        pytest.fail('%d-rank %s hung for %ss:\n%s\n%s' % (nprocs, script, timeout,
                                                        exc.stdout, exc.stderr))


def run_alone(script, *args, timeout=300, env=None):
    """Run tests/mpi/<script> as one plain process, no mpiexec (MPI's singleton
    init: a world of one rank); a hang fails the test. Returns the CompletedProcess."""
    # as the package starts MPI alone (collective/world.starting_mpi)
    full_env = dict(SINGLETON_ENV, **os.environ)
    full_env.update(env or {})
    cmd = [sys.executable, os.path.join(MPI_DIR, script)] + [str(a) for a in args]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env=full_env, start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        pytest.fail('%s alone hung for %ss:\n%s\n%s' % (script, timeout, exc.stdout, exc.stderr))


def run_mpi_json(nprocs, script, *args, timeout=300, env=None):
    """:func:`run_mpi` that must exit 0; returns the JSON of the last stdout line."""
    res = run_mpi(nprocs, script, *args, timeout=timeout, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def descendants(pid):
    """PIDs of every process below ``pid`` (from /proc)."""
    children = {}
    for entry in os.listdir('/proc'):
        if not entry.isdigit():
            continue
        try:
            with open('/proc/%s/stat' % entry) as f:
                ppid = int(f.read().rsplit(')', 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def command_words(pid):
    """The words of process ``pid``'s command line ([''] once it is gone)."""
    try:
        with open('/proc/%d/cmdline' % pid, 'rb') as f:
            return f.read().decode(errors='replace').split('\0')
    except OSError:
        return ['']


def shm_made_since(t0):
    """MPI's files of this user in /dev/shm changed since ``t0`` (time.time()) that
    no process maps: what a job's killed ranks left (launch/mpi_leftovers.py)."""
    from theanompi_ext.launch import mpi_leftovers
    return [n for n in mpi_leftovers.leftovers(0.0)
            if os.stat(os.path.join(mpi_leftovers.SHM_DIR, n)).st_ctime >= t0 - 1]


def the_mpiexec(pid):
    """The PIDs of the mpiexec (hydra's, or Open MPI's prterun) among ``pid``'s
    descendants (a launcher's job)."""
    return [p for p in descendants(pid)
            if os.path.basename(command_words(p)[0]) in ('mpiexec', 'prterun')]


def alive(pid):
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        with open('/proc/%d/stat' % pid) as f:
            return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except OSError:
        return False


def job(cmd, timeout=JOB_TIMEOUT, env=None, unset=()):
    """Run ``cmd``; on a timeout SIGKILL it and everything it started, then fail.

    ``env`` is added to this process's environment, the names in ``unset``
    are taken out of it.

    hydra puts its proxy and the ranks in sessions of their own, so killing
    the process group is not enough; the tree is walked instead. Returns
    ``(returncode, stdout, stderr, time it ended)``.
    """
    full_env = dict(os.environ)
    full_env.update(env or {})
    for name in unset:
        full_env.pop(name, None)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=full_env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for pid in [proc.pid] + descendants(proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        out, err = proc.communicate()
        pytest.fail('%s hung for %ss:\n%s\n%s' % (cmd[:6], timeout, out[-3000:], err[-3000:]))
    return proc.returncode, out, err, time.time()
