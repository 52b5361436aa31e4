"""Bounded waits in collectives: a stall inspector and a timeout that names the missing ranks.

Why this exists (measured with MPICH 5.0.2's hydra, see ``docs/faults.md``):
when a rank is killed (SIGKILL, segfault, the OOM killer) hydra SIGKILLs the
other ranks and ends the job within about 0.1 s, so no rank is left waiting.
A rank that stays alive but stops making progress (stopped with SIGSTOP,
deadlocked, stuck in I/O, spinning in compiled code) is another story: the
other ranks busy-poll inside the collective forever, and so does a job whose
launcher does not clean up after a dead rank. This module bounds those waits.

How
    The main thread marks each wait of a training step (``with
    watchdog.waiting(label)``; :class:`WatchedCommunicator` does it for every
    collective) while the watchdog is *armed* - only inside the step loop, so
    Theano compilation, data loading, evaluation and checkpoint writes never
    count. A daemon thread wakes every ``poll_s``; when the main thread has
    waited ``stall_warn_s`` it asks every other rank where it is and logs one
    line naming the ranks that have not arrived; after ``timeout_s`` it
    prints the same report and ends the job with ``MPI_Abort``
    (exit status :data:`~theanompi_ext.errors.EXIT_TIMEOUT`). Waits are timed
    on a :class:`~theanompi_ext.running_clock.RunningClock`: the time this
    process was stopped (a batch scheduler's suspend of the whole job) is
    not waiting; a peer's stop still is.

Side channel
    The question and the answers travel as 128-byte messages (point-to-point,
    nonblocking sends, ``Iprobe``) on a duplicate of the communicator, between
    the watchdog threads of the ranks. A peer's watchdog answers with its own
    position: how many watched waits it has entered (every rank enters the
    same sequence), the step, the label, and how long it has been there. A
    peer that does not answer within ``reply_s`` is dead, stopped, or busy in
    compiled code that holds the GIL (Theano functions do); the report says
    so. Nothing is exchanged while no rank stalls: the thread only ``Iprobe``s.

Why not the alternatives: an ``Iallreduce`` + ``Test`` loop bounds only the
calls rewritten that way and cannot name anyone; a one-sided window needs the
target's progress engine for locks off-node, so a read from a stopped rank can
block the very thread that has to abort.
"""
import atexit
import collections
import os
import socket
import sys
import threading
import time

import numpy as np

from .. import stop_signals
from ..errors import EXIT_TIMEOUT
from ..output_faults import cannot_take_a_line
from ..running_clock import RunningClock
from .abort_alone import say_reason
from .base import Communicator
from .world import import_mpi

_MSG_BYTES = 136
_NUMS = 9                     # int64 header fields, then the label bytes
_LABEL_BYTES = _MSG_BYTES - 8 * _NUMS
_QUERY, _REPLY = 1, 2
_TAG = 0x7a11
# Pause between polls while an inquiry waits for answers.
_INQUIRY_POLL_S = 0.005
# Time for the launcher to forward the report before MPI_Abort kills the job.
_ABORT_GRACE_S = 0.2
#: The abort limit is at least this many times the median step time: a wait
#: that long in a run whose steps last minutes (ResNet-50 on CPUs) is not a hang.
STEP_SLACK = 4.0
_STEP_HISTORY = 50
#: The sentinel's slack: see ``Watchdog(stuck_s=)``.
STUCK_S = 5.0


#: Bits of an answer's ``unread``: this rank's standard output, error is full.
_OUT_FULL, _ERR_FULL = 1, 2


def unread_output(fds=((1, _OUT_FULL), (2, _ERR_FULL))):
    """The bits of this rank's standard streams that cannot take a line now: a pipe
    to its MPI daemon that nobody empties (mpiexec or the launcher held up, or
    the launcher's own output not read), in which a rank printing progress
    blocks between steps."""
    return sum(bit for fd, bit in fds if cannot_take_a_line(fd))


