"""What the launcher says of a job that ended, and with which status: :func:`explain`.

Given mpiexec's exit status, what it reported of a rank
(:class:`~.launcher_report.LauncherReport`: hydra's banner, Open MPI's text)
and the notes every rank leaves (:mod:`.rank_notes`), :func:`explain` names
the rank that died or ended the job, with its host, and gives the project's
own status (``theanompi_ext/errors.py``): hydra's and Open MPI's statuses
for the same event are made one, a rank that ended without finishing
training is not a success whatever mpiexec said, and mpiexec killed from
outside is said as such. ``launch/postmortem.run_explained`` runs the job
and calls it; the other ends it tells itself (a stop, a time limit, a lost
proxy, a host cut off) are told there.
"""
import signal
import socket

from ..errors import (EXIT_FAILED, EXIT_OK, EXIT_RESUMABLE, EXIT_SIGNAL_BASE, EXIT_TIMEOUT)
from .after_ranks import note_status
from .lost_lines import told
from .rank_notes import rank_list, unfinished, unfinished_ranks
from .reach import REACH_EACH_OTHER

#: hydra's exit status when one of its proxies (on another host) ended badly.
HYDRA_LAUNCHER_ERROR = 255


def _unfinished(who, of, why):
    return ('theanompi-ext: %s%s ended without finishing training %s; the run is '
            'incomplete (exit status %d)' % (who, of, why, EXIT_FAILED)), EXIT_FAILED


def _peer_lost(lost, notes, of):
    """The message and status of a rank on host ``lost[0]`` (None: on a host other
    than ``lost[1]``) whose connection closed under a rank on ``lost[1]`` (Open
    MPI: the latter aborted, and is all it names)."""
    host, seen_from = lost
    gone = sorted(r for r, (_, h, state) in notes.items() if unfinished(state) and (
        h == host if host else h != seen_from))
    if len(gone) == 1:
        who = 'rank %d%s (pid %d on %s)' % (gone[0], of, notes[gone[0]][0], notes[gone[0]][1])
    else:
        who = 'a rank on %s%s' % (host or 'another host',
                                  ' (one of ranks %s)' % rank_list(gone) if gone else '')
    words = 'peer process has unexpectedly disconnected' if host else \
        'An error occurred in Socket closed'
    return ('theanompi-ext: %s died: a rank on %s saw its connection closed (Open MPI: "%s"); '
            'mpiexec stopped the other ranks (exit status %d)'
            % (who, seen_from, words, EXIT_FAILED)), EXIT_FAILED


def _cannot_connect(unreachable, of):
    """The message of a rank that could not connect to another (Open MPI says whom)."""
    rank, host, peer_host, address, port, why = unreachable
    return ('theanompi-ext: rank %d%s on %s could not connect to a rank on %s (%s, port %d: '
            '%s): %s; mpiexec stopped the other ranks (exit status %d)'
            % (rank, of, host, peer_host, address, port, why, REACH_EACH_OTHER, EXIT_FAILED))


def _init_failed(init_failed, of):
    """The message of a rank whose MPI_Init failed (MPICH: only the cause)."""
    rank, cause = init_failed
    return ("theanompi-ext: rank %d%s could not start MPI (MPICH's MPI_Init: %s); with ranks "
            "on several hosts, %s (exit status %d)"
            % (rank, of, cause or 'see its error stack above', REACH_EACH_OTHER, EXIT_FAILED))


def _failed_itself(report, notes):
    """The rank MPI names as aborting noted its own error (``failed N``): its abort,
    not a lost connection, ended the job (its peers' sockets closed after it). A rank
    that lost a peer is aborted by MPI's error handler, its note still ``running``
    (``died``: :mod:`.rank_keeper`)."""
    return report.aborted is not None and notes.get(
        report.aborted[0], (0, '', ''))[2].startswith('failed')


def _not_finished(training, of):
    """``ranks 0, 1 of 2 had not finished training`` for the ranks ``training``."""
    return 'rank%s %s%s had not finished training' % (
        's' if len(training) > 1 else '', rank_list(training), of)


def failed_notes(notes):
    """The ranks whose notes say ``failed N``, in order."""
    return sorted(r for r, (_, _, state) in notes.items() if state.startswith('failed'))


