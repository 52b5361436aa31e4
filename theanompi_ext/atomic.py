"""Files that are whole or absent, and that prove it: atomic writes and sealed HDF5.

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
* :func:`seal` / :func:`unseal`: an HDF5 file built with a 512-byte user
  block (``h5py.File(..., userblock_size=USERBLOCK)``) carries in that
  block the SHA-256 and the length of the rest of the file. ``unseal``
  checks them before h5py sees a byte, so flipped bytes or a truncated file
  are refused with a message instead of being read (or crashing HDF5).
* :func:`deferred_signals`: SIGTERM/SIGHUP/SIGINT arriving while a file is
  written wait until it is renamed into place (then act as usual).

Building a file in memory first isolates HDF5 from the disk: the pinned
h5py 3.16 / HDF5 2.0.0 segfaults when its own writes into a full tmpfs fail
(docs/faults.md); ``os.write`` fails cleanly with ENOSPC.
"""
import contextlib
import errno
import hashlib
import io
import json
import os
import re
import signal
import threading

from .errors import CorruptFile, WriteError

#: Bytes reserved at the start of a sealed HDF5 file (a valid HDF5 user block size).
USERBLOCK = 512
_MAGIC = b'theanompi-ext sealed v1\n'
_HEADER = re.compile(rb'sha256 ([0-9a-f]{64})\nsize (\d+)\n')
#: Free space kept beyond the file itself (metadata, other writers).
MARGIN_BYTES = 1 << 20
_TMP = re.compile(r'\.tmp-(\d+)$')


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


def pid_alive(pid):
    """Whether a process ``pid`` exists on this host (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def entries_of_dead_pids(folder, pattern, include_live=False):
    """Names in ``folder`` that ``pattern`` finds (its group 1: a PID) whose process
    is gone (every match with ``include_live``); [] if ``folder`` cannot be listed."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    out = []
    for name in names:
        m = pattern.search(name)
        if m and (include_live or not pid_alive(int(m.group(1)))):
            out.append(name)
    return out


def remove_stale_temporaries(folder, all_of_them=False):
    """Delete ``*.tmp-<pid>`` files in ``folder`` left by dead writers; return their names.

    ``all_of_them``: also those whose PID is alive (the caller holds the
    folder's lock, so no writer of this project is at work there).
    """
    removed = entries_of_dead_pids(folder, _TMP, all_of_them)
    for name in removed:
        remove_quietly(os.path.join(folder, name))
    return removed


# --------------------------------------------------------------------------- sealing

def seal(data):
    """Fill the user block of an HDF5 image ``data`` with the checksum of the rest.

    ``data`` must have been built with ``userblock_size=USERBLOCK``. A writable
    buffer (``BytesIO.getbuffer()``, a bytearray) is sealed in place and
    returned, so a large checkpoint is not copied; bytes give new bytes.
    """
    view = memoryview(data)
    if view.readonly:
        return bytes(seal(bytearray(data)))
    body = view[USERBLOCK:]
    header = _MAGIC + b'sha256 %s\nsize %d\n' % (hashlib.sha256(body).hexdigest().encode(),
                                                len(body))
    if any(view[:USERBLOCK]):
        raise ValueError('the user block is not empty (built without userblock_size=%d?)'
                         % USERBLOCK)
    view[:len(header)] = header
    return data


def unseal(data, path):
    """Check a sealed file's bytes; return them or raise :class:`CorruptFile` naming ``path``."""
    head = bytes(data[:USERBLOCK])
    if not head.startswith(_MAGIC):
        if data[:8] == b'\x89HDF\r\n\x1a\n':
            raise CorruptFile('%s: has no checksum (written by an older version of '
                              'theanompi-ext, or by another program)' % path)
        raise CorruptFile('%s: not a sealed theanompi-ext file (%d bytes, the header is '
                          'missing or damaged)' % (path, len(data)))
    m = _HEADER.match(head, len(_MAGIC))
    if not m:
        raise CorruptFile('%s: the checksum header is damaged' % path)
    if any(head[m.end():]):
        raise CorruptFile('%s: the checksum header is damaged' % path)
    want_sha, want_size = m.group(1).decode(), int(m.group(2))
    body = memoryview(data)[USERBLOCK:]
    if len(body) != want_size:
        raise CorruptFile('%s: truncated or extended: %d bytes after the header, the checksum '
                          'was taken over %d' % (path, len(body), want_size))
    got = hashlib.sha256(body).hexdigest()
    if got != want_sha:
        raise CorruptFile('%s: checksum mismatch (sha256 %s..., written as %s...): the file '
                          'is corrupt' % (path, got[:12], want_sha[:12]))
    return data


def read_sealed(path):
    """The verified bytes of the sealed file ``path`` (OSError if unreadable)."""
    with open(path, 'rb') as f:
        data = f.read()
    return unseal(data, path)


def sha256_of(data):
    """Hex SHA-256 of ``data`` (bytes)."""
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------- signals

_DEFERRED = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


@contextlib.contextmanager
def deferred_signals():
    """Hold SIGTERM, SIGHUP and SIGINT until the block ends, then deliver them.

    So a job told to stop while writing finishes the write (a rename away)
    and then stops as it would have. Only in the main thread (elsewhere,
    and when nested, the block runs unchanged).
    """
    if threading.current_thread() is not threading.main_thread() or \
            getattr(_held, 'active', False):
        yield
        return
    pending = []
    old = {}
    for sig in _DEFERRED:
        try:
            old[sig] = signal.signal(sig, lambda s, f: pending.append(s))
        except (ValueError, OSError):
            pass
    _held.active = True
    try:
        yield
    finally:
        _held.active = False
        for sig, handler in old.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        for sig in dict.fromkeys(pending):
            os.kill(os.getpid(), sig)


