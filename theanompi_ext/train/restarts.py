"""Automatic restarts (``--max-restarts N``): a failed job starts again from its
newest good checkpoint, and the restarted run is the same run.

The supervisor runs in the launcher (``train``, ``trials``). After each
attempt it:

1. ends whatever the attempt left running (``launch/leftovers.py``: the
   launcher is the subreaper of its jobs, so every proxy and rank, on this
   host or an emulated one, is among its descendants) and removes the
   temporaries of a writer killed mid-write;
2. classifies the exit status and message (:func:`classify`): a rank killed
   or crashed, a collective timeout, a hung write, a rank that vanished, MPI
   communication lost are restarted; bad input (2), a diverged run, an
   exception on a rank (3), the launcher told to stop (129/130/143) are not;
3. stops when the budget is spent (the last failure's status and message
   are the job's), or when a failure is the same as the one before it (same
   status, cause, rank and iteration: a restart would meet it again);
4. finds the newest good checkpoint (read whole and its checksum verified;
   a corrupt ``checkpoint.h5`` is set aside as ``checkpoint.corrupt.h5`` and
   ``checkpoint.prev.h5`` takes its place; with neither good the job ends,
   status 2), records the restart in ``OUT/restarts.json``, waits
   ``restart_backoff_s`` and starts the job with ``resume``.

A rank learns its attempt from the environment (``train/attempt.py``).
"""
import collections
import json
import os
import re
import signal
import sys
import time

from .. import output_faults, stop_signals
from ..errors import (EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, EXIT_RESUMABLE, EXIT_SIGNAL_BASE,
                      EXIT_TIMEOUT)
from ..launch.reach import REACH_EACH_OTHER
from ..launch.start_watch import NOT_STARTED
from . import attempt as attempt_vars

LOG_NAME = 'restarts.json'
PROGRESS_NAME = '.theanompi-ext.progress'
CORRUPT_NAME = 'checkpoint.corrupt.h5'
# (and 141: the launcher stopped the job because its output's reader had gone)
STOP_STATUSES = tuple(EXIT_SIGNAL_BASE + s
                      for s in stop_signals.STOP_SIGNALS) + (output_faults.CLOSED_STATUS,)
#: Errors of status 3 that a restart meets again (the resume is exact).
_DETERMINISTIC = ('NonFiniteLoss', 'DivergedState', 'ReplicaMismatch', 'WireOverflow',
                  'WriteError')
_MPI_LOST = re.compile(r'MPI_ERR|Other MPI error|MPIDI_|Connection (reset|refused|closed)|'
                       r'(link|host|connection) (lost|down)|Communication error', re.I)

_DIED = re.compile(r'rank (\d+)(?: of \d+)? \(pid (\d+) on ([^)\s]+)\) died: ([^;]*)')
_KILLED_BY = re.compile(r'\(signal \d+\)')
_MPIEXEC_KILLED = re.compile(r'mpiexec \(pid \S+ on \S+\) was killed by (\S+)')
# every rank signalled from outside the launcher (launch/signal_marks.py)
_SENT_FROM_OUTSIDE = re.compile(r'every rank of the job \([^)]*\) was sent (\S+), and not by')
_LATE = re.compile(r'not arrived: rank (\d+) \(pid (\d+) on ([^)\s]+)\)')
_FAILED = re.compile(r'rank (\d+) of \d+ failed: (.*)')
_STEP = re.compile(r'at step (\d+)')


Verdict = collections.namedtuple('Verdict', 'restartable cause')

#: The causes of an attempt that never started (a host or link still down): each
#: costs its wait (start_timeout_s, or hydra's own), so the "same failure twice"
#: rule leaves them to the budget (a link may come back).
START_CAUSE = 'the job did not start in time (a host or link down, or the start-up hung)'
UNREACHED_CAUSE = 'a host could not be reached (it could at the first start)'
#: The back-off after the k-th start failure in a row: this times 2**(k-1), at
#: most :data:`START_BACKOFF_MAX_S` (never less than restart_backoff_s), so a
#: link that is down for a while is not met again at once.
START_BACKOFF_S = 2.0
START_BACKOFF_MAX_S = 60.0


