"""Files that are whole or absent: atomic writes.

Every file the project writes for a user (checkpoints, ``params.npz``,
``summary.json``, curves, timelines, converted data sets) goes through here:

* :func:`write_atomic` writes bytes already built in memory: a free-space
  check (the size is known), one write into ``PATH.tmp-<pid>`` in the same
  folder, fsync, ``os.replace`` over ``PATH``, fsync of the folder. Any
  failure removes the temporary file and raises :class:`WriteError`, one
  line naming the path and the cause. A reader sees the old file or the
  new one, never a mix.
* :func:`write_json` and :func:`write_figure` build a JSON document or a
  matplotlib figure in memory and write it so.
* :func:`write_all` does the same for several files: every temporary is
  written before the first rename, so a full disk leaves all the old files.

Stop signals that arrive during a write wait for it (:mod:`.signals`).
Building a file in memory first isolates HDF5 from the disk: the pinned
h5py 3.16 / HDF5 2.0.0 segfaults when its own writes into a full tmpfs fail
(docs/faults.md); ``os.write`` fails cleanly with ENOSPC.
"""
import errno
import io
import json
import os

from ..errors import WriteError
from .signals import deferred_signals

#: Free space kept beyond the file itself (metadata, other writers).
MARGIN_BYTES = 1 << 20


def tmp_path(path):
    """The temporary name :func:`write_atomic` uses for ``path`` in this process."""
    return '%s.tmp-%d' % (path, os.getpid())


def human_bytes(n):
    """``n`` bytes as a short human-readable string."""
    for unit in ('bytes', 'KB', 'MB', 'GB'):
        if abs(n) < 1024 or unit == 'GB':
            return ('%d %s' % (n, unit)) if unit == 'bytes' else ('%.1f %s' % (n, unit))
        n /= 1024.0


def free_bytes(folder):
    """Bytes an unprivileged writer may still use in ``folder`` (None if unknown)."""
    try:
        st = os.statvfs(folder)
    except (OSError, AttributeError):
        return None
    return st.f_bavail * st.f_frsize


def check_space(path, nbytes, what='the file'):
    """Raise :class:`WriteError` unless ``nbytes`` (+ a margin) fit next to ``path``."""
    folder = os.path.dirname(os.path.abspath(path))
    free = free_bytes(folder)
    if free is not None and free < nbytes + MARGIN_BYTES:
        raise WriteError(errno.ENOSPC, '%s: not enough free space to write %s: needs %s, '
                         '%s free' % (path, what, human_bytes(nbytes), human_bytes(free)))


def fsync_dir(folder):
    """Make a rename in ``folder`` durable (not possible on every filesystem)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _describe(exc):
    return exc.strerror or str(exc) if isinstance(exc, OSError) else str(exc)


def _write_tmp(path, data, what):
    """Write ``data`` to the temporary of ``path``; return its name (removed on failure)."""
    tmp = tmp_path(path)
    try:
        check_space(path, len(data), what)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException as exc:
        remove_quietly(tmp)
        if isinstance(exc, WriteError) or not isinstance(exc, OSError):
            raise
        raise WriteError(exc.errno, '%s: could not write %s: %s' % (path, what, _describe(exc)))
    return tmp


def write_atomic(path, data, what='the file', keep_previous=None):
    """Replace ``path`` by ``data`` (bytes) atomically; see the module docstring.

    ``keep_previous``: a path that receives the version being replaced (a
    hard link, so no copy; skipped where links are not possible), e.g. the
    previous good checkpoint. Signals are deferred while the file is written.
    """
    with deferred_signals():
        tmp = _write_tmp(path, data, what)
        try:
            if keep_previous and os.path.exists(path):
                _link_over(path, keep_previous)
            os.replace(tmp, path)
        except OSError as exc:
            remove_quietly(tmp)
            raise WriteError(exc.errno, '%s: could not write %s: %s'
                             % (path, what, _describe(exc)))
        fsync_dir(os.path.dirname(os.path.abspath(path)))
    return path


def write_json(path, obj, what='the JSON file', **dump_kw):
    """``obj`` as JSON (``json.dumps(obj, **dump_kw)``), written by :func:`write_atomic`."""
    return write_atomic(path, json.dumps(obj, **dump_kw).encode('utf-8'), what)


def write_figure(fig, path, what='the figure', **savefig_kw):
    """Matplotlib figure ``fig`` rendered into memory (its format from ``path``'s
    extension, PNG without one), then written by :func:`write_atomic`."""
    buf = io.BytesIO()
    fmt = os.path.splitext(path)[1].lstrip('.').lower() or 'png'
    fig.savefig(buf, format=fmt, **savefig_kw)
    return write_atomic(path, buf.getvalue(), what)


def write_all(files, what='the outputs'):
    """Write ``{path: bytes}`` atomically, all temporaries first, renamed in order.

    A failure before the renames (a full disk) leaves every old file in place
    and no temporary behind. The renames follow the dict's order, so put the
    file that records the others (a summary) last.
    """
    done = []
    with deferred_signals():
        try:
            for path, data in files.items():
                done.append((_write_tmp(path, data, what), path))
            for tmp, path in done:
                os.replace(tmp, path)
        except BaseException as exc:
            for tmp, _ in done:
                remove_quietly(tmp)
            if isinstance(exc, OSError) and not isinstance(exc, WriteError):
                raise WriteError(exc.errno, 'could not write %s: %s' % (what, _describe(exc)))
            raise
        for folder in {os.path.dirname(os.path.abspath(p)) for p in files}:
            fsync_dir(folder)
    return list(files)


def _link_over(src, dst):
    link = tmp_path(dst)
    remove_quietly(link)
    try:
        os.link(src, link)
    except OSError:
        return          # no hard links here (some network filesystems): keep only one
    os.replace(link, dst)


def remove_quietly(path):
    """Remove ``path`` if it exists; never raises."""
    try:
        os.unlink(path)
    except OSError:
        pass