class PeerState(object):
    """Where a rank said it was: its answer to an inquiry."""

    def __init__(self, rank, seq, step, label, waiting, age_s, armed, unread=0):
        self.rank, self.seq, self.step, self.label = rank, seq, step, label
        self.waiting, self.age_s, self.armed = waiting, age_s, armed
        self.unread = unread

    def describe(self):
        """Human-readable position, e.g. ``at step 12, computing for 3.1 s (after 'bucket0')``."""
        where = 'step %d' % self.step if self.step >= 0 else 'start-up'
        if self.waiting:
            at = "at %s, waiting in '%s' for %.1f s" % (where, self.label, self.age_s)
        elif not self.armed:
            at = 'between steps (the last begun: %s) for %.1f s' % (where, self.age_s)
        else:
            at = 'at %s, computing for %.1f s%s' % (
                where, self.age_s, " (after '%s')" % self.label if self.label else '')
        return at + self._unread_text()

    def _unread_text(self):
        streams = [name for bit, name in ((_OUT_FULL, 'standard output'),
                                          (_ERR_FULL, 'standard error')) if self.unread & bit]
        if not streams:
            return ''
        return (', its %s full: not read (mpiexec, its MPI daemon or the launcher held up, '
                'or the launcher\'s own output not read), a line it prints blocks it'
                % ' and '.join(streams))


