"""Writers run in a forked child (:func:`run_isolated`), so that a crash is an error.

The pinned HDF5 segfaults when a write into a full filesystem fails; in a
child, that crash becomes a :class:`~theanompi_ext.errors.WriteError`
naming the file and the cause, and the child's temporaries are removed.
"""
import os
import re
import signal

from ..errors import WriteError
from .stale import own_temporaries, remove_new_temporaries


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
    before = set(own_temporaries(folder, base))
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
        remove_new_temporaries(folder, base, before)
        _raise_child_error(out, path, what)
    remove_new_temporaries(folder, base, before)
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