def backoff_s(base, start_failures):
    """Seconds to wait before a restart: ``base`` (restart_backoff_s), or after
    ``start_failures`` (>= 1) attempts in a row that never started, a doubling
    wait from :data:`START_BACKOFF_S`."""
    if start_failures < 1:
        return base
    return max(base, min(START_BACKOFF_MAX_S, START_BACKOFF_S * 2 ** (start_failures - 1)))


def classify(status, message=''):
    """Whether a job that ended with ``status`` (and the launcher's and ranks'
    ``message`` lines) can be cured by a restart: a :class:`Verdict`.

    An exception on a rank (status 3 that is not MPI communication lost or a
    vanished rank) is not restarted: the resume is exact, so the same code
    raises it again at the same step.
    """
    message = message or ''
    if status == EXIT_OK:
        return Verdict(False, 'finished')
    if status == EXIT_RESUMABLE:
        return Verdict(False, 'stopped after a checkpoint, as a signal asked '
                              '(--checkpoint-signal)')
    if status in STOP_STATUSES:
        sig = signal.Signals(status - EXIT_SIGNAL_BASE)
        if sig == signal.SIGPIPE:
            return Verdict(False, 'the launcher was stopped by SIGPIPE (its output was closed)')
        # the launcher, or every rank from outside it (launch/signal_marks.py)
        return Verdict(False, 'the job was stopped by %s' % sig.name)
    died = _DIED.search(message)
    if died and status < 5 and _KILLED_BY.search(died.group(4)):
        # hydra's status of a rank killed by signal N is N: SIGQUIT's 3 and SIGILL's 4
        # would read as our own statuses
        return Verdict(True, 'a rank died (%s)' % died.group(4).strip())
    sent = _SENT_FROM_OUTSIDE.search(message)
    if sent and status < 5:
        # SIGQUIT: a kill (as of mpiexec or the launcher by it), with status 3
        return Verdict(True, 'every rank was killed by %s (mpiexec passed it on)'
                       % sent.group(1))
    mpiexec = _MPIEXEC_KILLED.search(message)
    if mpiexec:
        return Verdict(True, 'mpiexec was killed by %s' % mpiexec.group(1))
    if status == EXIT_BAD_INPUT:
        return Verdict(False, 'bad input')
    if status == EXIT_TIMEOUT:
        if NOT_STARTED in message:
            return Verdict(True, START_CAUSE)
        if 'write_timeout_s' in message:
            return Verdict(True, 'a checkpoint or output write hung (write_timeout_s)')
        return Verdict(True, 'a collective timed out (a rank stopped, hung or cut off)')
    if status == EXIT_FAILED:
        if 'ended without finishing training' in message:
            return Verdict(True, 'a rank vanished')
        if REACH_EACH_OTHER in message:
            # a firewall stays (the same failure twice ends the restarts); a link may heal
            return Verdict(True, 'the ranks of different hosts could not reach each other')
        if any(name in message for name in _DETERMINISTIC):
            return Verdict(False, 'the run diverged or cannot write (a restart meets it again)')
        if _MPI_LOST.search(message):
            return Verdict(True, 'MPI communication failed (a host or link lost)')
        return Verdict(False, 'an exception on a rank (a restart meets it again)')
    if 5 <= status < 65:
        try:
            name = signal.Signals(status).name
        except ValueError:
            name = 'signal %d' % status
        return Verdict(True, 'a rank was killed by %s' % name)
    if status == 124:
        return Verdict(False, 'timed out')
    if died:
        # e.g. a rank killed on another host: hydra ends with 255, its proxy saw "exit code 9"
        return Verdict(True, 'a rank died (%s)' % died.group(4).strip())
    return Verdict(True, 'mpiexec failed with status %d (a host or link lost)' % status)


