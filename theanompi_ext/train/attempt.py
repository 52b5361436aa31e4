"""What a rank knows of its attempt under the restart supervisor (``train/restarts.py``).

* :data:`ATTEMPT_VAR` / :data:`MAX_RESTARTS_VAR`: this attempt's number
  (0: the first start) and the restart budget, for the progress line
  ("restart 2 of 3") and the summary;
* :data:`PROGRESS_VAR`: a file where rank 0 keeps the last iteration it
  finished (8 bytes rewritten in place, no fsync: a few microseconds a
  step), so the supervisor knows the step a failure happened at and the
  iterations it lost; rank 0 creates it (empty) as soon as every rank has
  joined the communicator (:func:`mark_started`), which tells the
  supervisor that the attempt started (``launch/start_watch.py``);
* :data:`START_VAR`: for a job run without the supervisor, only that start
  mark (no per-step writes): its start is watched all the same;
* :data:`FAULTS_VAR`: the tests' fault injection, ``ATTEMPT:RANK:ITER:KIND``
  entries separated by ``;``: after iteration ITER of attempt ATTEMPT, rank
  RANK is SIGKILLed (``kill``), SIGSTOPped (``stop``), raises (``raise``),
  is SIGKILLed inside its next checkpoint write (``ckpt``; rank 0, the
  writer, half-way through writing the temporary file), or sleeps
  :data:`PAUSE_S` (``pause``: a moment in which a test cuts a link), or sends
  itself SIGUSR1 (``usr1``: a scheduler's warning that reaches one rank).
"""
import contextlib
import os
import signal
import tempfile

from ..files.atomic import remove_quietly

ATTEMPT_VAR = 'THEANOMPI_EXT_ATTEMPT'
MAX_RESTARTS_VAR = 'THEANOMPI_EXT_MAX_RESTARTS'
PROGRESS_VAR = 'THEANOMPI_EXT_PROGRESS_FILE'
#: A job run without the supervisor: the file rank 0 creates once every rank joined.
START_VAR = 'THEANOMPI_EXT_START_FILE'
#: That file's name in --out.
START_NAME = '.theanompi-ext.started'
FAULTS_VAR = 'THEANOMPI_EXT_FAULTS'
KINDS = ('kill', 'stop', 'raise', 'ckpt', 'pause', 'usr1')
PAUSE_S = 2.0


def number(environ=None):
    """``(attempt, max_restarts)`` of this rank's attempt; (0, 0) outside the supervisor."""
    env = os.environ if environ is None else environ
    try:
        return int(env.get(ATTEMPT_VAR, 0)), int(env.get(MAX_RESTARTS_VAR, 0))
    except ValueError:
        return 0, 0


def mark_started(rank, environ=None):
    """Rank 0 creates the start file (:func:`start_file`; the progress file is
    created empty: no iteration yet), once every rank has joined the communicator."""
    path = start_file(os.environ if environ is None else environ)
    if rank == 0 and path:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))


def start_file(environ):
    """The file whose existence says the job started: the supervisor's progress
    file, else the start watch's (:func:`start_watch_env`), else None."""
    return environ.get(PROGRESS_VAR) or environ.get(START_VAR)


@contextlib.contextmanager
def start_watch_env(out, across_hosts):
    """The ranks' variables that let the launcher watch the start of a job run
    without the restart supervisor (``launch/start_watch.py``): ``{START_VAR:
    path}``, the file removed afterwards; ``{}`` when it cannot be watched.

    In ``out`` (every host sees it: ``train/placement.py`` checks), else on one
    host in $TMPDIR; across hosts without ``out`` there is no folder known to
    be rank 0's as well as the launcher's."""
    if out:
        path = os.path.join(out, START_NAME)
    elif not across_hosts:
        fd, path = tempfile.mkstemp(prefix='.theanompi-ext-start-')
        os.close(fd)
    else:
        yield {}
        return
    remove_quietly(path)
    try:
        yield {START_VAR: path}
    finally:
        remove_quietly(path)


def started(path):
    """Whether the attempt whose progress file is ``path`` has started."""
    return bool(path) and os.path.exists(path)


def parse_faults(text):
    """``[(attempt, rank, iteration, kind)]`` of a :data:`FAULTS_VAR` value (ValueError)."""
    out = []
    for entry in filter(None, (e.strip() for e in (text or '').split(';'))):
        a, r, i, kind = entry.split(':')
        if kind not in KINDS:
            raise ValueError('%s: unknown fault %r (known: %s)' % (FAULTS_VAR, kind, KINDS))
        out.append((int(a), int(r), int(i), kind))
    return out


class AttemptHooks(object):
    """A rank's per-step duties under the supervisor; inert when it set nothing."""

    def __init__(self, rank, environ=None):
        env = os.environ if environ is None else environ
        self.rank = rank
        self.attempt, self.max_restarts = number(env)
        self._fd = None
        path = env.get(PROGRESS_VAR)
        if path and rank == 0:
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        self._faults = {(i, kind) for a, r, i, kind in parse_faults(env.get(FAULTS_VAR))
                        if a == self.attempt and r == rank}
        self.die_in_write = False

    def after_step(self, iteration):
        """Rank 0 marks ``iteration`` finished; then any fault due here fires."""
        if self._fd is not None:
            os.pwrite(self._fd, b'%-15d\n' % iteration, 0)
        for i, kind in self._faults:
            if i == iteration:
                self._fire(kind, iteration)

    def _fire(self, kind, iteration):
        import sys
        sys.stderr.write('FAULT %s rank %d at iteration %d attempt %d\n'
                         % (kind, self.rank, iteration, self.attempt))
        sys.stderr.flush()
        if kind == 'kill':
            os.kill(os.getpid(), signal.SIGKILL)
        elif kind == 'stop':
            os.kill(os.getpid(), signal.SIGSTOP)
        elif kind == 'raise':
            raise RuntimeError('injected fault at iteration %d' % iteration)
        elif kind == 'pause':
            import time
            time.sleep(PAUSE_S)
        elif kind == 'usr1':
            os.kill(os.getpid(), signal.SIGUSR1)
        else:
            self.die_in_write = True

    def in_write(self, path, data=None):
        """Called in a checkpoint's write phase (rank 0 with the sealed ``data``,
        before writing it): a due ``ckpt`` fault SIGKILLs this rank there, the
        writer half-way through its temporary file."""
        if not self.die_in_write:
            return
        if data is not None:
            from ..files.atomic import tmp_path
            with open(tmp_path(path), 'wb') as f:
                f.write(bytes(data[:len(data) // 2]))
                f.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def read_progress(path):
    """The last iteration rank 0 marked in ``path`` (None: none)."""
    try:
        with open(path, 'rb') as f:
            text = f.read(16).strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None