class Watchdog(object):
    """Watches this rank's waits in collectives (see the module docstring).

    Parameters
    ----------
    comm : Communicator
        Construction is collective when ``comm.size > 1`` (identities are
        gathered and the side channel is duplicated from ``comm.comm``).
    timeout_s : float
        Abort the job after a wait this long (0: never); stretched to
        :data:`STEP_SLACK` times the median duration of recent steps when
        that is longer.
    stall_warn_s : float
        Log a stall report after a wait this long, then again every
        ``stall_warn_s`` (0: never).
    poll_s : float
        How often the watchdog thread looks.
    reply_s : float
        How long an inquiry waits for the other ranks' answers.
    stream : file
        Where reports go (default ``sys.stderr``).
    abort : callable
        ``abort(status)`` ends the job (default ``comm.abort``).
    end : callable
        ``end(status)`` ends this rank without MPI, for the sentinel below
        (default :func:`~theanompi_ext.collective.abort_alone.end_alone`, after
        the rank's note).
    stuck_s : float
        The sentinel: a second thread, which never calls MPI, ends this rank
        when a wait has run past its limit + ``reply_s`` + ``stuck_s`` and the
        watchdog thread has not come round its loop for ``stuck_s``: it is held
        inside an MPI call of the side channel (measured, MPICH 5.0.2 over TCP:
        a peer killed while the launcher's host was cut off left the main
        thread in ``MPI_Allreduce`` holding MPICH's lock and the watchdog's
        ``Iprobe`` waiting for it, for good). ``MPI_Abort`` would wait for the
        same lock, hence ``end``.
    """

    def __init__(self, comm, timeout_s=30.0, stall_warn_s=10.0, poll_s=0.1, reply_s=2.0,
                 stream=None, abort=None, end=None, stuck_s=STUCK_S):
        self.rank, self.size = comm.rank, comm.size
        self.timeout_s = float(timeout_s or 0)
        self.stall_warn_s = float(stall_warn_s or 0)
        self.poll_s = float(poll_s)
        self.reply_s = float(reply_s)
        self.stream = stream
        self._abort = abort or comm.abort
        self._end = end or _end_without_mpi
        self.stuck_s = float(stuck_s)
        # the sentinel's clock, and on it the watchdog thread's last round
        self._sentinel_clock = RunningClock()
        self._beat = self._sentinel_clock.now()
        self._reported = False      # the watchdog has reported its timeout (then aborts)
        self.enabled = self.size > 1 and (self.timeout_s > 0 or self.stall_warn_s > 0)
        self.armed = False
        self.step = -1
        self.reports = []           # (kind, text) of every report made, for tests/summary
        self._seq = 0
        # Waits are timed on it: a stop of this whole process (a batch scheduler's
        # suspend of the job) is not a wait (running_clock.py)
        self.clock = RunningClock()
        self._state = (0, -1, 'start', self.clock.now(), False, False)
        self._qid = 0
        self._seen = {}             # rank -> (its latest answer, when it came)
        self._sends = []
        self._chan = None
        self._thread = None
        self._stop = threading.Event()
        self._t_arm = None
        self._phase = None          # (limit_s, option name, note) inside bounded()
        self._durations = collections.deque(maxlen=_STEP_HISTORY)
        self.identities = [(os.getpid(), socket.gethostname())]
        if not self.enabled:
            return
        self.identities = comm.allgather(self.identities[0])
        mpi_comm = getattr(comm, 'comm', None)
        if mpi_comm is not None and _thread_multiple():
            # Own context: inquiries never match the training's messages.
            self._chan = mpi_comm.Dup()
        self._thread = threading.Thread(target=self._run, name='watchdog', daemon=True)
        stop_signals.start_thread(self._thread)
        stop_signals.start_thread(threading.Thread(target=self._sentinel,
                                                   name='watchdog-sentinel', daemon=True))
        # Stop polling before mpi4py finalizes MPI at interpreter exit.
        atexit.register(self.close)

    # -- main thread ---------------------------------------------------------
    def arm(self, step):
        """Start watching waits; ``step`` is the iteration shown in reports."""
        self.step = int(step)
        self.armed = True
        self._t_arm = self.clock.now()
        self._state = (self._seq, self.step, '', self._t_arm, False, True)

    def disarm(self):
        """Stop watching (outside the step loop waits may legitimately be long)."""
        if self.armed and self._t_arm is not None:
            self._durations.append(self.clock.now() - self._t_arm)
        self.armed = False
        s = self._state
        self._state = (s[0], s[1], s[2], self.clock.now(), False, False)

    def enter(self, label):
        """The main thread starts waiting in ``label`` (no-op when disarmed)."""
        if self.armed and self._phase is None:
            self._seq += 1
            self._state = (self._seq, self.step, label, self.clock.now(), True, True)

    def leave(self):
        """The wait entered last has finished."""
        s = self._state
        if s[4] and self._phase is None:
            self._state = (s[0], s[1], s[2], self.clock.now(), False, self.armed)

    def bounded(self, step, label, limit_s, option='write_timeout_s', note=None):
        """Context manager: the whole block is one watched wait of at most ``limit_s``.

        For a phase outside the step loop that every rank enters, such as a
        checkpoint that rank 0 writes while the others wait for it: the
        collectives inside do not count separately (every rank enters the same
        sequence of waits). ``option`` names the limit in the report, ``note``
        (this rank's) replaces "every rank has arrived" when only this rank is
        late, e.g. "this rank has not finished writing PATH".
        """
        return _Bounded(self, step, label, limit_s, option, note)

    def limit(self):
        """The wait (s) that aborts now: ``timeout_s``, or more when steps are long."""
        d = list(self._durations)
        if not self.timeout_s or len(d) < 3:
            return self.timeout_s
        return max(self.timeout_s, STEP_SLACK * float(np.median(d)))

    def waiting(self, label):
        """Context manager around one wait."""
        return _Waiting(self, label)

    def close(self):
        """Stop the watchdog thread (idempotent)."""
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(5 * self.poll_s + 1.0)
        self._thread = None

    # -- watchdog thread -------------------------------------------------------
    def _run(self):
        warned_seq, next_warn = None, 0.0
        while not self._stop.wait(self.poll_s):
            self._beat = self._sentinel_clock.now()
            try:
                self.clock.tick(self.poll_s)
                self._serve()
                seq, step, label, since, waiting, _ = self._state
                if not waiting:
                    continue
                waited = self.clock.now() - since
                phase = self._phase
                limit = phase[0] if phase is not None else self.limit()
                if limit and waited >= limit:
                    if self._expire(seq, step, label, waited, limit):
                        return
                    continue
                if self.stall_warn_s and waited >= self.stall_warn_s:
                    if seq != warned_seq:
                        warned_seq, next_warn = seq, self.stall_warn_s
                    if waited >= next_warn:
                        next_warn += self.stall_warn_s
                        self._warn(seq, step, label, waited)
            except Exception as exc:  # never let the watchdog die silently
                self._write('theanompi-ext: rank %d: watchdog error: %s: %s'
                            % (self.rank, type(exc).__name__, exc))
                return

    def _sentinel(self, every_s=0.5):
        """End this rank when the watchdog thread is held in MPI past the limit (see
        ``stuck_s``). Times on a clock of its own, ticked here: a stop of the whole
        process is no wait, as for the watchdog."""
        clock, seen = self._sentinel_clock, (None, None)
        while not self._stop.wait(every_s) and not self._reported:
            clock.tick(every_s)
            seq, step, label, _, waiting, _ = self._state
            if not waiting:
                seen = (None, None)
                continue
            if seen[0] != seq:
                seen = (seq, clock.now())
            phase = self._phase
            limit = phase[0] if phase is not None else self.limit()
            waited, held = clock.now() - seen[1], clock.now() - self._beat
            if limit and waited >= limit + self.reply_s + self.stuck_s and held >= self.stuck_s:
                text = ("theanompi-ext: rank %d of %d (pid %d on %s): no progress for %.1f s in "
                        "'%s' at step %d; the MPI library itself is stuck (the watchdog's own "
                        "MPI call has not returned for %.1f s: a peer dead while its launcher "
                        "cannot tell, or a transport hung); ending this rank without MPI "
                        "(exit status %d)" % (self.rank, self.size, self.identities[self.rank][0],
                                              self.identities[self.rank][1], waited, label,
                                              step, held, EXIT_TIMEOUT))
                self.reports.append(('stuck', text))
                say_reason(text)
                self._write(text)
                self._end(EXIT_TIMEOUT)
                return

    def _warn(self, seq, step, label, waited):
        answers = self.inquire(self.reply_s)
        # One line per stall: the lowest rank among those waiting here speaks.
        if self._lower_rank_waits_here(seq, answers):
            return
        text = ("theanompi-ext: stall: rank %d of %d has waited %.1f s in '%s' at step %d "
                "(stall_warn_s=%g); %s" % (self.rank, self.size, waited, label, step,
                                            self.stall_warn_s,
                                            self._missing_text(seq, answers)))
        self.reports.append(('stall', text))
        self._write(text)

    def _expire(self, seq, step, label, waited, limit):
        """Report and abort; False if the wait ended meanwhile (nothing done)."""
        answers = self.inquire(self.reply_s)
        if self._lower_rank_waits_here(seq, answers):
            # A lower rank waits at the same point and reports/aborts first;
            # speak only if the job is still alive a while later.
            self._serve_for(self.reply_s + 1.0)
        if not self._still_waiting(seq):
            return False     # the last rank arrived just in time
        self.clock.tick()    # a stop of this process since the last look: not a wait
        waited = self.clock.now() - self._state[3]
        if waited < limit:
            return False
        why = 'collective_timeout_s=%g' % self.timeout_s
        phase = self._phase
        if phase is not None:
            why = '%s=%g' % (phase[1], phase[0])
        elif limit > self.timeout_s:
            why += ', stretched to %.1f s = %g x the median step' % (limit, STEP_SLACK)
        text = ("theanompi-ext: rank %d of %d (pid %d on %s): no progress for %.1f s in '%s' "
                "at step %d (%s); %s; aborting the job (exit status %d)"
                % (self.rank, self.size, self.identities[self.rank][0],
                   self.identities[self.rank][1], waited, label, step, why,
                   self._missing_text(seq, answers), EXIT_TIMEOUT))
        self.reports.append(('timeout', text))
        say_reason(text)
        self._write(text)
        self._reported = True       # the sentinel stands down: abort_alone bounds the abort
        self._serve_for(_ABORT_GRACE_S)
        self._abort(EXIT_TIMEOUT)
        return True

    def _still_waiting(self, seq):
        s = self._state
        return s[0] == seq and s[4]

    def _serve_for(self, seconds):
        """Keep answering the other ranks' questions for ``seconds``."""
        deadline = self.clock.now() + seconds
        while self.clock.now() < deadline:
            self._beat = self._sentinel_clock.now()
            self._serve()
            nap = min(self.poll_s, max(deadline - self.clock.now(), 0))
            time.sleep(nap)
            self.clock.tick(nap)

    def _lower_rank_waits_here(self, seq, answers):
        return any(a is not None and a.rank < self.rank and a.waiting and a.seq == seq
                   for a in answers.values())

    def _missing_text(self, seq, answers):
        if self._chan is None:
            return 'the other ranks cannot be asked (no MPI side channel with this backend)'
        late = self.not_arrived(seq, answers)
        phase = self._phase
        if not late and phase is not None and phase[2]:
            return phase[2]
        if not late:
            return 'every rank has arrived (the collective itself is stuck%s)' % (
                ', or too slow across a slow, lossy or congested link between hosts'
                if self._hosts() > 1 else '')
        parts = []
        for r in late:
            a = answers[r]
            where = a.describe() if a is not None else 'no answer within %.1f s (%s)' % (
                self.reply_s, self._why_silent(r, seq))
            parts.append('%s %s' % (self._who(r), where))
        return 'not arrived: ' + '; '.join(parts)

    def _who(self, r):
        """``rank R (pid P on HOST)``."""
        pid, host = self.identities[r]
        return 'rank %d (pid %d on %s)' % (r, pid, host)

    def _hosts(self):
        return len(set(host for _, host in self.identities))

    def _why_silent(self, r, seq):
        """Why rank ``r`` may not answer. A rank that answered from inside this wait
        (or past it) at an earlier inquiry, a stall line's, has arrived: its answer
        is queued behind the collective's own data on a slow or lossy link (the side
        channel shares it, and TCP's retransmissions), or it was stopped since (a
        writer, inside its write); on another host the link is named. It stays "not
        arrived" in the report, which names the ranks that hold the others up."""
        host = self.identities[r][1]
        far = host != self.identities[self.rank][1]
        seen = self._seen.get(r)
        if seen is not None and seen[0].seq >= seq:
            return 'it answered %.1f s ago, in this wait or past it: %s' % (
                self.clock.now() - seen[1],
                'the link to %s is slow, lossy, congested or cut, or it was stopped since' % host
                if far else 'stopped since, or busy in compiled code holding the GIL')
        return 'dead, stopped, or busy in compiled code holding the GIL%s' % (
            ', or the link to %s slow, lossy or cut' % host if far else '')

    @staticmethod
    def not_arrived(seq, answers):
        """Ranks that have not reached wait number ``seq`` (or did not answer)."""
        return sorted(r for r, a in answers.items() if a is None or a.seq < seq)

    def inquire(self, within):
        """Ask every other rank where it is.

        Returns ``{rank: PeerState or None}`` (None: no answer within ``within`` s).
        Called from the watchdog thread only (it owns the side channel).
        """
        peers = [r for r in range(self.size) if r != self.rank]
        if self._chan is None:
            return dict.fromkeys(peers)
        self._qid += 1
        query = self._pack(_QUERY, self._qid)
        for r in peers:
            self._send(query, r)
        answers = {}
        deadline = self.clock.now() + within
        while len(answers) < len(peers) and self.clock.now() < deadline:
            self._beat = self._sentinel_clock.now()
            self._serve(answers)
            time.sleep(_INQUIRY_POLL_S)
            self.clock.tick(_INQUIRY_POLL_S)
        now = self.clock.now()
        self._seen.update((r, (a, now)) for r, a in answers.items())
        return {r: answers.get(r) for r in peers}

    def _serve(self, answers=None):
        """Answer pending questions; collect answers to our current inquiry."""
        if self._chan is None:
            return
        MPI = import_mpi()
        status = MPI.Status()
        while self._chan.Iprobe(source=MPI.ANY_SOURCE, tag=_TAG, status=status):
            buf = np.empty(_MSG_BYTES, np.uint8)
            src = status.Get_source()
            self._chan.Recv(buf, source=src, tag=_TAG)
            nums = buf[:8 * _NUMS].view(np.int64)
            kind, qid = int(nums[0]), int(nums[2])
            if kind == _QUERY:
                self._send(self._pack(_REPLY, qid), src)
            elif kind == _REPLY and answers is not None and qid == self._qid:
                label = bytes(buf[8 * _NUMS:]).rstrip(b'\0').decode('utf-8', 'replace')
                answers[src] = PeerState(src, int(nums[3]), int(nums[4]), label,
                                         bool(nums[5]), nums[6] / 1000.0, bool(nums[7]),
                                         int(nums[8]))
        # Sends keep their buffer until complete; one to a dead rank may never be.
        self._sends = [(req, b) for req, b in self._sends if not req.Test()]

    def _send(self, buf, dest):
        try:
            self._sends.append((self._chan.Isend(buf, dest=dest, tag=_TAG), buf))
        except Exception:   # a dead peer may refuse; it will show as not answering
            pass

    def _pack(self, kind, qid):
        seq, step, label, since, waiting, armed = self._state
        buf = np.zeros(_MSG_BYTES, np.uint8)
        nums = buf[:8 * _NUMS].view(np.int64)
        nums[:] = (kind, self.rank, qid, seq, step, int(waiting),
                   int(1000 * (self.clock.now() - since)), int(armed),
                   unread_output() if kind == _REPLY else 0)
        raw = label.encode('utf-8')[:_LABEL_BYTES]
        buf[8 * _NUMS:8 * _NUMS + len(raw)] = np.frombuffer(raw, np.uint8)
        return buf

    def _write(self, text):
        stream = self.stream or sys.stderr
        stream.write(text + '\n')
        stream.flush()


