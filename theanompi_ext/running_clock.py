"""A clock of the time this process was running: a stop (SIGSTOP, then SIGCONT) left out.

Why: a batch scheduler suspends a whole job by stopping every process of it
(SLURM's ``scontrol suspend`` and gang scheduling, LSF's ``bstop``, SGE's
``qmod -sj``), and resumes it minutes or hours later. ``time.monotonic``
goes on meanwhile, so every wait that was under way when the job was
stopped looks, at the resume, as long as the suspension. Measured before this clock: a 2-rank job stopped for 8 s
(``collective_timeout_s=5``) while rank 0 waited for rank 1, rank 1
continued 2.5 s after the rest (a scheduler resumes one host after
another), ended at the resume with "no progress for 10.0 s" (exit status
4), in 2 runs of 2. A timeout must count only the time its own process
could have run.

How: the thread that checks a deadline calls :meth:`RunningClock.tick` on
each of its polls. A gap between two ticks that is :data:`GAP_S` longer than
the poll's own sleep, in which the whole process used less than
:data:`CPU_SHARE` of a core, is time the process was stopped, and
:meth:`now` leaves it out. The CPU test keeps a long gap that is not a stop
counted: a main thread inside compiled code that holds the GIL (a Theano
function) keeps the checking thread from running, but it uses a core all
the while. A process starved of any CPU for a second (a machine loaded far
past its cores) counts as stopped too: it could not have run either.

Only this process's own stops are left out: a rank that waits for another
rank which is stopped still counts the whole wait, so a part of a job
stopped (one rank, one host) still ends the job at its timeout.
"""
import time

#: A gap between two ticks this much longer than the poll's sleep may be a stop.
GAP_S = 1.0
#: ... if the process used less than this share of one core during it.
CPU_SHARE = 0.1


class RunningClock(object):
    """``time.monotonic()`` less the time this process was found stopped.

    One thread calls :meth:`tick` after each of its sleeps; any thread may read
    :meth:`now` (a float read: no lock needed).
    """

    def __init__(self, gap_s=GAP_S, cpu_share=CPU_SHARE):
        self.gap_s, self.cpu_share = float(gap_s), float(cpu_share)
        #: Seconds this process was found stopped, in all.
        self.stopped_s = 0.0
        #: Each stop found: (seconds, monotonic time it was found at).
        self.stops = []
        self._last = time.monotonic()
        self._cpu = time.process_time()

    def now(self):
        """Monotonic seconds, the stops found so far left out."""
        return time.monotonic() - self.stopped_s

    def tick(self, slept_s=0.0):
        """Look at the time since the last tick (which slept ``slept_s`` of it);
        returns the seconds of it taken for a stop (0.0 when none)."""
        t, cpu = time.monotonic(), time.process_time()
        gap, used = t - self._last, cpu - self._cpu
        self._last, self._cpu = t, cpu
        lost = gap - max(float(slept_s), 0.0)
        if lost < self.gap_s or used >= self.cpu_share * gap:
            return 0.0
        self.stopped_s += lost
        self.stops.append((lost, t))
        return lost
