"""Stop signals ignored before we catch them stay ignored (theanompi_ext/stop_signals.py):
``nohup``'s SIGHUP, the SIGINT of a shell's ``cmd &`` without job control. The
launcher's end-to-end case: test_stop_and_disk.py::test_signals_ignored_at_start_stay_ignored."""
import os
import signal

import pytest

from theanompi_ext import stop_signals
from theanompi_ext.bench.cli import exit_on_stop_signals
from theanompi_ext.files import signals


@pytest.fixture
def hup_ignored():
    """SIGHUP ignored as under ``nohup``; every stop signal's handler put back after."""
    before = {s: signal.getsignal(s) for s in stop_signals.STOP_SIGNALS}
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    yield
    for sig, handler in before.items():
        signal.signal(sig, handler)


def _noop(signum, frame):
    pass


def test_catch_leaves_an_ignored_signal_ignored_and_restores_the_rest(hup_ignored):
    term_before = signal.getsignal(signal.SIGTERM)
    old = stop_signals.catch({signal.SIGHUP: _noop, signal.SIGTERM: _noop})
    assert set(old) == {signal.SIGTERM}
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    assert signal.getsignal(signal.SIGTERM) is _noop
    stop_signals.restore(old)
    assert signal.getsignal(signal.SIGTERM) == term_before
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN


def test_catch_installs_a_signal_that_is_not_ignored():
    before = signal.getsignal(signal.SIGHUP)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        old = stop_signals.catch({signal.SIGHUP: _noop})
        assert old == {signal.SIGHUP: signal.SIG_DFL}
        assert signal.getsignal(signal.SIGHUP) is _noop
    finally:
        signal.signal(signal.SIGHUP, before)


def test_a_write_neither_delivers_nor_unignores_an_ignored_signal(hup_ignored):
    """Inside ``deferred_signals`` SIGHUP (ignored) is dropped and SIGTERM held; after
    it, SIGTERM reaches its handler once and SIGHUP is still ignored."""
    got = []
    signal.signal(signal.SIGTERM, lambda s, f: got.append(s))
    with signals.deferred_signals():
        os.kill(os.getpid(), signal.SIGHUP)
        os.kill(os.getpid(), signal.SIGTERM)
        assert got == []
    assert got == [signal.SIGTERM]
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN


def test_a_benchmark_started_under_nohup_runs_through_sighup(hup_ignored):
    def bench(args):
        os.kill(os.getpid(), signal.SIGHUP)
        return 0
    assert exit_on_stop_signals(bench)(None) == 0

    def stopped(args):
        os.kill(os.getpid(), signal.SIGTERM)
        return 0
    with pytest.raises(SystemExit) as exc:
        exit_on_stop_signals(stopped)(None)
    assert exc.value.code == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN


def test_hold_ignores_the_stop_signals_until_restored(hup_ignored):
    signal.signal(signal.SIGTERM, _noop)
    old = stop_signals.hold()
    assert set(old) == {signal.SIGINT, signal.SIGTERM}        # SIGHUP was ignored already
    assert all(stop_signals.ignored(s) for s in stop_signals.STOP_SIGNALS)
    os.kill(os.getpid(), signal.SIGINT)                     # nothing happens
    stop_signals.restore(old)
    assert signal.getsignal(signal.SIGTERM) is _noop
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert stop_signals.ignored(signal.SIGHUP)


# begin_stop is for good: in a process of its own
BEGIN_STOP = '''
import os, signal, sys
from theanompi_ext import stop_signals
got = []
old = stop_signals.catch({signal.SIGTERM: lambda s, f: got.append(s)})
stop_signals.begin_stop()
os.kill(os.getpid(), signal.SIGTERM)
os.kill(os.getpid(), signal.SIGINT)
stop_signals.restore(old)           # the stop signals stay ignored
os.kill(os.getpid(), signal.SIGTERM)
os.kill(os.getpid(), signal.SIGHUP)
print(got, [stop_signals.ignored(s) for s in stop_signals.STOP_SIGNALS],
      signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL)
'''


def test_begin_stop_ignores_the_stop_signals_until_the_process_ends():
    import subprocess
    import sys
    from support.paths import root_on_path
    r = subprocess.run([sys.executable, '-c', BEGIN_STOP], capture_output=True, text=True,
                       timeout=60, env=root_on_path())
    assert r.returncode == 0, r.stderr
    assert r.stdout.split('\n')[0] == '[] [True, True, True] True', r.stdout