def culprit(message):
    """``(rank, host)`` that the message blames (None, None when it names none)."""
    for pattern in (_DIED, _LATE):
        m = pattern.search(message or '')
        if m:
            return int(m.group(1)), m.group(3)
    m = _FAILED.search(message or '')
    if m:
        return int(m.group(1)), None
    if 'has not finished writing' in (message or ''):
        return 0, None        # the writer is rank 0
    return None, None


def last_message(text):
    """The line of an attempt's output that says why it ended (the last of the
    launcher's or a rank's own error lines)."""
    lines = [ln.strip() for ln in (text or '').splitlines()
             if ln.startswith('theanompi-ext: ') and 'warning' not in ln[:40]
             and 'stall:' not in ln[:40] and not ln.startswith('theanompi-ext: restart')]
    for pattern in ('died:', 'no progress for', 'failed:', 'ended without', NOT_STARTED,
                    'no rank was started'):
        hits = [ln for ln in lines if pattern in ln]
        if hits:
            return hits[-1]
    return lines[-1] if lines else ''


# -------------------------------------------------------------------- checkpoints

def file_versions(out):
    """Identities of the checkpoint files in ``out`` now: those of another run
    (``--overwrite``) that :func:`good_checkpoint` must not restart from."""
    from . import checkpoint
    found = {_version(os.path.join(out, name))
             for name in (checkpoint.FILENAME, checkpoint.PREV_FILENAME)}
    return found - {None}


def _version(path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns


def good_checkpoint(out, not_ours=()):
    """The iteration of the newest good checkpoint in ``out`` (None: there is none yet).

    A corrupt ``checkpoint.h5`` with a good ``checkpoint.prev.h5`` is set aside
    (``checkpoint.corrupt.h5``) and the previous one takes its place; with no
    good one, :class:`~theanompi_ext.errors.CheckpointError` (no restart).
    ``not_ours``: :func:`file_versions` of files written before this job.
    """
    from ..errors import CheckpointError
    from . import checkpoint
    path = os.path.join(out, checkpoint.FILENAME)
    prev = os.path.join(out, checkpoint.PREV_FILENAME)
    if not_ours and file_versions(out) <= set(not_ours):
        return None       # only another run's files (--overwrite): from the start
    if not os.path.exists(path) and not os.path.exists(prev):
        return None
    try:
        return checkpoint.describe(path)['iteration']
    except CheckpointError as exc:
        newest = exc
    try:
        if _version(prev) in set(not_ours):
            raise CheckpointError('%s: of the run this one replaced (--overwrite)' % prev)
        it = checkpoint.describe(prev)['iteration']
    except CheckpointError as exc:
        raise CheckpointError('no good checkpoint to restart from: %s; %s' % (newest, exc))
    if os.path.exists(path):
        os.replace(path, os.path.join(out, CORRUPT_NAME))
    os.link(prev, path)
    return it


# -------------------------------------------------------------------- the log

class RestartLog(object):
    """``OUT/restarts.json``: the budget, one entry per failure (``restarted``:
    whether a restart followed), how the job ended (``result``).

    Each entry: ``attempt``, ``time`` (UTC; ``unix_time``: the same, in
    seconds), ``status``, ``cause``,
    ``restartable``, ``rank`` and ``host`` blamed, ``message``,
    ``failed_at_iteration`` (iterations rank 0 had finished), and for a
    restart ``resumed_from_iteration``, ``iterations_lost``, ``backoff_s``
    and ``seconds_to_restart`` (failure seen to the next start).
    """

    def __init__(self, out, max_restarts):
        self.path = os.path.join(out, LOG_NAME)
        self.data = dict(max_restarts=max_restarts, failures=[], result=None)

    def failure(self, entry):
        """Record a failure (restarted or not); rewritten whole each time."""
        self.data['failures'].append(entry)
        self.write()

    def finish(self, status, why):
        """Record how the job ended."""
        self.data['result'] = dict(status=status, why=why, time=_now())
        self.write()

    def write(self):
        """Write the log atomically."""
        from ..files.atomic import write_json
        write_json(self.path, self.data, 'the restart log', indent=1)


def _now():
    return time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())


