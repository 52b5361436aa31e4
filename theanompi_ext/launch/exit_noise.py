"""mpiexec's own lines while a job ends: held back, and told in one line.

When the launcher stops a job (SIGTERM, Ctrl-C) or a rank has died, hydra
goes on writing its internal trail as it tears the job down, e.g.::

    [mpiexec@hub] HYDT_bscu_wait_for_completion (lib/tools/bootstrap/utils/bscu_wait.c:109):
        one of the processes terminated badly; aborting
    [mpiexec@hub] HYDT_bsci_wait_for_completion (lib/tools/bootstrap/src/bsci_wait.c:21):
        launcher returned error waiting for completion

and, on the way out after a signal, its ``BAD TERMINATION`` banner with the
signal the launcher itself sent. Open MPI's prterun, after its report of a
rank's ``MPI_Abort``, may add (measured, 5.0.11, 2 emulated hosts)::

    [vm:13009] PMIX ERROR: PMIX_ERR_NOT_FOUND in file .../pmix_server.c at line 1747

and, given a second stop signal (the launcher's stop after a scheduler's, which
signals every process of the job: measured, 5.0.11), ``Abort is in
progress...hit ctrl-c again to forcibly terminate`` and a blank line: advice
for a terminal that the launcher's own stop has already followed.

None of it says more than the launcher's own last line
(``launch/postmortem.py``), which it would otherwise follow or bury.
:class:`EndingFilter` passes every line through until the end begins, then
holds mpiexec's bracketed lines (and, after a stop signal, its
banner, which then only reports the launcher's own signal), so that
:meth:`EndingFilter.summary` can say how many there were and the last one's
words. Lines of the ranks themselves pass, except Open MPI's own
``[HOST:PID]`` lines, which its library may also write inside a rank.

hydra's error trail (``[mpiexec@H]``/``[proxy:N@H] FUNCTION (FILE:LINE): ...``)
is held even before the end begins, as is prterun's abort line (the
scheduler's signal may reach prterun before the launcher's stop begins): a
rank dead on another host makes the proxy of this host write it, on standard
error, before (or after) mpiexec's banner on standard output names the rank
(measured, 2 emulated hosts). Held
lines of a job that did not end that way (no report of a rank, no stop) are
shown as they were, before the launcher's line (:meth:`EndingFilter.unheld`).

hydra's banner after a stop signal sent to mpiexec alone (``kill`` of its
PID: hydra passes it on to every rank) reports the first rank it saw die of
it, ``This typically refers to a problem with your application``: when its
first line comes, every rank has already marked the signal
(``launch/signal_marks.py``, written as the signal arrives), so the banner is
held as after the launcher's own stop (``stopped_outside``). So are Open MPI's
framed messages (a line of dashes above and below) that begin once every rank
was sent SIGINT or SIGQUIT from outside, to each rank (prterun passes neither
on): a rank's ``MPI_ABORT was invoked on rank 0 ...`` after it took SIGINT, and
prterun's ``prterun has exited due to process rank 0 ... calling "abort"`` or
``prterun noticed that process rank 0 ... exited on signal 3 (Quit)``, each
blaming the first rank to end of it; and all of them after the launcher's own
stop. MPICH's ``Abort(130) on node 1 (rank 1 in comm 0): application called
MPI_Abort(...)`` of a rank that took such a SIGINT is held likewise.
"""
import os
import re
import threading

#: mpiexec's own lines: hydra's ``[mpiexec@HOST] ...`` and ``[proxy:N@HOST] ...``,
#: Open MPI's ``[HOST:PID] ...``.
HYDRA_LINE = re.compile(rb'^\s*\[(?:(?:mpiexec|proxy:[^\]@]*)@[^\]]*|[^\]\s:@]+:\d+)\]\s*(.*)')
#: hydra's error trail: ``[mpiexec@H] FUNCTION (FILE:LINE): words``, ``[proxy:N@H] ...``.
HYDRA_TRAIL = re.compile(rb'^\s*\[(?:mpiexec|proxy:[^\]@]*)@[^\]]*\]\s*\S+ \([^()]*:\d+\):')
#: prterun's line on a second SIGTERM or SIGINT (followed by a blank line).
OPENMPI_ABORTING = re.compile(rb'^Abort is in progress\.\.\.hit ctrl-c again to forcibly '
                              rb'terminate\s*$')
#: hydra's banner of a process that ended badly, and the lines around it.
BANNER_LINE = re.compile(rb'^(?:=+\s*$|=   |YOUR APPLICATION TERMINATED|This typically refers|'
                         rb'Please see the FAQ page)')
