"""A rank's own line on why it ended the job, when that line never came through.

The launcher's last line names the rank that ended the job and points at the
rank's own line above (``rank 1 of 2 ... ended the job (exit status 4); its
own line above says why``). That line travels the job's output path: the
rank's pipe to its MPI daemon, the daemon's connection to mpiexec, mpiexec's
pipe to the launcher. Where any of them is held up when the rank aborts, the
line is lost: measured, the launcher SIGSTOPped for 30 s while the ranks
printed progress: hydra blocked on its full pipe to the launcher, the rank
blocked on its output, its peer's watchdog wrote its timeout line and
aborted, and its own bound (``collective/abort_alone.end_alone``) killed the
daemon with the line still inside; the launcher, continued, said "its own line
above says why" with no such line, after hydra's raw trail and status 255.

So a rank that aborts also leaves its line beside its note
(``rank_notes.write_rank_why``, through the shared notes folder, not the
output path), the launcher remembers the ranks' lines it did see
(:class:`SaidLines`), and :func:`lost_lines` gives those it did not, which
the launcher then says itself (``why_ended.explain``).
"""
from .rank_notes import read_rank_why

#: The start of every line in which a rank says why it failed.
_RANK_LINE = b'theanompi-ext: rank '
#: At most this many of those lines are remembered (a job of 256 ranks' stall lines).
_KEEP = 4096


class SaidLines(object):
    """Fed the job's output lines: remembers the ranks' own lines among them."""

    def __init__(self):
        self.lines = set()

    def feed(self, line):
        """Look at one line (bytes) of the job's output."""
        if line.startswith(_RANK_LINE) and len(self.lines) < _KEEP:
            self.lines.add(line.decode('utf-8', 'replace').strip())

    def seen(self, text):
        """True when ``text`` came through as a line of its own."""
        return text.strip() in self.lines


def lost_lines(folder, ranks, said):
    """``{rank: its line}`` for each of ``ranks`` that left a line on why it aborted
    (``rank_notes.read_rank_why``) which the launcher did not see (``said``, a
    :class:`SaidLines`)."""
    lost = {}
    for rank in ranks:
        line = read_rank_why(folder, rank)
        if line and not said.seen(line):
            lost[rank] = line
    return lost


def told(lines, how, whose='its'):
    """``WHOSE own line(s) did not come through (HOW), and said: LINE | LINE``: the
    launcher's words for ``lines`` (:func:`lost_lines`' values), without their
    ``theanompi-ext: `` prefix."""
    return ('%s own line%s did not come through (%s), and said: %s'
            % (whose, 's' if len(lines) > 1 else '', how,
               ' | '.join(line.replace('theanompi-ext: ', '', 1) for line in lines)))