def _lost_said(lost, ranks):
    """``; its own line did not come through ...: LINE`` for the lines of ``ranks``
    in ``lost`` (``launch/lost_lines.py``), else ''."""
    lines = [lost[r] for r in ranks if r in (lost or {})]
    if not lines:
        return ''
    return '; ' + told(lines, "the job's output was held up or cut on its way here",
                       'its' if len(ranks) == 1 else 'their')


def _ended_by_ranks(status, report, notes, of, failed=None, size=None, lost=None):
    """The launcher's line for a job that its own ranks ended (a rank's error or
    watchdog message above says why): ``failed`` when given, else the aborting
    rank (``report.aborted``), else the ranks whose notes say ``failed``, with
    their hosts; the job's status whatever mpiexec's words, so that the last
    line is always ours. ``lost``: ``{rank: its own line}`` of the ranks whose
    line did not come through, said here instead."""
    if failed is None:
        failed = [report.aborted[0]] if report.aborted is not None else failed_notes(notes)
    training = unfinished_ranks(notes)
    if not failed and training:
        # e.g. Open MPI's prterun given SIGHUP: it ends its ranks and exits 1, silent
        return ('theanompi-ext: the job ended with exit status %d; mpiexec gave no report '
                'and no rank noted an error (the lines above may say why): %s'
                % (status, _not_finished(training, of)))
    if not failed:
        return ('theanompi-ext: the job ended with exit status %d; the ranks\' lines above '
                'say why' % status)
    if len(failed) == 1:
        rank = failed[0]
        pid, host = notes.get(rank, (0, report.aborted and report.aborted[1], ''))[:2]
        who = 'rank %d%s (%son %s)' % (rank, of, 'pid %d ' % pid if pid else '',
                                       host or 'an unknown host')
        return ('theanompi-ext: %s ended the job (exit status %d)%s'
                % (who, status, _lost_said(lost, failed) or '; its own line above says why'))
    hosts = ', '.join(sorted({notes[r][1] for r in failed if r in notes}))
    if len(notes) == len(failed) == (size or len(failed)):
        # every rank failed at the same point (train/faults.say_failure): rank 0
        # reported it for all
        return ('theanompi-ext: all %d ranks (on %s) ended the job (exit status %d); rank '
                "0's report above says why" % (len(failed), hosts, status))
    return ('theanompi-ext: ranks %s%s (on %s) ended the job (exit status %d)%s'
            % (rank_list(failed), of, hosts, status,
               _lost_said(lost, failed) or '; their own lines above say why'))