def summary_for(out):
    """The restart log's summary for ``summary.json`` (None: no log, no restart)."""
    try:
        with open(os.path.join(out, LOG_NAME)) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    rs = [f for f in data.get('failures', []) if f.get('restarted')]
    return dict(count=len(rs), max_restarts=data.get('max_restarts'),
                iterations_lost=sum(r.get('iterations_lost') or 0 for r in rs),
                causes=[r['cause'] for r in rs], log=LOG_NAME)


def format_summary(s):
    """The final log line's words about restarts ('' when none happened)."""
    if not s or not s['count']:
        return ''
    return '; %d restart%s of %d (%d iterations lost, %s)' % (
        s['count'], '' if s['count'] == 1 else 's', s['max_restarts'], s['iterations_lost'],
        s['log'])


# -------------------------------------------------------------------- the supervisor

class _Stopped(Exception):
    def __init__(self, signum):
        super(_Stopped, self).__init__(signum)
        self.signum = signum


def _raise_stopped(signum, frame):
    stop_signals.begin_stop()       # first: a second signal must not cut the stop short
    raise _Stopped(signum)


def supervise(cfg, run_attempt, err=None, sleep=time.sleep):
    """Run the job ``run_attempt(cfg, env)`` -> ``(status, output text)`` until it
    succeeds, fails for good, or ``cfg.max_restarts`` restarts are spent;
    returns the job's exit status. ``env``: variables for the ranks
    (``train/attempt.py``)."""
    import dataclasses
    from ..launch import leftovers, mpi_leftovers
    err = err or sys.stderr
    log = RestartLog(cfg.out, cfg.max_restarts)
    leftovers.become_subreaper()
    handlers = stop_signals.catch({signal.SIGTERM: _raise_stopped, signal.SIGHUP: _raise_stopped})
    progress = os.path.join(cfg.out, PROGRESS_NAME)
    not_ours = set() if cfg.resume else file_versions(cfg.out)
    previous = None
    attempt = start_failures = 0
    try:
        while True:
            env = {attempt_vars.ATTEMPT_VAR: str(attempt),
                   attempt_vars.MAX_RESTARTS_VAR: str(cfg.max_restarts),
                   attempt_vars.PROGRESS_VAR: progress}
            _remove(progress)
            status, text = run_attempt(cfg, env)
            t_failed, failed_unix = time.monotonic(), time.time()
            left = leftovers.end_leftovers()
            if left:     # the attempt's own end swept before these were killed
                mpi_leftovers.sweep_after_job([])
            _clean(cfg.out)
            if status == EXIT_OK:
                if attempt:
                    log.finish(status, 'finished after %d restart%s'
                               % (attempt, '' if attempt == 1 else 's'))
                return status
            if status == EXIT_RESUMABLE:      # asked for: not a failure to restart
                log.finish(status, classify(status).cause)
                return status
            message = last_message(text)
            verdict = classify(status, message)
            if attempt and status == EXIT_BAD_INPUT and 'no rank was started' in message:
                # reached at the first start: a host or link down now, not a bad hostfile
                verdict = Verdict(True, UNREACHED_CAUSE)
            rank, host = culprit(message)
            at = attempt_vars.read_progress(progress)
            step = _STEP.search(message)
            entry = dict(attempt=attempt, time=_now(), unix_time=failed_unix, status=status,
                         cause=verdict.cause,
                         restartable=verdict.restartable, rank=rank, host=host,
                         message=message, failed_at_iteration=at,
                         failed_at_step=int(step.group(1)) if step else None,
                         leftovers_killed=len(left), restarted=False)
            key = (status, verdict.cause, rank, at)
            why = _why_not(verdict, attempt, cfg.max_restarts, key, previous)
            resumed = None
            if why is None:
                try:
                    resumed = good_checkpoint(cfg.out, not_ours)
                except ValueError as exc:     # CheckpointError: no good checkpoint
                    why, status = str(exc), EXIT_BAD_INPUT
            if why is not None:
                log.failure(entry)
                log.finish(status, why)
                err.write('theanompi-ext: not restarted: %s; the job ends with exit status %d '
                          '(%s)\n' % (why, status, LOG_NAME))
                err.flush()
                return status
            previous = key
            attempt += 1
            start_failures = start_failures + 1 if verdict.cause in (
                START_CAUSE, UNREACHED_CAUSE) else 0
            wait = backoff_s(cfg.restart_backoff_s, start_failures)
            lost = (at - (resumed or 0)) if at is not None else None
            entry.update(restarted=True, resumed_from_iteration=resumed or 0,
                         iterations_lost=lost, backoff_s=wait)
            err.write('theanompi-ext: restart %d of %d in %.1f s: %s%s (exit status %d); '
                      'resuming from %s%s\n' % (
                          attempt, cfg.max_restarts, wait, verdict.cause,
                          ' (rank %d%s)' % (rank, ' on %s' % host if host else '')
                          if rank is not None else '', status,
                          'the checkpoint of iteration %d' % resumed if resumed is not None
                          else 'the start (no checkpoint yet)',
                          ', %d iteration%s lost' % (lost, '' if lost == 1 else 's')
                          if lost is not None else ''))
            err.flush()
            sleep(wait)
            entry['seconds_to_restart'] = round(time.monotonic() - t_failed, 3)
            log.failure(entry)
            if resumed is not None:
                cfg = dataclasses.replace(cfg, resume=True, overwrite=False)
    except (KeyboardInterrupt, _Stopped) as exc:
        stop_signals.begin_stop()
        signum = getattr(exc, 'signum', signal.SIGINT)
        leftovers.end_leftovers()
        status = EXIT_SIGNAL_BASE + signum
        log.finish(status, 'stopped by %s' % signal.Signals(signum).name)
        err.write('theanompi-ext: stopped by %s between attempts: nothing restarted (exit '
                  'status %d)\n' % (signal.Signals(signum).name, status))
        return status
    finally:
        stop_signals.restore(handlers)
        _remove(progress)


