"""Waits that a stop signal interrupts whichever thread took it (launch/awake.py)."""
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from support.jobs import signal_a_helper_thread
from theanompi_ext.launch import awake


def test_wait_awake_returns_the_status_or_times_out():
    proc = subprocess.Popen([sys.executable, '-c', 'import sys; sys.exit(7)'])
    assert awake.wait_awake(proc) == 7
    proc = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])
    try:
        t0 = time.monotonic()
        with pytest.raises(subprocess.TimeoutExpired):
            awake.wait_awake(proc, timeout=0.6)
        assert 0.55 < time.monotonic() - t0 < 3
    finally:
        proc.kill()
        proc.wait()


def test_join_awake_says_whether_the_thread_ended():
    done = threading.Event()
    thread = threading.Thread(target=done.wait, daemon=True)
    thread.start()
    assert awake.join_awake(thread, timeout=0.3) is False
    done.set()
    assert awake.join_awake(thread) is True


# A process whose main thread waits (on a child that sleeps) while a helper thread
# exists; SIGINT raises KeyboardInterrupt in the main thread, which says so.
WAITER = textwrap.dedent('''
    import subprocess, sys, threading, time
    from theanompi_ext.launch.awake import wait_awake
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
    child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])
    print('waiting', flush=True)
    try:
        wait_awake(child)
    except KeyboardInterrupt:
        print('interrupted', flush=True)
    finally:
        child.kill()
''')


def test_a_signal_taken_by_a_helper_thread_interrupts_the_wait():
    proc = subprocess.Popen([sys.executable, '-c', WAITER], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == 'waiting\n'
        time.sleep(0.2)
        signal_a_helper_thread(proc.pid, 2)         # SIGINT
        out, _ = proc.communicate(timeout=5)
    finally:
        proc.kill()
    assert out == 'interrupted\n'