def _mpiexec_killed(signum, mpiexec_pid, notes, of):
    """The message and status of a job whose mpiexec was killed by signal ``signum``
    from outside (its status from ``wait`` is ``-signum``; ours would have been
    told as a stop): no rank failed, the ranks end with their mpiexec. Status 3,
    which a restart may cure (``train/restarts.classify``)."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = 'signal %d' % signum
    training = unfinished_ranks(notes)
    ranks = '; ' + _not_finished(training, of) if training else ''
    return ('theanompi-ext: mpiexec (pid %s on %s) was killed by %s (signal %d), not by this '
            'launcher%s; its ranks ended with it%s (exit status %d)'
            % (mpiexec_pid or '?', socket.gethostname(), name, signum,
               ' (the OOM killer sends SIGKILL, as kill -9 does)' if signum == signal.SIGKILL
               else '', ranks, EXIT_FAILED)), EXIT_FAILED


def explain(status, report, notes, size=None, first_exit=None, mpiexec_pid=None, lost=None):
    """(message or None, exit status) for a finished job: None only for success.

    ``report`` is a :class:`~.launcher_report.LauncherReport`, ``notes`` the
    ranks' notes (``{rank: (pid, host, state)}``), ``size`` the number of
    ranks started, ``first_exit`` the rank seen to exit first
    (:class:`~.exit_order.ExitOrder`), which wins over the launcher's PID when it is a
    rank that was still running. A negative ``status`` is mpiexec (pid
    ``mpiexec_pid``) killed by that signal. ``lost``: ``{rank: its own line}``
    of the ranks that ended the job whose line did not come through
    (``launch/lost_lines.py``).
    """
    of = ' of %d' % size if size else ''
    if status == 0:
        vanished = unfinished_ranks(notes)
        if not vanished:
            return None, EXIT_OK
        who = ', '.join('rank %d (pid %d on %s)' % (r, notes[r][0], notes[r][1])
                        for r in vanished)
        return _unfinished(who, of, 'although mpiexec reported success')
    if status == EXIT_RESUMABLE and notes and all(
            state.startswith('stopped') for _, _, state in notes.values()):
        # asked for (train --on-checkpoint-signal stop): rank 0's line above says where
        return ('theanompi-ext: all %d ranks stopped after the checkpoint, as asked: the job '
                'can be resumed (exit status %d)' % (len(notes), status)), status
    if report.pid is None and report.unreachable_peer:
        # Open MPI then also reports the rank's closed socket: not a death
        return _cannot_connect(report.unreachable_peer, of), EXIT_FAILED
    if report.pid is None and report.init_failed and not failed_notes(notes):
        return _init_failed(report.init_failed, of), EXIT_FAILED
    if report.pid is None and report.peer_lost and status != EXIT_TIMEOUT and \
            not _failed_itself(report, notes):
        failed = failed_notes(notes)
        if not failed:
            return _peer_lost(report.peer_lost, notes, of)
        # a rank noted its own error (its watchdog's timeout, an exception) and
        # aborted; a peer saw its socket close first and Open MPI's handler aborted
        # that peer, whom prterun names (measured: 1 run in 3 of a crawling link).
        # The closed connection is the noted error's effect: that error is the story
        status = note_status(notes[failed[0]][2]) or status
        return _ended_by_ranks(status, report, notes, of, failed, size, lost), status
    if status < 0:
        # mpiexec died of signal -status (ours were told above: a stop, a timeout, Open
        # MPI's abort of a rank that lost a peer). A rank's error noted before is
        # still the story, or a rank's death that mpiexec reported
        failed = failed_notes(notes)
        if report.pid is None and not failed:
            return _mpiexec_killed(-status, mpiexec_pid, notes, of)
        status = (note_status(notes[failed[0]][2]) if failed else None) or EXIT_FAILED
    if report.pid is None:
        failed = failed_notes(notes)
        if status == HYDRA_LAUNCHER_ERROR and failed:
            # hydra's status when a proxy closed under it: the aborting rank's own
            # bound ended its proxy (collective/abort_alone.end_alone) before mpiexec
            # heard the abort (mpiexec held up meanwhile); the rank's status stands
            status = note_status(notes[failed[0]][2]) or status
        return _ended_by_ranks(status, report, notes, of, size=size, lost=lost), status
    pid, host = report.pid, report.host
    rank = next((r for r, (p, _, _) in notes.items() if p == pid), report.rank)
    if not pid and rank in notes:          # Open MPI 4.x may say "PID 0"
        pid, host = notes[rank][0], notes[rank][1]
    if report.unfinished:
        # Open MPI: a rank ended without MPI_Finalize; one that had not finished
        # training is the silent case above, told the same way
        if rank is None:
            return _ended_by_ranks(status, report, notes, of, size=size, lost=lost), status
        if not unfinished(notes.get(rank, (0, '', 'running'))[2]):
            return ('theanompi-ext: rank %d%s (pid %d on %s) exited without finalizing MPI '
                    'after it had finished training; mpiexec ended the job (exit status %d)'
                    % (rank, of, pid, host, status)), status
        return _unfinished('rank %d (pid %d on %s)' % (rank, pid, host), of,
                           '(it exited without finalizing MPI; mpiexec status %d)' % status)
    if first_exit is not None and first_exit != rank and \
            unfinished(notes.get(first_exit, (0, '', ''))[2]):
        rank = first_exit
        pid, host = notes[rank][0], notes[rank][1]
    if report.signal and status == EXIT_SIGNAL_BASE + report.signal:
        # Open MPI exits 128 + N for a rank killed by signal N, hydra N: N under
        # both, so that 128 + N keeps meaning "the launcher was stopped"
        status = report.signal
    far = report.exit_string is None and report.code and status == HYDRA_LAUNCHER_ERROR
    if far:
        # hydra, a rank on another host: its proxy reports a rank killed by signal N
        # as exit code N, no exit string, and mpiexec exits 255 (measured, 2 hosts):
        # the rank's code, as for a rank of this host
        status = report.code
    who = ('rank %d%s (pid %d on %s)' % (rank, of, pid, host) if rank is not None
           else 'a rank (pid %d on %s; its rank is unknown: it died before reporting)'
           % (pid, host))
    how = report.exit_string or ('exit code %s' % report.code)
    if far:
        how += " (or killed by signal %s: hydra's report of a rank on another host)" % report.code
    return ('theanompi-ext: %s died: %s; mpiexec stopped the other ranks (exit status %d)'
            % (who, how, status)), status