_held = threading.local()


# --------------------------------------------------------------------------- isolation

def run_isolated(fn, path, what='the file'):
    """Run ``fn()`` in a forked child process and return its (JSON-able) result.

    For writers whose failure may take the process down: the pinned HDF5
    segfaults when a write into a full filesystem fails. The child's own
    messages are kept; a child that dies of a signal becomes a
    :class:`WriteError` naming ``path`` and the cause HDF5 printed (e.g. "No
    space left on device"), and the temporary files it left in ``path``'s
    folder (``.NAME.*.tmp``, ``NAME.tmp-*``) are removed. An exception in the
    child is raised again here with its type's meaning kept: bad input
    (a ValueError, :class:`~theanompi_ext.errors.BadInput` among them) as ValueError, OSError as WriteError.
    """
    import json
    import sys
    folder = os.path.dirname(os.path.abspath(path))
    base = os.path.basename(path)
    before = set(_own_temporaries(folder, base))
    res_r, res_w = os.pipe()
    err_r, err_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _run_child(fn, (res_r, res_w), (err_r, err_w))    # never returns
    os.close(res_w)
    os.close(err_w)
    result, errors = _read_both(res_r, err_r)
    _, wstatus = os.waitpid(pid, 0)
    if os.WIFEXITED(wstatus) and result:
        out = json.loads(result.decode('utf-8', 'replace'))
        if 'ok' in out:
            return out['ok']
        _remove_new_temporaries(folder, base, before)
        _raise_child_error(out, path, what)
    _remove_new_temporaries(folder, base, before)
    if os.WIFSIGNALED(wstatus):
        died = 'the writer crashed (%s)' % signal.Signals(os.WTERMSIG(wstatus)).name
    else:
        died = 'the writer exited with status %d' % os.WEXITSTATUS(wstatus)
    raise WriteError(None, '%s: could not write %s: %s; %s, nothing was written'
                     % (path, what, _cause(errors), died))


def _run_child(fn, res_pipe, err_pipe):
    """The forked child of :func:`run_isolated`: run ``fn``, send its result or
    its error as JSON on ``res_pipe``, stderr on ``err_pipe``, and exit."""
    import json
    import sys
    status = 0
    try:
        os.close(res_pipe[0])
        os.close(err_pipe[0])
        os.dup2(err_pipe[1], 2)
        sys.stderr = open(2, 'w', buffering=1, closefd=False)
        import faulthandler
        faulthandler.disable()      # a crash is reported by the parent, in one line
        try:
            out = {'ok': fn()}
        except BaseException as exc:  # noqa: B902 - reported to the parent
            bad = isinstance(exc, ValueError) and not isinstance(exc, OSError)
            out = {'error': str(exc), 'kind': 'bad' if bad else (
                'os' if isinstance(exc, OSError) else 'other'),
                'type': type(exc).__name__}
            status = 1
        data = json.dumps(out, default=str).encode()
        view = memoryview(data)
        while view:
            view = view[os.write(res_pipe[1], view):]
    finally:
        os._exit(status)


def _raise_child_error(out, path, what):
    """Raise again, in the parent, the error the child reported in ``out``."""
    if out['kind'] == 'bad':
        raise ValueError(out['error'])
    error = _one_line(out['error'])
    if out['kind'] == 'os':
        raise WriteError(None, error if path in error else
                         '%s: could not write %s: %s' % (path, what, error))
    raise WriteError(None, '%s: could not write %s: %s: %s'
                     % (path, what, out['type'], error))


def _read_both(a, b):
    import select
    bufs = {a: [], b: []}
    open_fds = [a, b]
    while open_fds:
        ready, _, _ = select.select(open_fds, [], [])
        for fd in ready:
            chunk = os.read(fd, 65536)
            if chunk:
                bufs[fd].append(chunk)
            else:
                open_fds.remove(fd)
                os.close(fd)
    return b''.join(bufs[a]), b''.join(bufs[b])


_ERRMSG = re.compile(rb"error message = '([^']+)'")


def _one_line(text):
    """An exception's text as one line: the system error inside an HDF5 report
    (which spans lines and names the temporary file), else the text itself."""
    found = _ERRMSG.findall(text.encode('utf-8', 'replace'))
    return found[-1].decode('utf-8', 'replace') if found else ' '.join(text.split())


def _cause(stderr_bytes):
    """The system error HDF5 reported (e.g. 'No space left on device'), or its last line."""
    found = _ERRMSG.findall(stderr_bytes)
    if found:
        return found[-1].decode('utf-8', 'replace')
    lines = [ln for ln in stderr_bytes.decode('utf-8', 'replace').splitlines() if ln.strip()]
    return lines[-1].strip() if lines else 'unknown cause'


def _own_temporaries(folder, base):
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return [n for n in names if (n.startswith('.%s.' % base) and n.endswith('.tmp'))
            or n.startswith('%s.tmp-' % base)]


def _remove_new_temporaries(folder, base, before):
    for name in _own_temporaries(folder, base):
        if name not in before:
            remove_quietly(os.path.join(folder, name))
