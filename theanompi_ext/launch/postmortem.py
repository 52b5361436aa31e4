"""Run mpiexec and, when the job ends badly, say which rank died and how.

MPICH's hydra and Open MPI both end the whole job within ~0.3 s when a rank
is killed (SIGKILL, the OOM killer, a segfault), each with a report of its
own (``launch/launcher_report.py``; hydra names only the PID and host).
:func:`run_explained` passes the job's standard output and error through,
shows each line to those reports and to the watches of a failed start
(:mod:`.reach`) and of a lost proxy (:mod:`.proxy_lost`), watches this
host's ranks end (:mod:`.exit_order`), and once mpiexec has ended turns
all of it, with the notes each rank leaves (:mod:`.rank_notes`), into the
launcher's last line and status (:mod:`.why_ended`). It also stops the job
on a stop signal, a time limit, a start that does not come, or a host that
can no longer be reached, each bounded.
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

from .. import output_faults, stop_signals
from . import mpi_leftovers, signal_marks, stop_bound
from ..errors import (EXIT_BAD_INPUT, EXIT_FAILED, EXIT_SIGNAL_BASE, EXIT_TIMED_OUT,
                      EXIT_TIMEOUT)
from .after_ranks import AfterRanks, after_ranks_s
from .awake import WAKE_S, join_awake, wait_awake
from .exit_noise import EndingFilter
from .held_output import HeldOutput, hold_bytes
from .lost_lines import SaidLines, lost_lines
from .job_control import JobControl
from .launcher_report import LauncherReport  # noqa: F401  (re-exported: the tests, tools)
from .mpiexec import child_env, is_openmpi, popen_job
from .rank_keeper import LAUNCHER_HOST_VAR
from .exit_order import ExitOrder
from .proxy_lost import ProxyWatch, first_to_end, keepers_word
from .proxy_lost import message as proxy_lost_message
from .rank_notes import RANKS_DIR_VAR, make_ranks_folder, read_rank_notes
from .reach import LaunchWatch, explain_launch, not_started, proxy_program, with_daemon_lost
from .start_watch import StartWatch, not_started_message
from .why_ended import explain, failed_notes

#: Seconds the ranks get to end after SIGTERM before they are SIGKILLed.
STOP_GRACE_S = 3.0
#: Seconds the copy of mpiexec's standard error gets to finish after a stop.
STOP_JOIN_S = 2.0
#: Seconds Open MPI's mpiexec gets to end after reporting a rank's MPI_Abort; it
#: waits forever for a host it cannot reach (a cut link), so it is then stopped.
AFTER_ABORT_S = 3.0
#: The grace of that stop: the ranks of this host have ended already.
AFTER_ABORT_GRACE_S = 1.0
#: Signals that stop a job; the launcher then exits with 128 + the signal's number.
STOP_SIGNALS = stop_signals.STOP_SIGNALS


class Stopped(Exception):
    """The launcher received a signal that stops the job."""

    def __init__(self, signum):
        super(Stopped, self).__init__(signal.Signals(signum).name)
        self.signum = signum


def _stopped(signum, frame):
    # first: a second signal must not raise inside the bound's thread start
    stop_signals.begin_stop()
    stop_bound.arm(signum)
    raise Stopped(signum)


def _interrupted(signum, frame):
    stop_signals.begin_stop()
    stop_bound.arm(signum)
    raise KeyboardInterrupt


def _join_unless_closed(thread, closed, given_up=None):
    """Wait for a stream ``thread`` (:func:`join_awake`); once ``closed`` (an Event
    its copy set: our own output's reader has gone) is set, stop the job as the
    SIGPIPE that Python ignores would have: :class:`Stopped`, bounded.

    ``given_up``: a callable, true once mpiexec was stopped because it could not
    reach its hosts and has exited; the wait then ends :data:`STOP_JOIN_S` later
    (a writer on such a host, an MPI daemon that holds the pipe while it waits
    for the launcher, ends by its own bound: measured, Open MPI's ``prted`` on
    emulated hosts kept the launcher 9 s more)."""
    deadline = None
    while not join_awake(thread, WAKE_S):
        if closed.is_set():
            _stopped(signal.SIGPIPE, None)
        if deadline is None and given_up is not None and given_up():
            deadline = time.monotonic() + STOP_JOIN_S
        if deadline is not None and time.monotonic() > deadline:
            return


def _catch_stop_signals():
    """SIGTERM and SIGHUP raise :class:`Stopped`, SIGINT KeyboardInterrupt, each
    bounding the launcher's life from then (:func:`.stop_bound.arm`); returns the
    previous handlers ({} off the main thread). A signal ignored when the launcher
    started stays ignored (``nohup``'s SIGHUP: :mod:`theanompi_ext.stop_signals`)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return stop_signals.catch({signal.SIGTERM: _stopped, signal.SIGHUP: _stopped,
                               signal.SIGINT: _interrupted})


