"""What MPI leaves behind when a job's processes are killed, removed.

The ranks of a host talk through files in ``/dev/shm``: MPICH's
``mpich_shm_<id>_<n>`` (one per host and job, 2 MB for 2 ranks), Open MPI
5's ``sm_segment.<host>.<uid>.<job>.<rank>`` (16 MB a rank; 4.x:
``vader_segment.*``). Each MPI removes them when its ranks end normally. A
rank killed (SIGKILL, the OOM killer, the launcher's stop after its grace, a
rank that MPI's own abort ends) leaves them, and ``/dev/shm`` is memory: the
fault tests of this project had left 3.7 GB there (2,377 of MPICH's files)
before this module. Open MPI's launcher and daemons also keep a session
folder, ``$TMPDIR/ompi.<pid>`` (about 120 KB), left when they are killed.

:func:`sweep` removes this user's shared-memory files that no running
process maps and that are older than ``min_age_s`` (a file just created is
mapped at once by the rank that made it; the age keeps a sweep off one in
the microseconds between), and this user's session folders whose process
is gone. Whatever runs keeps its files: a job in progress, a job
suspended, another user's job (whose files this user cannot remove
anyway). Called by the launcher when its job has ended and its ranks on this
host are gone (:func:`sweep_after_job`, from ``launch/postmortem.run_explained``
and after each attempt of ``train/restarts.supervise``) and by the first
rank of each host when it starts (:data:`AT_START_S`): the leftovers of
killed jobs on the other hosts, which the launcher cannot reach. One
limit: a process of this user in another PID namespace that shares this
``/dev/shm`` (a container started with ``--ipc=host``) is not seen.
"""
import os
import re
import shutil
import tempfile
import time

from ..files.stale import entries_of_dead_pids

SHM_DIR = '/dev/shm'
#: The names MPI gives its files (MPICH 4-5; Open MPI 5; Open MPI 4).
MPI_FILES = re.compile(r'^(mpich_shm_[0-9a-f]+_\d+|sm_segment\..+|vader_segment\..+)$')
#: Open MPI's session folders (prterun's, a daemon's): ``ompi.<its pid>``.
SESSION_FOLDER = re.compile(r'^ompi\.(\d+)$')
#: ``min_age_s`` of the launcher's sweep once its job has ended (its ranks gone).
AFTER_JOB_S = 0.5
#: How long the launcher waits for its ranks on this host to be gone before it
#: sweeps (mpiexec may exit before the ranks it SIGKILLed have).
RANKS_GONE_S = 2.0
#: ``min_age_s`` of a rank's sweep when it starts: other jobs of this user may be
#: starting at that moment. ``$THEANOMPI_EXT_SHM_SWEEP_AGE_S`` sets another.
AT_START_S = 60.0
AGE_VAR = 'THEANOMPI_EXT_SHM_SWEEP_AGE_S'


def mapped(uid=None, proc='/proc'):
    """The files under ``/dev/shm`` that the processes of user ``uid`` (this
    process's) map now, as paths. (MPI's files are the user's own, mode 0600:
    only that user's processes map them.)"""
    uid = os.getuid() if uid is None else uid
    found = set()
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return found
    for pid in pids:
        try:
            if os.stat(os.path.join(proc, pid)).st_uid != uid:
                continue
            with open(os.path.join(proc, pid, 'maps')) as f:
                for line in f:
                    if SHM_DIR + '/' in line:
                        found.add(line.split(None, 5)[-1].rstrip('\n'))
        except OSError:           # gone meanwhile, or not ours to read
            continue
    return found


def leftovers(min_age_s, folder=SHM_DIR, in_use=None, now=None, uid=None):
    """The names of MPI's files in ``folder`` owned by ``uid`` (this user) that no
    process maps (``in_use``: paths, default :func:`mapped`) and that were last
    changed at least ``min_age_s`` seconds before ``now``."""
    uid = os.getuid() if uid is None else uid
    now = time.time() if now is None else now
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    old = []
    for name in sorted(names):
        if not MPI_FILES.match(name):
            continue
        try:
            st = os.lstat(os.path.join(folder, name))
        except OSError:
            continue
        if st.st_uid == uid and now - st.st_ctime >= min_age_s:
            old.append(name)
    if not old:           # nothing to ask the processes about
        return []
    in_use = mapped(uid) if in_use is None else in_use
    return [name for name in old if os.path.join(folder, name) not in in_use]


def session_folders(tmpdirs=None, uid=None):
    """The paths of Open MPI's session folders (``ompi.<pid>``) of user ``uid``
    (this one) in ``tmpdirs`` (default: ``$TMPDIR`` and ``/tmp``) whose process
    is gone."""
    uid = os.getuid() if uid is None else uid
    if tmpdirs is None:
        tmpdirs = sorted({tempfile.gettempdir(), '/tmp'})
    found = []
    for tmpdir in tmpdirs:
        for name in sorted(entries_of_dead_pids(tmpdir, SESSION_FOLDER)):
            path = os.path.join(tmpdir, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if st.st_uid == uid and os.path.isdir(path) and not os.path.islink(path):
                found.append(path)
    return found


def sweep(min_age_s, folder=SHM_DIR, tmpdirs=None):
    """Remove :func:`leftovers` (in ``folder``) and :func:`session_folders`;
    return the names removed. Never raises: the sweep only tidies, and a
    job's end or start must not fail over it."""
    removed = []
    try:
        for name in leftovers(min_age_s, folder):
            try:
                os.unlink(os.path.join(folder, name))
                removed.append(name)
            except OSError:
                pass
        for path in session_folders(tmpdirs):
            shutil.rmtree(path, ignore_errors=True)
            if not os.path.exists(path):
                removed.append(os.path.basename(path))
    except Exception:   # noqa: B902 - a sweep that cannot run leaves the files
        pass
    return removed


def sweep_after_job(pids, wait_s=RANKS_GONE_S):
    """The launcher's sweep once its job has ended: first wait, at most ``wait_s``
    seconds, until the ranks ``pids`` (those of this host) are gone (a zombie has
    unmapped its memory), then :func:`sweep` files :data:`AFTER_JOB_S` old."""
    from .job_control import process_state
    deadline = time.monotonic() + wait_s
    while any(process_state(p) not in ('', 'Z', 'X') for p in pids) and \
            time.monotonic() < deadline:
        time.sleep(0.02)
    return sweep(AFTER_JOB_S)


def sweep_at_rank_start(local_rank, environ=None):
    """The first rank of a host (``local_rank`` 0) sweeps what killed jobs left,
    files at least :data:`AT_START_S` old (or ``$THEANOMPI_EXT_SHM_SWEEP_AGE_S``;
    a value that is not a number of seconds > 0 is :class:`~..errors.BadInput`)."""
    from .env_seconds import seconds_from_env
    min_age_s = seconds_from_env(AGE_VAR, AT_START_S, environ)
    return sweep(min_age_s) if local_rank == 0 else []