class _Waiting(object):
    __slots__ = ('dog', 'label')

    def __init__(self, dog, label):
        self.dog, self.label = dog, label

    def __enter__(self):
        self.dog.enter(self.label)
        return self

    def __exit__(self, *exc):
        self.dog.leave()
        return False


class _Bounded(object):
    def __init__(self, dog, step, label, limit_s, option, note):
        self.dog, self.step, self.label = dog, int(step), label
        self.limit_s, self.option, self.note = float(limit_s or 0), option, note

    def __enter__(self):
        dog = self.dog
        if not dog.enabled:
            return self
        # A bounded phase replaces the step's arming (the step loop disarmed);
        # it does not count as a step duration.
        dog.step, dog.armed = self.step, True
        dog._seq += 1
        dog._phase = (self.limit_s, self.option, self.note)
        dog._state = (dog._seq, self.step, self.label, dog.clock.now(), True, True)
        return self

    def __exit__(self, *exc):
        dog = self.dog
        if dog._phase is not None:
            s = dog._state
            dog._state = (s[0], s[1], s[2], dog.clock.now(), False, False)
            dog._phase = None
            dog.armed = False
        return False


def _end_without_mpi(code):
    from .abort_alone import end_alone, run_before_abort
    run_before_abort(code)      # the rank's note, for the launcher's message
    end_alone(code)


