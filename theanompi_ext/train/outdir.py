"""The output folder of a run: checked before launch, locked while the job runs.

:func:`prepare` is what ``theanompi-ext train`` does before it starts
mpiexec (and rank 0 does when the user started mpiexec):

* every output path is usable now, not hours later: ``--out`` can be created
  and written, the folder of ``--timeline`` exists and is writable;
* a folder that holds another run (``checkpoint.h5`` or ``summary.json``) is
  refused unless ``--resume`` (continue it) or ``--overwrite`` (replace it);
* with ``--resume`` the checkpoint's checksum and the options that change
  the trajectory are checked (``train/checkpoint.py``);
* a lock (``OUT/.theanompi-ext.lock``, ``flock``) refuses a second job on
  the same folder. The kernel drops the lock when its holder dies, so the
  lock of a dead job is never in the way; the file names the holder.
* temporary files left by a killed writer (``*.tmp-<pid>``) are removed.

Across hosts (``--hostfile``) rank 0 writes the outputs and checkpoints and
every rank reads the checkpoint on ``--resume``, so ``--out`` must be one
folder that every host sees (a shared filesystem). The launcher hands the
lock file's line to the ranks (:data:`MARK_VAR`); each rank reads it back
(:func:`unseen_by_this_host`), so a host that does not see the folder, or
sees a folder of its own at the same path, is found before training.

Every refusal is a :class:`OutputFolderError` (exit status 2) naming the
option and the path.
"""
import fcntl
import os
import socket
import time

from ..files import atomic, stale
from ..errors import OutputFolderError

LOCK_NAME = '.theanompi-ext.lock'
#: Set in the ranks' environment by a launcher that has done :func:`prepare`.
PREPARED_VAR = 'THEANOMPI_EXT_OUT_PREPARED'
_RUN_FILES = ('checkpoint.h5', 'summary.json')
#: Set in the ranks' environment by the launcher: the line it wrote in the lock file.
MARK_VAR = 'THEANOMPI_EXT_OUT_MARK'


def _cwd_removed():
    try:
        os.getcwd()
    except FileNotFoundError:
        return True
    return False


def _writable_folder(folder, option):
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        why = exc.strerror or exc
        if not os.path.isabs(folder) and _cwd_removed():
            why = 'the working directory it is relative to was removed; give an absolute path'
        raise OutputFolderError('%s %s: cannot create the folder: %s' % (option, folder, why))
    if not os.path.isdir(folder):
        raise OutputFolderError('%s %s: not a folder' % (option, folder))
    probe = os.path.join(folder, atomic.tmp_path('.write-probe'))
    try:
        with open(probe, 'w') as f:
            f.write('x')
    except OSError as exc:
        raise OutputFolderError('%s %s: cannot write there: %s'
                                % (option, folder, exc.strerror or exc))
    finally:
        atomic.remove_quietly(probe)


def check_paths(cfg):
    """Refuse output paths that could not be written (before anything runs)."""
    if cfg.out:
        _writable_folder(cfg.out, '--out')
    if cfg.timeline:
        folder = os.path.dirname(os.path.abspath(cfg.timeline))
        if not os.path.isdir(folder):
            raise OutputFolderError('--timeline %s: the folder %s does not exist'
                                    % (cfg.timeline, folder))
        _writable_folder(folder, '--timeline')


def check_contents(cfg):
    """Refuse a folder holding another run unless --resume/--overwrite; check a resume."""
    from . import checkpoint
    if not cfg.out:
        return
    path = os.path.join(cfg.out, checkpoint.FILENAME)
    if cfg.resume:
        info = checkpoint.describe(path)
        checkpoint.check_options(path, info['config'], cfg)
        return
    if getattr(cfg, 'overwrite', False):
        return
    found = [n for n in _RUN_FILES if os.path.exists(os.path.join(cfg.out, n))]
    if found:
        raise OutputFolderError(
            '--out %s holds another run (%s); add --resume to continue it, or --overwrite '
            'to start a new run there (its files are then replaced)' % (cfg.out,
                                                                       ', '.join(found)))


class FolderLock(object):
    """An exclusive ``flock`` on ``OUT/.theanompi-ext.lock``, held until :meth:`release`."""

    def __init__(self, folder):
        self.path = os.path.join(folder, LOCK_NAME)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(self.fd, 200, 0).decode('utf-8', 'replace').strip()
            os.close(self.fd)
            self.fd = None
            raise OutputFolderError('--out %s is in use by another job (%s); wait for it to '
                                    'end or choose another --out'
                                    % (folder, holder or 'holder unknown'))
        os.ftruncate(self.fd, 0)
        self.holder = 'pid %d on %s since %s' % (os.getpid(), socket.gethostname(),
                                                  time.strftime('%Y-%m-%d %H:%M:%S'))
        os.pwrite(self.fd, (self.holder + '\n').encode(), 0)

    def release(self):
        """Drop the lock (idempotent); the file stays, empty of meaning."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def prepare(cfg):
    """Check every output path and the folder, take the lock; return it (or None).

    Raises :class:`OutputFolderError` or a checkpoint's CheckpointError (exit 2).
    """
    check_paths(cfg)
    if not cfg.out:
        return None
    lock = FolderLock(cfg.out)
    try:
        check_contents(cfg)
        stale.remove_stale_temporaries(cfg.out, all_of_them=True)
    except BaseException:
        lock.release()
        raise
    return lock


def unseen_by_this_host(out, environ=None):
    """Why this host does not see the launcher's ``out`` folder, or None.

    None also when no launcher marked it (:data:`MARK_VAR` unset: the user's own
    mpiexec, where rank 0 prepared the folder itself)."""
    mark = (os.environ if environ is None else environ).get(MARK_VAR)
    if not out or not mark:
        return None
    path = os.path.join(out, LOCK_NAME)
    try:
        with open(path) as f:
            found = f.readline().strip()
    except OSError as exc:
        return 'cannot read %s (%s)' % (path, exc.strerror or exc)
    if found != mark:
        return '%s is not the launcher\'s (it says %r, the launcher wrote %r)' % (
            path, found, mark)
    return None