#: The first line of hydra's banner.
BANNER_START = re.compile(rb'^=+\s*$')
#: MPICH's line of a rank's MPI_Abort (its library's, on the rank's standard error).
MPICH_ABORT = re.compile(rb'^Abort\(-?\d+\) on node \d+ \(rank \d+ in comm \d+\): '
                         rb'application called MPI_Abort')
#: The frame of Open MPI's messages (a rank's MPI_ABORT, prterun's report of a
#: death): a line of 74 dashes above and below each (its help text's width).
OPENMPI_RULE = re.compile(rb'^-{74}\s*$')
#: hydra's ``FUNCTION (FILE:LINE): `` before its words.
WHERE = re.compile(r'^\S+ \([^()]*:\d+\):\s*')
#: Set (to anything but empty or 0): nothing is held back (to debug MPI itself).
SHOW_VAR = 'THEANOMPI_EXT_SHOW_MPIEXEC_TEARDOWN'
#: The most of one held line quoted in the summary.
QUOTE_CHARS = 160


class EndingFilter(object):
    """Decides, line by line, what of mpiexec's output is shown (thread-safe)."""

    def __init__(self, stopped_outside=None):
        # stopped_outside(): a stop signal reached every rank from outside the
        # launcher; asked when a banner may begin (a line of '=' only)
        self._stopped_outside = stopped_outside
        self._ending = threading.Event()
        self._banner = False
        self._show = os.environ.get(SHOW_VAR, '') not in ('', '0')
        self._lock = threading.Lock()
        self.held = []
        self._early = []        # hydra's trail before the end began
        self._blank_after = False   # prterun's abort line was held: its blank line too
        self._framed = {}       # reader thread -> inside one of Open MPI's framed messages

    def begin(self, banner=False):
        """The job is ending: hold hydra's lines from now; with ``banner`` (a stop
        signal) its banner too (after a rank's death the banner is the report)."""
        with self._lock:
            self._begin(banner)

    def _begin(self, banner):
        self._banner = self._banner or banner
        self._ending.set()
        self.held[:0], self._early = self._early, []

    def let(self, line):
        """True to show ``line`` (bytes); False when it is held back."""
        if self._show:
            return True
        with self._lock:
            if self._blank_after:
                self._blank_after = False
                if not line.strip():
                    return False
            if OPENMPI_RULE.match(line):
                return self._let_rule(line)
            if self._banner and self._framed.get(threading.get_ident()):
                self.held.append(line)
                return False
            if not self._banner and BANNER_START.match(line) and self._outside():
                self._begin(True)       # the banner of a stop, not of a rank's death
            if MPICH_ABORT.match(line) and (self._banner or self._outside()):
                self._begin(True)       # a rank's abort of a SIGINT that every rank had
                self.held.append(line)
                return False
            if OPENMPI_ABORTING.match(line):
                self._blank_after = True
                (self.held if self._ending.is_set() else self._early).append(line)
                return False
            if not self._ending.is_set():
                if HYDRA_TRAIL.match(line):
                    self._early.append(line)
                    return False
                return True
            if not (HYDRA_LINE.match(line) or (self._banner and BANNER_LINE.match(line))):
                return True
            self.held.append(line)
        return False

    def _outside(self):
        return self._stopped_outside is not None and self._stopped_outside()

    def _let_rule(self, line):
        # an Open MPI message begins or ends (each reader thread, one stream, has its
        # own: the streams' lines interleave); one that begins after every rank was
        # signalled from outside reports that, as hydra's banner does
        key = threading.get_ident()
        opening = not self._framed.get(key, False)
        self._framed[key] = opening
        if opening and not self._banner and self._outside():
            self._begin(True)
        if not self._banner:
            return True
        self._blank_after = not opening     # prterun writes a blank line after its own
        self.held.append(line)
        return False

    def unheld(self):
        """hydra's trail lines held while the end never began (none once it has):
        the lines to show after all, in their order (each bytes)."""
        with self._lock:
            early, self._early = self._early, []
        return early

    def summary(self):
        """One line on what was held, or None when nothing was."""
        with self._lock:
            held = list(self.held)
        words = [HYDRA_LINE.match(l).group(1) if HYDRA_LINE.match(l) else l for l in held
                 if HYDRA_LINE.match(l) or OPENMPI_ABORTING.match(l) or MPICH_ABORT.match(l)]
        words = [WHERE.sub('', w.decode('utf-8', 'replace').strip()) for w in words]
        words = [w for w in words if w]
        if not held:
            return None
        last = words[-1] if words else 'its report of the ranks it ended'
        if len(last) > QUOTE_CHARS:
            last = last[:QUOTE_CHARS - 3] + '...'
        return ("theanompi-ext: %d line%s of mpiexec's own while the job ended not shown "
                "(the last: %s; %s=1 shows them)" % (len(held), '' if len(held) == 1 else 's',
                                                     last, SHOW_VAR))
