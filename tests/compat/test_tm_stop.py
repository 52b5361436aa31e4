"""A Theano-MPI session told to stop (theanompi_compat/rule.BSP.wait): SIGTERM or
SIGHUP to ``tmxlauncher`` (a scheduler's ``kill``, a closed terminal) stops every
rank as Ctrl-C does, the job's own launcher first saying so, and ends with 128 +
the signal and the session's line last; nothing of the job is left. A handler
of the caller's own, or a signal ignored when ``wait`` started, is left alone.
"""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from support.jobs import Job, wait_for
from support.paths import ROOT, root_on_path
from support.procs import descendants, the_mpiexec

TIMEOUT = 180


@pytest.mark.parametrize('sig,how', [(signal.SIGTERM, 'once'), (signal.SIGHUP, 'once'),
                                     (signal.SIGTERM, 'every process'),
                                     (signal.SIGTERM, 'burst'), (signal.SIGTERM, 'mpiexec')],
                         ids=['SIGTERM', 'SIGHUP', 'SIGTERM-to-every-process', 'SIGTERM-burst',
                              'SIGTERM-to-mpiexec-alone'])
def test_a_session_told_to_stop_stops_every_rank(tmp_path, sig, how):
    """``every process``: the signal also goes, at the same moment, to every process
    of the job (its launcher, mpiexec, the ranks), as a batch scheduler sends it (once
    in 7 runs the job's launcher ended in a KeyError from inside its handler, the
    second copy raised in the first's thread start); ``burst``: 100 copies to
    ``tmxlauncher`` within about 0.1 s (before, a late copy killed it: -15);
    ``mpiexec``: SIGTERM to the job's mpiexec alone, which passes it on to every rank
    (before: ``rank 1 of 2 ... died: Terminated (signal 15)``, 15)."""
    model = tmp_path / 'longmodel.py'
    model.write_text(textwrap.dedent('''\
        import sys
        sys.path.insert(0, %r)
        from digits_contract import DigitsMLPLayered


        class LongMLP(DigitsMLPLayered):
            """The contract's MLP, for as long as it takes to stop it."""

            def __init__(self, config):
                super(LongMLP, self).__init__(config)
                self.n_epochs = 100000
        ''' % os.path.join(ROOT, 'tests', 'dropin')))
    cfg = tmp_path / 'session.cfg'
    cfg.write_text('RULE=BSP\nMODELFILE=%s\nMODELCLASS=LongMLP\nDEVICES=(cpu0 cpu1)\n' % model)
    job = Job([sys.executable, '-m', 'theanompi_ext.tmlauncher', '-cfg=%s' % cfg], tmp_path,
              root_on_path())
    try:
        # both ranks through their first epoch: every part of the job is running
        wait_for(lambda: 'epoch 1/' in job.out() or job.proc.poll() is not None, 120,
                 'the first epoch')
        assert job.proc.poll() is None, job.err()[-3000:]
        pids = [job.proc.pid] + (descendants(job.proc.pid) if how == 'every process' else [])
        if how == 'mpiexec':
            pids = the_mpiexec(job.proc.pid)
        for k in range(100 if how == 'burst' else 1):
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            time.sleep(0.0005 * (k % 5))
        took = job.gone_within(20)
        rc = job.wait(TIMEOUT)
    finally:
        job.finish()
    name = signal.Signals(sig).name
    print('\n%s to %s -> every process of the job gone in %s s'
          % (name, 'mpiexec alone' if how == 'mpiexec' else 'tmxlauncher' + (
              '' if how == 'once' else ' (%s)' % how), took and '%.2f' % took))
    assert took is not None and took < 12, took
    assert rc == 128 + sig, (rc, job.err()[-3000:])
    lines = job.err().strip().splitlines()
    if how == 'mpiexec':
        # the session's own launcher was not signalled: the job's line is the last
        # (launch/signal_marks.py), no rank blamed
        assert lines[-1].startswith('theanompi-ext: every rank of the job (0, 1 of 2) was sent '
                                    'SIGTERM, and not by this launcher: '), job.err()[-3000:]
        assert 'died' not in job.err(), job.err()[-3000:]
        return
    assert lines[-1] == ('theanompi-ext: BSP.wait() stopped by %s: every rank was stopped '
                         '(exit status %d)' % (name, 128 + sig)), job.err()[-3000:]
    assert 'theanompi-ext: stopped by SIGTERM: every rank of the job ended' in lines[-2]


WAIT_SCRIPT = textwrap.dedent('''\
    import os, signal, subprocess, sys, threading, time
    from theanompi_ext.theanompi_compat.rule import BSP
    mine = []
    if sys.argv[1] == 'own':
        signal.signal(signal.SIGTERM, lambda s, f: mine.append(s))
    elif sys.argv[1] == 'ignored':
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    rule = BSP()
    # a stand-in job in a process group of its own, as init starts it
    rule.proc = subprocess.Popen(
        # for a burst, a job that takes 1 s to stop: every copy comes while wait stops it
        ['sh', '-c', 'trap "sleep 1; exit 143" TERM; sleep 5 & wait']
        if sys.argv[1].startswith('burst') else ['sleep', '3'], start_new_session=True)
    sig = signal.SIGINT if sys.argv[1] == 'burst-int' else signal.SIGTERM

    def send():
        # a burst: Ctrl-C again and again, a scheduler's and a user's kill together
        for k in range(100 if sys.argv[1].startswith('burst') else 1):
            os.kill(os.getpid(), sig)
            time.sleep(0.0005 * (k % 5))
    threading.Timer(0.5, send).start()
    status = rule.wait()
    after = signal.getsignal(sig)
    print(status, len(mine), rule.proc.returncode,
          'default' if after in (signal.SIG_DFL, signal.default_int_handler) else
          'ignored' if after == signal.SIG_IGN else 'own')
    ''')


@pytest.mark.parametrize('handler, printed', [
    # the default: the job stopped (its group SIGTERMed), 143, the default back after
    ('default', '143 0 -15 default'),
    # the caller's own handler runs instead, the job goes on to its end (0)
    ('own', '0 1 0 own'),
    # ignored when wait started: stays ignored, the job goes on
    ('ignored', '0 0 0 ignored'),
    # 100 copies: one stop, no traceback, the handlers back after (before, a copy
    # raised inside the stop)
    ('burst', '143 0 143 default'),
    ('burst-int', '130 0 143 default'),
])
def test_wait_catches_sigterm_only_where_it_has_its_default(tmp_path, handler, printed):
    res = subprocess.run([sys.executable, '-c', WAIT_SCRIPT, handler], capture_output=True,
                         text=True, timeout=60, env=root_on_path(), cwd=str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == printed.split(), (res.stdout, res.stderr)
    if handler in ('default', 'burst'):
        assert res.stderr.splitlines()[-1] == (
            'theanompi-ext: BSP.wait() stopped by SIGTERM: every rank was stopped (exit '
            'status 143)')
    if handler == 'burst-int':
        assert res.stderr.splitlines()[-1] == (
            'theanompi-ext: BSP.wait() interrupted (Ctrl-C): every rank was stopped (exit '
            'status 130)')
    assert 'Traceback' not in res.stderr, res.stderr