def _why_not(verdict, attempt, max_restarts, key, previous):
    """Why a failure is not restarted (None: restart it)."""
    if not verdict.restartable:
        return 'not a failure a restart can cure: %s' % verdict.cause
    if attempt >= max_restarts:
        return 'the restart budget is spent (%d of %d); the last failure: %s' % (
            attempt, max_restarts, verdict.cause)
    if key == previous and verdict.cause not in (START_CAUSE, UNREACHED_CAUSE):
        return ('the same failure twice at iteration %s (%s): a restart would meet it again'
                % ('?' if key[3] is None else key[3], verdict.cause))
    return None


def _clean(out):
    from ..files.stale import remove_stale_temporaries
    remove_stale_temporaries(out)


def _remove(path):
    try:
        os.unlink(path)
    except OSError:
        pass


class RecordedStderr(object):
    """``sys.stderr`` that also keeps what passes through it (text and the raw
    bytes ``launch/postmortem`` writes to ``.buffer``), for :func:`supervise`."""

    def __init__(self, real):
        self.real, self.parts = real, []
        raw = getattr(real, 'buffer', None)
        self.buffer = _RecordedBuffer(raw, self.parts) if raw is not None else None

    def write(self, text):
        self.parts.append(text)
        return self.real.write(text)

    def flush(self):
        self.real.flush()

    def text(self):
        """Everything written so far."""
        return ''.join(p.decode('utf-8', 'replace') if isinstance(p, bytes) else p
                       for p in self.parts)

    def __getattr__(self, name):
        return getattr(self.real, name)


class _RecordedBuffer(object):
    def __init__(self, raw, parts):
        self.raw, self.parts = raw, parts

    def write(self, data):
        self.parts.append(bytes(data))
        return self.raw.write(data)

    def flush(self):
        self.raw.flush()


def recorded_run(run):
    """``run()`` with ``sys.stderr`` recorded: ``(its result, the text written)``."""
    real = sys.stderr
    sys.stderr = rec = RecordedStderr(real)
    try:
        return run(), rec.text()
    finally:
        sys.stderr = real
