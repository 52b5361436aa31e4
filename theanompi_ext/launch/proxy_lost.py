"""An MPICH proxy lost during the run: which host, told.

MPICH's mpiexec keeps one connection to the proxy it started on each host
(``hydra_pmi_proxy``), and each rank is that proxy's child. When a proxy
ends during the run (killed, the OOM killer, its host lost) mpiexec says
only its own error trail, without the host (measured, MPICH 5.0.2, the
proxy SIGKILLed on one host and on the far one of 2 emulated hosts)::

    [mpiexec@H] control_cb (.../pmiserv_cb.c:280): assert (!closed) failed
    [mpiexec@H] HYDT_dmxu_poll_wait_for_event (...): callback returned error status
    ...
    [mpiexec@H] main (.../mpiexec.c:270): process manager error waiting for completion

and exits 255 within 0.1 s. The ranks of that proxy end on their parent's
death (``train/faults.stop_with_parent``), the other ranks are ended by
their own proxies as mpiexec exits; nothing is left. No rank noted an
error, so the launcher said only that the job ended with status 255.

The host is the one whose rank ended first, by the wall clock: the
launcher sees this host's ranks end (:class:`~.exit_order.ExitOrder`), and each
rank of another host has a keeper that notes its death (``died``,
:mod:`.rank_keeper`) within milliseconds; the other ranks end one round
trip later, when mpiexec's exit reaches their proxies (measured on the
emulated hosts: the far rank noted 17 ms after the kill, the near one 34 ms).
With neither (another host's notes not visible here), the hosts of the
ranks are listed. Open MPI names the host of a daemon it lost itself
(:func:`.reach.with_daemon_lost`).
"""
import re
import socket
import time

from ..errors import EXIT_FAILED, EXIT_OK, EXIT_RESUMABLE
from .rank_notes import (DIED, note_times, read_rank_notes, rank_list, unfinished,
                         unfinished_ranks)

#: hydra's first line when its connection to a proxy closed under it.
PROXY_CLOSED = re.compile(rb'^\s*\[mpiexec@[^\]]*\]\s*control_cb \([^()]*:\d+\): '
                          rb'assert \(!closed\) failed')
#: Seconds the launcher waits for a keeper's note after such an end (another
#: host's notes arrive through the shared filesystem; the failure's path only).
KEEPER_WAIT_S = 2.0


class ProxyWatch(object):
    """Fed mpiexec's output lines: ``closed`` once hydra said that its connection
    to a proxy closed (:data:`PROXY_CLOSED`)."""

    def __init__(self):
        self.closed = False

    def feed(self, line):
        """Look at one line (bytes) of mpiexec's output."""
        if not self.closed and PROXY_CLOSED.match(line):
            self.closed = True


def first_to_end(notes, times, local_exits):
    """The rank that ended first without finishing training, or None.

    ``notes``: ``{rank: (pid, host, state)}``; ``times``: when each note was
    last written (ns since the epoch, :func:`~.rank_notes.note_times`), which
    dates a keeper's ``died``; ``local_exits``: ``{rank: ns since the epoch}``
    of this host's ranks, as the launcher saw them end. A tie names no rank."""
    ends = {r: times[r] for r, (_, _, state) in notes.items() if state == DIED and r in times}
    for rank, when in local_exits.items():
        if unfinished(notes.get(rank, (0, '', ''))[2]):
            ends[rank] = min(when, ends.get(rank, when))
    if not ends:
        return None
    order = sorted(ends, key=lambda r: (ends[r], r))
    if len(order) > 1 and ends[order[0]] == ends[order[1]]:
        return None
    return order[0]


def keepers_word(folder, here=None, wait_s=KEEPER_WAIT_S, interval=0.05):
    """``(notes, times)`` of ``folder`` once a keeper has noted a death (``died``), or
    every unfinished rank is of this host ``here`` (none has a keeper), or after
    ``wait_s`` seconds: a keeper on another host notes its rank's death a moment
    after mpiexec has gone, and its note may take longer to be seen here."""
    here = here or socket.gethostname()
    deadline = time.monotonic() + wait_s
    while True:
        notes, times = read_rank_notes(folder), note_times(folder)
        if any(state == DIED for _, _, state in notes.values()) or \
                all(notes[r][1] == here for r in unfinished_ranks(notes)) or \
                time.monotonic() >= deadline:
            return notes, times
        time.sleep(interval)


def message(notes, first, size=None):
    """(the launcher's line, exit status) for a job that ended when mpiexec lost a
    proxy: 3, the proxy's host named, where a rank had not finished; ``first`` is
    :func:`first_to_end`'s rank (None: unknown), named where the job had several
    hosts (on one, every rank was the lost proxy's child). Where every rank had
    ended by itself (its note ``done``, or ``stopped`` after a checkpoint as
    asked), the proxy went after the work was done: 0, or 75."""
    of = ' of %d' % size if size else ''
    training = unfinished_ranks(notes)
    if notes and not training and len(notes) >= (size or 0):
        stopped = all(state.startswith('stopped') for _, _, state in notes.values())
        status = EXIT_RESUMABLE if stopped else EXIT_OK
        return ('theanompi-ext: mpiexec lost an MPI proxy (hydra_pmi_proxy) as the job ended, '
                'after every rank had %s (exit status %d)' % (
                    'stopped after the checkpoint, as asked: the job can be resumed'
                    if stopped else 'finished training: the run is complete', status)), status
    every_host = sorted({h for _, h, _ in notes.values()})
    if len(every_host) < 2:
        first = None
    hosts = sorted({notes[r][1] for r in training})
    host = notes[first][1] if first is not None else (hosts[0] if len(hosts) == 1 else None)
    where = ('the MPI proxy (hydra_pmi_proxy) of host %s' % host if host else
             'the MPI proxy (hydra_pmi_proxy) of one of the hosts %s' % ', '.join(hosts)
             if hosts else 'an MPI proxy (hydra_pmi_proxy)')
    if first is not None:
        pid, _, state = notes[first]
        ranks = ('rank %d%s (pid %d on %s) died: it ended without finishing training, the '
                 'first rank to end (%s); mpiexec stopped the other ranks' % (
                     first, of, pid, host, 'its keeper on %s noted it' % host if state == DIED
                     else 'the launcher saw it'))
    elif training:
        ranks = 'rank%s %s%s ended without finishing training%s' % (
            's' if len(training) > 1 else '', rank_list(training), of,
            ', with it' if len(every_host) < 2 else '')
    else:
        ranks = ('the ranks ended without finishing training, as far as the launcher can '
                 'tell (their notes were not seen here)')
    return ('theanompi-ext: mpiexec lost %s during the run: the proxy ended (killed, or the '
            'OOM killer), or its host or the launcher\'s connection to it was lost; %s '
            '(exit status %d)' % (where, ranks, EXIT_FAILED)), EXIT_FAILED
