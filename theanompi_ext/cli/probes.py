"""Child processes running ``info``'s checks (:mod:`.checks`): started together, time-bounded.

A check runs in a fresh interpreter, as a rank does: nothing this process
imported can hide what the check's imports do, and a check that hangs or
crashes (a device driver, MPI's start) costs only its own child. A child is
the leader of a process group of its own, so a timeout kills it with
whatever it started (``mpiexec``'s proxies and ranks).
"""
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from ..launch.mpiexec import set_parent_death_signal

#: A stage of a check: ``ok``, ``why`` (the reason, or a description when ok),
#: ``info`` (a dict of details: versions, device names...).
Stage = collections.namedtuple('Stage', 'ok why info')


def check_command(report, check, *args):
    """The command line running ``check`` with ``args``, reporting to file ``report``."""
    return [sys.executable, '-m', 'theanompi_ext.cli.checks', report, check] + list(args)


def last_line(data):
    """The last non-empty line of a child's output (bytes), at most 300 characters."""
    lines = [l.strip() for l in data.decode('utf-8', 'replace').splitlines() if l.strip()]
    text = lines[-1] if lines else ''
    return text if len(text) <= 300 else text[:297] + '...'


class Probe(object):
    """One check running in a child process, stopped ``timeout`` s after its start.

    ``launcher``: turns the check's command line into the one to run (an
    ``mpiexec`` line); ``env``: the child's environment; ``hint``: added to
    the reason when it timed out.
    """

    def __init__(self, check, args=(), timeout=30.0, launcher=None, env=None, hint=None):
        self.check, self.args, self.timeout = check, tuple(args), float(timeout)
        self.hint = hint
        self.timed_out, self.failure, self.proc = False, None, None
        self._reports = None
        fd, self.report = tempfile.mkstemp(prefix='theanompi-ext-info-', suffix='.jsonl')
        os.close(fd)
        self._err = tempfile.TemporaryFile()
        cmd = check_command(self.report, check, *args)
        try:
            cmd = launcher(cmd) if launcher else cmd
            # a group of its own (killed whole at the deadline), which dies with us
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=self._err,
                                         env=env, start_new_session=True,
                                         preexec_fn=set_parent_death_signal)
        except Exception as exc:  # noqa: B902 - no child: that is the report
            self.failure = 'could not start the check: %s: %s' % (type(exc).__name__, exc)
        self.deadline = time.monotonic() + self.timeout

    def wait(self):
        """Wait for the child to end, killing it at its deadline; idempotent."""
        if self._reports is not None:
            return
        if self.proc is not None:
            try:
                self.proc.wait(timeout=max(0.0, self.deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.timed_out = True
                self.kill()
        self._reports = self._read()

    def kill(self):
        """Kill the child's process group (a child not yet waited for: the group is still its)."""
        if self.proc is None or self.proc.returncode is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def _read(self):
        reports = []
        try:
            with open(self.report, encoding='utf-8') as f:
                for line in f:
                    try:
                        reports.append(json.loads(line))
                    except ValueError:
                        continue    # a line cut by a kill
        finally:
            os.unlink(self.report)
        self._err.seek(0)
        self._stderr = self._err.read()
        self._err.close()
        # rank 0's report first: it holds what the ranks agreed on
        return sorted(reports, key=lambda r: r.get('rank', 0))

    def stage(self, name):
        """The :class:`Stage` ``name`` as reported (a rank's failure first), or,
        when the child never reported it, failed with :meth:`end_reason`."""
        self.wait()
        mine = [r for r in self._reports if r.get('stage') == name]
        failed = [r for r in mine if not r.get('ok')]
        for r in failed or mine:
            return Stage(bool(r.get('ok')), r.get('why'), r.get('info') or {})
        return Stage(False, self.end_reason(), {})

    def end_reason(self):
        """Why the child did not report everything: its start, its timeout, its
        exit status and last line of stderr."""
        self.wait()
        if self.failure:
            return self.failure
        if self.timed_out:
            return 'timed out after %g s%s' % (self.timeout,
                                               ' (%s)' % self.hint if self.hint else '')
        status, last = self.proc.returncode, last_line(self._stderr)
        if status < 0:
            what = 'killed by %s' % signal.Signals(-status).name
        elif status:
            what = 'exit status %d' % status
        else:
            what = 'ended without reporting it'
        return '%s (%s)' % (last, what) if last else what

    def close(self):
        """Kill the child if it still runs and forget its files (after an interrupt)."""
        self.kill()
        if self._reports is None:
            self._reports = []
            self._err.close()
            if os.path.exists(self.report):
                os.unlink(self.report)


class ProbeSet(object):
    """The probes of one ``info``, each with ``timeout`` s; as a context manager it
    kills, on the way out, any child still running (Ctrl-C, an error)."""

    def __init__(self, timeout, env=None):
        self.timeout, self.env, self.probes = timeout, env, []

    def start(self, check, *args, launcher=None, hint=None):
        """Start a :class:`Probe` of ``check`` with ``args``; returns it."""
        probe = Probe(check, args, self.timeout, launcher, self.env, hint)
        self.probes.append(probe)
        return probe

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for probe in self.probes:
            probe.close()
        return False