def _parent_of(pid):
    try:
        with open('/proc/%d/stat' % pid) as f:
            return int(f.read().rsplit(')', 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _kill(pid, sig):
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _gone(pid):
    try:
        with open('/proc/%d/stat' % pid) as f:
            return f.read().rsplit(')', 1)[1].split()[0] in ('Z', 'X')
    except OSError:
        return True


def _signal_group(proc, sig):
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_until(deadline, done):
    while time.monotonic() < deadline and not done():
        time.sleep(0.02)


def stop_job(proc, notes_folder, grace=STOP_GRACE_S, openmpi=False):
    """End the job of mpiexec ``proc`` and every rank of this host, within ``grace`` s + 1.

    SIGTERM to mpiexec's process group (hydra forwards it to every rank) and
    to each local rank directly, with SIGCONT for stopped ones; whatever is
    alive after ``grace`` is SIGKILLed: mpiexec, the ranks, and hydra's
    proxies (each in a session of its own, so no process group reaches them).

    ``openmpi``: Open MPI's mpiexec answers SIGTERM with a sequence of its
    own, SIGCONT, SIGTERM 0.25 s later and SIGKILL 0.25 s after that
    (measured, Open MPI 5.0.11; not configurable), too short for a checkpoint
    write that holds SIGTERM (``files/signals.py``). So the ranks of this
    host get SIGTERM first, and mpiexec (for the ranks of other hosts) once
    they have ended or the grace is over.
    """
    host = socket.gethostname()
    ranks = [pid for pid, h, _ in read_rank_notes(notes_folder).values() if h == host]
    proxies = {p for p in (_parent_of(pid) for pid in ranks) if p and p != proc.pid
               and p != os.getpid() and p != 1}
    ranks_first = openmpi and bool(ranks)
    if not ranks_first:
        _signal_group(proc, signal.SIGTERM)
    for pid in ranks:
        _kill(pid, signal.SIGTERM)
        _kill(pid, signal.SIGCONT)
    deadline = time.monotonic() + grace
    if ranks_first:
        _wait_until(deadline, lambda: all(_gone(p) for p in ranks))
        _signal_group(proc, signal.SIGTERM)
        # mpiexec itself gets at least a second to end the other hosts' ranks
        deadline = max(deadline, time.monotonic() + 1.0)
    _wait_until(deadline, lambda: proc.poll() is not None and all(_gone(p) for p in ranks))
    if proc.poll() is None:
        _signal_group(proc, signal.SIGKILL)
    for pid in ranks + sorted(proxies):
        if not _gone(pid):
            _kill(pid, signal.SIGKILL)
    proc.wait()


class AfterAbort(threading.Thread):
    """Stops mpiexec ``proc`` (``stop()``) when it is still running ``wait_s``
    seconds after ``report`` (a :class:`~.launcher_report.LauncherReport`) saw a
    rank's ``MPI_Abort`` (Open MPI: prterun reports it, then waits for every
    host's daemon, for ever if one cannot be reached). ``fired``: it did."""

    def __init__(self, proc, report, stop, wait_s=AFTER_ABORT_S, interval=0.1):
        super(AfterAbort, self).__init__(name='after-abort', daemon=True)
        self.proc, self.report, self.stop_job = proc, report, stop
        self.wait_s, self.interval, self.fired = wait_s, interval, False

    def run(self):
        seen = None
        while self.proc.poll() is None:
            if seen is None and self.report.aborted is not None:
                seen = time.monotonic()
            if seen is not None and time.monotonic() - seen > self.wait_s:
                self.fired = True
                self.stop_job()
                return
            time.sleep(self.interval)

    def message(self, size, notes):
        """(the launcher's line, exit status) once it has fired: the aborting rank's
        status (its own message above says why)."""
        rank, host, code = self.report.aborted
        status = code if code else EXIT_FAILED
        pid = notes.get(rank, (0, host, ''))[0]
        return ('theanompi-ext: rank %d%s (pid %d on %s) aborted the job; mpiexec had not '
                'ended %.0f s later (a host it cannot reach?) and was stopped (exit status %d)'
                % (rank, ' of %d' % size if size else '', pid, host, self.wait_s, status)), status


def _drain(stream):
    # Keep mpiexec from blocking on a full pipe while it stops.
    threading.Thread(target=lambda: [None for _ in iter(lambda: stream.read(65536), b'')],
                     daemon=True).start()


def _passing(stream, dest, gate, reports, shown, name, closed=None, hold=None):
    """A started daemon thread that copies mpiexec's ``stream`` (:func:`_pass_through`),
    showing each line to each of ``reports``."""
    thread = threading.Thread(target=_pass_through, name='mpiexec-' + name, daemon=True,
                              args=(stream, dest, gate) + tuple(reports),
                              kwargs=dict(shown=shown, closed=closed, hold=hold))
    thread.start()
    return thread


def _pass_through(stream, dest, gate, *reports, shown=None, closed=None, hold=None):
    """Copy the job's ``stream`` to ``dest`` (sys.stdout or sys.stderr) line by
    line, showing each line to each of ``reports``, except what ``gate`` (an
    :class:`~.exit_noise.EndingFilter`) holds back once a report names a rank
    that died or aborted; returns at the end of the stream, once what was taken
    is written. ``shown`` (a list): the last line passed is kept in it.

    The stream is always read at once: an unread pipe would block mpiexec, and
    the ranks behind it, on their next line. So the lines reach ``dest``
    through a :class:`~.held_output.HeldOutput` (``hold`` bytes may wait for a
    reader that does not keep up; default :func:`~.held_output.hold_bytes`),
    which also meets a ``dest`` whose reader has gone (``closed`` is set) or that
    cannot be written (its lines dropped, one warning)."""
    held = HeldOutput(dest, hold_bytes() if hold is None else hold, closed)
    try:
        for line in iter(stream.readline, b''):
            # Open MPI's output forwarding may put a NUL before a line (measured,
            # 5.0.11: a rank's "\0[tmxh1][[...]] peer: tmxh0 Unable to connect ...",
            # then told as a closed socket: twice in 2 sessions), which would hide it
            # from every pattern: they read it without; what is shown is as it came
            seen = line.replace(b'\0', b'')
            for report in reports:
                report.feed(seen)
            if any(getattr(r, 'pid', None) is not None or getattr(r, 'aborted', None)
                   for r in reports):
                gate.begin()
            if not gate.let(seen):
                continue
            if shown is not None:
                shown[:] = [line]
            held.put(line)
    finally:
        held.end()
    # the thread's end means written: run_explained's last words come after
    held.join()


def _last_words(gate, message, err, heading=None, shown=()):
    """Write ``heading`` (the caller's line on the failure, if any), what ``gate``
    held back, in one line, then ``message``: the launcher's last, on ``err``;
    on a line of their own when the job's last line shown (``shown``) was left
    open (a rank's progress line, rewritten in place). hydra's trail of a job
    that ended otherwise (:meth:`~.exit_noise.EndingFilter.unheld`) comes first."""
    lines = [line.decode('utf-8', 'replace').rstrip('\n') for line in gate.unheld()]
    lines += [line for line in (heading, gate.summary(), message) if line]
    try:
        if lines and shown and not shown[-1].endswith(b'\n'):
            err.write('\n')
        for line in lines:
            err.write(line + '\n')
        err.flush()
    except BrokenPipeError:     # their reader has gone too (2>&1 | head)
        output_faults.to_devnull(err)


def timed_out_message(timeout_s):
    """The launcher's line for a job stopped after its time limit (``timeout``)."""
    return ('theanompi-ext: the job ran past its time limit of %g s: every rank was stopped '
            '(exit status %d)' % (timeout_s, EXIT_TIMED_OUT))


def run_explained(cmd, env=None, size=None, hostfile=None, started=None, start_timeout_s=0,
                  timeout=None, out=None, err=None, heading=None, forward=None):
    """Run the mpiexec command ``cmd`` like :func:`~.mpiexec.run_mpiexec`, then explain.

    SIGTSTP (Ctrl-Z) pauses every rank and SIGCONT resumes them, where mpiexec lets
    the launcher reach them all (:mod:`.job_control`). SIGINT, SIGTERM and SIGHUP
    stop every rank (:func:`stop_job`) and return
    128 + the signal's number (130, 143, 129), unless ignored when we started
    (:mod:`theanompi_ext.stop_signals`); so does a closed ``out`` or ``err`` (its
    reader gone: 141, as SIGPIPE). From such a stop on, this process ignores the
    stop signals until it ends (``stop_signals.begin_stop``: every caller ends on a
    stop's status). If this process is SIGKILLed,
    mpiexec gets SIGKILL from the kernel and the ranks follow
    (``launch/mpiexec.popen_job``, ``train/faults.stop_with_parent``).
    Returns the exit status (see :mod:`theanompi_ext.errors`).

    Both streams pass through, to ``out`` and ``err`` (default: this
    process's; a run's log for ``trials``): hydra writes its report on
    standard output, Open MPI on standard error (each read with a report of
    its own). hydra's teardown lines are held back (:mod:`.exit_noise`) and
    the launcher's own line, on ``err``, is the last: after ``heading(status)``
    (the caller's line, for a non-zero status, if given) and the summary of
    what was held. When mpiexec could not start on some host of ``hostfile``,
    the message names the host and the status is 2 (:mod:`.reach`). With
    ``started`` (a callable) and ``start_timeout_s``, a job for which
    ``started()`` is still false after that many seconds is stopped, status 4
    (:mod:`.start_watch`); with ``timeout``, a job still running after that
    many seconds is stopped, status 124. ``forward`` (a
    :class:`~.forwarded_signal.ForwardedSignal`) passes its signal on to the
    job once ``started()``.
    """
    out, err = out or sys.stdout, err or sys.stderr
    try:
        after_ranks_wait, hold = after_ranks_s(), hold_bytes()
        stop_bound.bound_s()        # a bad bound refused now, not in a stop's handler
    except ValueError as exc:
        err.write('theanompi-ext: %s\n' % exc)
        return EXIT_BAD_INPUT
    folder = make_ranks_folder()
    env = dict(env or child_env())
    env[RANKS_DIR_VAR] = folder
    env[LAUNCHER_HOST_VAR] = socket.gethostname()     # ranks elsewhere start keepers
    out_report, err_report, launch = LauncherReport(), LauncherReport(), LaunchWatch()
    proxies = ProxyWatch()
    said = SaidLines()         # the ranks' own lines seen (launch/lost_lines.py)
    openmpi = is_openmpi(cmd[0])
    # mpiexec's banner of a signal that every rank was sent from outside (to mpiexec
    # alone, or to each rank) is held (launch/exit_noise.py)
    gate = EndingFilter(lambda: signal_marks.every_rank_marked(folder, size or 0, openmpi))
    watch = ExitOrder(folder, size or 0)
    old_handlers = _catch_stop_signals()
    proc = start_watch = time_limit = err_thread = out_thread = job_control = None
    shown = []          # the last line passed through, of either stream

    def stop():
        gate.begin(banner=True)       # what hydra says from now is about our own stop
        stop_job(proc, folder, openmpi=openmpi)

    def last_words(status, message):
        _last_words(gate, message, err, heading(status) if heading and status else None,
                    shown)
        return status
    try:
        proc = popen_job(cmd, env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        stop_bound.watch_job(proc)
        if forward is not None:
            forward.attach(proc, started)
        # Ctrl-Z pauses every rank, fg resumes them (launch/job_control.py)
        job_control = JobControl(proc, openmpi, folder, size, err).install()
        start_watch = StartWatch(proc, started, start_timeout_s, stop).start()
        # the time limit is a start watch whose job never counts as started
        time_limit = StartWatch(proc, lambda: False, timeout, stop).start()
        after_abort = AfterAbort(proc, err_report, lambda: stop_job(
            proc, folder, grace=AFTER_ABORT_GRACE_S, openmpi=openmpi))
        if openmpi:
            after_abort.start()
        # every rank ended, and mpiexec does not hear it from their hosts (after_ranks.py)
        after_ranks = AfterRanks(proc, folder, size or 0, lambda: stop_job(
            proc, folder, grace=AFTER_ABORT_GRACE_S, openmpi=openmpi), after_ranks_wait)
        after_ranks.start()
        # Both streams are copied by threads: the main thread only waits in slices,
        # so that it runs a stop signal's handler whichever thread took the signal
        # (launch/awake.py)
        closed = threading.Event()      # set when our own output's reader has gone
        err_thread = _passing(proc.stderr, err, gate, (err_report, launch, proxies, said), shown,
                              'stderr', closed, hold)
        out_thread = _passing(proc.stdout, out, gate, (out_report, launch, proxies), shown,
                              'stdout', closed, hold)
        watch.start()

        def given_up():         # mpiexec stopped, its far hosts out of reach (above)
            return (after_ranks.fired or after_abort.fired) and proc.poll() is not None
        _join_unless_closed(out_thread, closed, given_up)
        status = wait_awake(proc)
        _join_unless_closed(err_thread, closed, given_up)
        watch.stop()
        start_watch.finish()
        time_limit.finish()
        if start_watch.fired:
            return last_words(EXIT_TIMEOUT, not_started_message(start_timeout_s, EXIT_TIMEOUT))
        if time_limit.fired:
            return last_words(EXIT_TIMED_OUT, timed_out_message(timeout))
        report = out_report if out_report.pid is not None else err_report
        notes = read_rank_notes(folder)
        lost = lost_lines(folder, failed_notes(notes), said)     # ranks' lines not seen
        if after_ranks.fired:
            message, status = after_ranks.message(notes, lost=lost)
            return last_words(status, message)
        if after_abort.fired:
            message, status = after_abort.message(size, notes)
            if report.peer_lost is None:
                return last_words(status, message)
            # the abort was Open MPI's own, of a rank that lost a peer: told below
        if proxies.closed and status > 0 and report.pid is None and \
                not failed_notes(notes) and (notes or not launch.failed):
            # hydra lost a proxy and says only that (launch/proxy_lost.py; MPICH 5.0.2
            # then exits 255): its trail is summed up, the host named. A proxy that
            # could not start is told below (reach.py)
            gate.begin()
            notes, times = keepers_word(folder)
            message, status = proxy_lost_message(
                notes, first_to_end(notes, times, watch.wall), size)
            return last_words(status, message)
        if proxies.closed and failed_notes(notes):
            # a rank's own abort ended its proxy (collective/abort_alone.end_alone) before
            # mpiexec heard of the abort: hydra's trail is that abort's, told below
            gate.begin()
        if status > 0 and not (launch.lost or launch.daemon_ended):
            # every rank sent SIGTERM or SIGINT from outside: SIGTERM counts only where
            # neither the launcher sent it nor an MPI daemon died (its ranks then get
            # SIGTERM: PR_SET_PDEATHSIG) nor a rank's own abort ended its proxy. hydra
            # reports a rank on another host by its code alone: N for signal N
            reported = None if report.pid is None else (
                report.signal or (report.code if report.exit_string is None else 0))
            sig = signal_marks.stop_from_outside(
                folder, size, notes, reported, openmpi,
                sigterm_from_within=after_abort.fired or proxies.closed)
            if sig is not None:
                gate.begin()        # mpiexec's trail is of that stop, not a rank's death
                message, status = signal_marks.message(size, sig)
                return last_words(status, message)
        message, status = explain(status, report, notes, size, first_exit=watch.first(),
                                  mpiexec_pid=proc.pid, lost=lost)
        if status and notes:
            message = with_daemon_lost(message, launch.daemon_ended)
        if status and not notes and report.pid is None:
            unreached = explain_launch(launch, hostfile,
                                       expected=None if openmpi else proxy_program(cmd[0]))
            if unreached:
                message, status = 'theanompi-ext: ' + not_started(unreached), EXIT_BAD_INPUT
        return last_words(status, message)
    except (KeyboardInterrupt, Stopped) as exc:
        signum = getattr(exc, 'signum', signal.SIGINT)
        gate.begin(banner=True)
        # a second signal while stopping must not cut the stop short, nor end the
        # launcher after it (its handlers are not put back: the process is ending)
        stop_signals.begin_stop()
        for w in (start_watch, time_limit):
            if w is not None:
                w.finish()
        if proc is not None:
            if out_thread is None:
                _drain(proc.stdout)
            stop_job(proc, folder, openmpi=openmpi)
        watch.stop()
        joined_by = time.monotonic() + STOP_JOIN_S    # their last lines before ours
        for thread in (out_thread, err_thread):
            if thread is not None:
                thread.join(max(0.0, joined_by - time.monotonic()))
        why = (output_faults.CLOSED_WHY if signum == signal.SIGPIPE else 'by ' +
               signal.Signals(signum).name)
        return last_words(EXIT_SIGNAL_BASE + signum,
                          'theanompi-ext: stopped %s: every rank of the job ended '
                          '(exit status %d)' % (why, EXIT_SIGNAL_BASE + signum))
    finally:
        if forward is not None:
            forward.detach()
        if job_control is not None:
            job_control.restore()
        stop_signals.restore(old_handlers)
        stop_bound.disarm()
        stop_bound.forget_job(proc)
        here = socket.gethostname()
        ranks_here = [pid for pid, host, _ in read_rank_notes(folder).values() if host == here]
        shutil.rmtree(folder, ignore_errors=True)
        mpi_leftovers.sweep_after_job(ranks_here)     # what killed ranks left on this host


def explained_command(cmd, size):
    """The command line that runs the mpiexec line ``cmd`` of ``size`` ranks
    under :func:`run_explained` in a process of its own (a Theano-MPI
    session's ``BSP.init``, which returns at once: ``BSP.wait`` waits for it)."""
    return [sys.executable, '-u', '-m', __name__, str(int(size))] + list(cmd)


def main(argv=None):
    """``python -m theanompi_ext.launch.postmortem SIZE MPIEXEC...``: its status."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2 or not argv[0].isdigit():
        sys.stderr.write('usage: python -m theanompi_ext.launch.postmortem SIZE MPIEXEC...\n')
        return EXIT_BAD_INPUT
    return run_explained(argv[1:], size=int(argv[0]))


if __name__ == '__main__':
    sys.exit(main())