def _thread_multiple():
    # The watchdog thread calls MPI while the main thread is inside MPI.
    MPI = import_mpi()
    return MPI.Query_thread() == MPI.THREAD_MULTIPLE


class WatchedHandle(object):
    """A started allreduce whose :meth:`wait` is one watched wait named ``label``.

    Wraps the backend's handle (never patches it): ``wait`` passes every
    argument through (``timeout``, NCCL's and pygpu's ``sync=``), everything
    else (``buf``, ``name``, ``done()``, the timeline's stamps) is the inner
    handle's.
    """

    def __init__(self, inner, watchdog, label):
        self.inner, self.watchdog, self.label = inner, watchdog, label

    def __getattr__(self, attr):
        if attr in ('inner', 'watchdog', 'label'):
            raise AttributeError(attr)
        return getattr(self.inner, attr)

    def wait(self, timeout=None, **kw):
        """The inner handle's ``wait(timeout, **kw)``, watched."""
        with self.watchdog.waiting(self.label):
            return self.inner.wait(timeout, **kw)

    def __repr__(self):
        return 'WatchedHandle(%r)' % (self.inner,)


class WatchedCommunicator(Communicator):
    """``comm`` with every collective watched by ``watchdog``.

    Delegates everything to ``comm``; collectives entered while the
    watchdog is armed are bounded and labelled (a started allreduce is
    labelled by its name, e.g. ``bucket3``, when it is waited on: its handle
    is a :class:`WatchedHandle`).
    """

    def __init__(self, comm, watchdog):
        self.inner = comm
        self.watchdog = watchdog
        self.name, self.rank, self.size = comm.name, comm.rank, comm.size

    def __getattr__(self, attr):
        # Backend specifics (``comm.comm``, ``progress``...) stay reachable.
        if attr in ('inner', 'watchdog'):
            raise AttributeError(attr)
        return getattr(self.inner, attr)

    def allreduce(self, buf, op='sum', label=None):
        """Watched :meth:`Communicator.allreduce`; ``label`` names it in reports."""
        with self.watchdog.waiting(label or '%sallreduce of %d floats'
                                   % ('' if op == 'sum' else op + ' ', buf.size)):
            return self.inner.allreduce(buf, op=op, label=label)

    @property
    def wire_dtypes(self):
        return self.inner.wire_dtypes

    def start_allreduce(self, buf, name=None, wire='float32'):
        """Start on ``comm``; the returned :class:`WatchedHandle`'s ``wait`` is watched."""
        # float32 keeps the plain call (backends written before the wire argument)
        handle = (self.inner.start_allreduce(buf, name) if wire == 'float32'
                  else self.inner.start_allreduce(buf, name, wire=wire))
        return WatchedHandle(handle, self.watchdog,
                             name or 'started allreduce of %d floats' % buf.size)

    def allgather(self, obj, label=None):
        with self.watchdog.waiting(label or 'allgather'):
            return self.inner.allgather(obj, label=label)

    def allgather_bounded(self, obj, timeout_s, label=None):
        with self.watchdog.waiting(label or 'allgather'):
            return self.inner.allgather_bounded(obj, timeout_s, label=label)

    def bcast(self, obj, root=0, label=None):
        with self.watchdog.waiting(label or 'bcast from %d' % root):
            return self.inner.bcast(obj, root, label=label)

    def barrier(self, timeout_s=None, label=None):
        with self.watchdog.waiting(label or 'barrier'):
            self.inner.barrier(timeout_s, label=label)

    def abort(self, code=1):
        self.inner.abort(code)

    def close(self):
        self.watchdog.close()
        self.inner.close()

    def describe(self):
        return self.inner.describe()

    # -- the step loop's hooks ---------------------------------------------
    def arm(self, step):
        """Bound the waits of training step ``step`` (see :meth:`Watchdog.arm`)."""
        self.watchdog.arm(step)

    def disarm(self):
        """Waits are unbounded again (evaluation, checkpoints, start-up)."""
        self.watchdog.disarm()

    def bounded(self, step, label, limit_s, option='write_timeout_s', note=None):
        """One watched wait around a whole phase (see :meth:`Watchdog.bounded`)."""
        return self.watchdog.bounded(step, label, limit_s, option, note)


def watch(comm, timeout_s=30.0, stall_warn_s=10.0, **kw):
    """``comm`` wrapped in a :class:`WatchedCommunicator` (collective when size > 1).

    A communicator that is already watched is returned unchanged.
    """
    if isinstance(comm, WatchedCommunicator):
        return comm
    return WatchedCommunicator(comm, Watchdog(comm, timeout_s, stall_warn_s, **kw))
