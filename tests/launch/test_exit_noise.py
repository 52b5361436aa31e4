"""hydra's own lines while a job ends are held back and told in one line
(launch/exit_noise.py, launch/postmortem.py), on output captured from hydra."""
import io
import sys
import threading

from theanompi_ext.launch import exit_noise
from theanompi_ext.launch.exit_noise import EndingFilter
from theanompi_ext.launch.postmortem import LauncherReport, _last_words, _pass_through

# captured: `train`-like launcher on 2 emulated hosts x 1 rank (MPICH 5.0.2), SIGTERMed
# while the ranks slept: hydra's standard error after the stop began
HYDRA_STOPPED = b"""[proxy:0@tmxh0] HYD_pmcd_pmip_control_cmd_cb (/mpich-5.0.2/src/pm/hydra/proxy/pmip_cb.c:490): assert (!closed) failed
[proxy:0@tmxh0] HYDT_dmxu_poll_wait_for_event (/mpich-5.0.2/src/pm/hydra/lib/tools/demux/demux_poll.c:76): callback returned error status
[proxy:0@tmxh0] main (/mpich-5.0.2/src/pm/hydra/proxy/pmip.c:123): demux engine error waiting for event
[mpiexec@vm] HYDT_bscu_wait_for_completion (/mpich-5.0.2/src/pm/hydra/lib/tools/bootstrap/utils/bscu_wait.c:109): one of the processes terminated badly; aborting
[mpiexec@vm] HYDT_bsci_wait_for_completion (/mpich-5.0.2/src/pm/hydra/lib/tools/bootstrap/src/bsci_wait.c:21): launcher returned error waiting for completion
[mpiexec@vm] HYD_pmci_wait_for_completion (/mpich-5.0.2/src/pm/hydra/mpiexec/pmiserv_pmci.c:196): launcher returned error waiting for completion
[mpiexec@vm] main (/mpich-5.0.2/src/pm/hydra/mpiexec/mpiexec.c:270): process manager error waiting for completion
"""
# captured: mpiexec -n 2 on one host, SIGTERMed: its standard output
HYDRA_BANNER = b"""
===================================================================================
=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES
=   PID 9205 RUNNING AT vm
=   EXIT CODE: 15
=   CLEANING UP REMAINING PROCESSES
=   YOU CAN IGNORE THE BELOW CLEANUP MESSAGES
===================================================================================
YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Terminated (signal 15)
This typically refers to a problem with your application.
Please see the FAQ page for debugging suggestions
"""


# captured: Open MPI 5.0.11's prterun, rank 1 on emulated host tmxh1 SIGSTOPped, rank 0's
# watchdog aborted the job: its standard error
OPENMPI_ABORTED = b"""--------------------------------------------------------------------------
prterun has exited due to process rank 0 with PID 0 on node tmxh0 calling
"abort". This may have caused other processes in the application to be
terminated by signals sent by prterun (as reported here).
--------------------------------------------------------------------------
[vm:13009] PMIX ERROR: PMIX_ERR_NOT_FOUND in file /openmpi-5.0.11/3rd-party/prrte/src/prted/pmix/pmix_server.c at line 1747
"""


def _run(lines, gate, *reports):
    dest = io.StringIO()
    _pass_through(io.BytesIO(lines), dest, gate, *reports)
    return dest.getvalue()


def test_a_stop_signal_leaves_the_launchers_line_last(capsys):
    gate = EndingFilter()
    assert _run(b'epoch 1 ...\n', gate) == 'epoch 1 ...\n'     # before the end: all shown
    gate.begin(banner=True)
    shown = _run(b'rank 0: stopping\n' + HYDRA_STOPPED + HYDRA_BANNER, gate)
    assert shown == 'rank 0: stopping\n\n'                   # the ranks' own lines pass
    _last_words(gate, 'theanompi-ext: stopped by SIGTERM: every rank of the job ended '
                      '(exit status 143)', sys.stderr)
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "theanompi-ext: 17 lines of mpiexec's own while the job ended not shown (the last: "
        "process manager error waiting for completion; "
        "THEANOMPI_EXT_SHOW_MPIEXEC_TEARDOWN=1 shows them)",
        'theanompi-ext: stopped by SIGTERM: every rank of the job ended (exit status 143)']


def test_a_dead_rank_keeps_hydras_report_but_not_its_trail(monkeypatch):
    gate, report = EndingFilter(), LauncherReport()
    banner = HYDRA_BANNER.replace(b'15', b'9').replace(b'Terminated', b'Killed')
    shown = _run(banner + HYDRA_STOPPED, gate, report)
    assert 'PID 9205 RUNNING AT vm' in shown and 'Killed (signal 9)' in shown
    assert 'launcher returned error' not in shown and len(gate.held) == 7
    assert report.pid == 9205 and report.signal == 9           # the report still sees all
    # nothing ended (no rank named, no stop): hydra's trail comes after all, as it
    # was, before the launcher's line, and no summary
    gate, err = EndingFilter(), io.StringIO()
    assert _run(HYDRA_STOPPED, gate) == ''
    _last_words(gate, 'theanompi-ext: the last', err)
    assert err.getvalue() == HYDRA_STOPPED.decode() + 'theanompi-ext: the last\n'
    assert EndingFilter().summary() is None
    monkeypatch.setenv(exit_noise.SHOW_VAR, '1')               # to debug MPI itself
    gate = EndingFilter()
    gate.begin(banner=True)
    assert _run(HYDRA_STOPPED, gate) == HYDRA_STOPPED.decode()


def test_the_banner_of_a_stop_sent_to_mpiexec_alone_is_held():
    """Every rank marked the signal (``stopped_outside``, asked at the banner's first
    line, launch/signal_marks.py): hydra's banner reports that stop, not a rank's
    death, and is held as after the launcher's own stop; the report still reads it.
    Not every rank marked: the banner passes, as for a rank's death."""
    asked = []
    gate, report = EndingFilter(lambda: asked.append(1) or True), LauncherReport()
    assert _run(b'rank 0: step 1\n', gate) == 'rank 0: step 1\n'
    assert asked == []                          # asked only at a line of '=' only
    assert _run(HYDRA_BANNER, gate, report) == '\n'
    assert report.pid == 9205 and report.signal == 15 and asked == [1]
    assert len(gate.held) == 10 and "10 lines of mpiexec's own" in gate.summary()
    gate = EndingFilter(lambda: False)
    assert 'BAD TERMINATION' in _run(HYDRA_BANNER, gate, LauncherReport())


def test_the_trail_before_the_report_of_a_far_rank_is_held():
    """A rank dead on another host: this host's proxy and mpiexec write their trail
    on standard error before mpiexec's banner on standard output names the rank
    (measured, check-equivalence on 2 emulated hosts): held all the same."""
    gate, report, err = EndingFilter(), LauncherReport(), io.StringIO()
    assert _run(b'rank 0: step 1\n' + HYDRA_STOPPED, gate, report) == 'rank 0: step 1\n'
    banner = HYDRA_BANNER.replace(b'15', b'9').replace(b'vm', b'tmxh1')
    shown = _run(banner.replace(b'YOUR APPLICATION TERMINATED', b'x'), gate, report)
    assert 'PID 9205 RUNNING AT tmxh1' in shown and report.host == 'tmxh1'
    _last_words(gate, 'theanompi-ext: rank 1 of 2 (pid 9205 on tmxh1) died', err)
    assert err.getvalue().splitlines() == [
        "theanompi-ext: 7 lines of mpiexec's own while the job ended not shown (the last: "
        "process manager error waiting for completion; "
        "THEANOMPI_EXT_SHOW_MPIEXEC_TEARDOWN=1 shows them)",
        'theanompi-ext: rank 1 of 2 (pid 9205 on tmxh1) died']


def test_open_mpis_line_after_an_abort_is_held():
    """A rank's MPI_Abort (its own message says why) begins the end: prterun's report
    passes, its PMIx error line after it is held and told before nothing else."""
    gate, report = EndingFilter(), LauncherReport()
    shown = _run(OPENMPI_ABORTED, gate, report)
    assert report.aborted == (0, 'tmxh0', None) and 'calling\n"abort"' in shown
    assert 'PMIX' not in shown and len(gate.held) == 1
    err = io.StringIO()
    _last_words(gate, None, err)
    assert err.getvalue().splitlines() == [
        "theanompi-ext: 1 line of mpiexec's own while the job ended not shown (the last: "
        "PMIX ERROR: PMIX_ERR_NOT_FOUND in file /openmpi-5.0.11/3rd-party/prrte/src/prted/"
        "pmix/pmix_server.c at line 1747; THEANOMPI_EXT_SHOW_MPIEXEC_TEARDOWN=1 shows them)"]


def test_the_launchers_line_starts_a_line_of_its_own():
    # measured under Open MPI: rank 0's progress line, rewritten in place, was the last
    # line passed when rank 1 died; the explanation must not be glued to it
    shown, dest = [], io.StringIO()
    _pass_through(io.BytesIO(b'plan\nprogress: it 1/44\r\x1b[K'), dest, EndingFilter(),
                  shown=shown)
    err = io.StringIO()
    _last_words(EndingFilter(), 'theanompi-ext: rank 1 of 2 (pid 7 on h) died', err,
                shown=shown)
    assert (dest.getvalue() + err.getvalue()).splitlines()[-1] == \
        'theanompi-ext: rank 1 of 2 (pid 7 on h) died'
    err = io.StringIO()
    _last_words(EndingFilter(), 'theanompi-ext: done', err, shown=[b'a line\n'])
    assert err.getvalue() == 'theanompi-ext: done\n'         # no blank line added


# captured: Open MPI 5.0.11's prterun given a second SIGTERM (a scheduler's, then the
# launcher's stop): its standard error
OPENMPI_SECOND_SIGNAL = b'Abort is in progress...hit ctrl-c again to forcibly terminate\n\n'


def test_prteruns_abort_line_is_held_with_its_blank_line():
    gate = EndingFilter()
    gate.begin(banner=True)
    assert _run(b'rank 1: stopping\n' + OPENMPI_SECOND_SIGNAL + b'\n', gate) == \
        'rank 1: stopping\n\n'           # the blank line after it is held, a later one not
    assert gate.summary() == (
        "theanompi-ext: 1 line of mpiexec's own while the job ended not shown (the last: "
        "Abort is in progress...hit ctrl-c again to forcibly terminate; "
        "THEANOMPI_EXT_SHOW_MPIEXEC_TEARDOWN=1 shows them)")


def test_prteruns_abort_line_before_the_end_is_shown_if_the_job_ends_otherwise():
    # the scheduler's signal reached prterun first: held, as the launcher's stop is
    # about to begin; a job that then ended some other way shows it
    gate = EndingFilter()
    assert _run(OPENMPI_SECOND_SIGNAL, gate) == ''
    assert gate.unheld() == [OPENMPI_SECOND_SIGNAL.splitlines(keepends=True)[0]]
    gate = EndingFilter()
    _run(OPENMPI_SECOND_SIGNAL, gate)
    gate.begin(banner=True)
    assert gate.unheld() == [] and len(gate.held) == 1


# captured: Open MPI 5.0.11, 2 emulated hosts whose ranks' routes to each other were
# refused (test_faults_across_hosts.py::test_hosts_whose_ranks_cannot_reach_each_other
# [rejected], twice in 2 sessions): its standard error, with the NUL that prterun's
# output forwarding put before the rank's BTL line
OPENMPI_REFUSED_WITH_NUL = (
    b"[tmxh1:00000] *** An error occurred in Socket closed\n"
    b"[tmxh1:00000] *** reported by process [1207173121,1]\n"
    b"[tmxh1:00000] *** on a NULL communicator\n"
    b"[tmxh1:00000] *** Unknown error\n"
    b"[tmxh1:00000] *** MPI_ERRORS_ARE_FATAL (processes in this communicator will now abort,\n"
    b"[tmxh1:00000] ***    and MPI will try to terminate your MPI job as well)\n"
    b"\0[tmxh1][[18420,1],1][/openmpi-5.0.11/opal/mca/btl/tcp/btl_tcp_endpoint.c:854:"
    b"mca_btl_tcp_endpoint_start_connect] peer: tmxh0 Unable to connect to the peer "
    b"10.77.0.1 on port 1024: Permission denied\n"
    b"\n" + OPENMPI_ABORTED.replace(b'rank 0 with PID 0 on node tmxh0',
                                    b'rank 1 with PID 0 on node tmxh1'))


def test_a_line_behind_a_nul_is_still_read():
    """The line behind Open MPI's NUL names the host that could not be reached: the
    reports read it (the line is shown as it came). Before, the NUL hid it, and the
    launcher said a rank on another host had died of a closed socket."""
    from theanompi_ext.launch.why_ended import explain
    report = LauncherReport()
    shown = _run(OPENMPI_REFUSED_WITH_NUL, EndingFilter(), report)
    assert '\0[tmxh1][[18420,1],1]' in shown
    assert report.unreachable_peer == (1, 'tmxh1', 'tmxh0', '10.77.0.1', 1024,
                                       'Permission denied'), report.unreachable_peer
    message, status = explain(3, report, {0: (10, 'tmxh0', 'running'),
                                          1: (11, 'tmxh1', 'running')}, 2)
    assert status == 3 and message.startswith(
        'theanompi-ext: rank 1 of 2 on tmxh1 could not connect to a rank on tmxh0 '
        '(10.77.0.1, port 1024: Permission denied)'), message


RULE = b'-' * 74 + b'\n'
# captured: Open MPI 5.0.11, 2 ranks on one host, SIGINT sent to each rank (not to
# prterun): each took it as Ctrl-C and aborted; standard error after the ranks' lines
OPENMPI_SIGINT_TO_EACH_RANK = (
    b'theanompi-ext: rank 0 of 2 stopped by SIGINT (exit status 130)\n'
    b'theanompi-ext: rank 1 of 2 stopped by SIGINT (exit status 130)\n' + RULE +
    b'MPI_ABORT was invoked on rank 0 in communicator MPI_COMM_WORLD\n'
    b'  Proc: [[12361,1],0]\n  Errorcode: 130\n\n'
    b'NOTE: invoking MPI_ABORT causes Open MPI to kill all MPI processes.\n'
    b'You may or may not see output from other processes, depending on\n'
    b'exactly when Open MPI kills them.\n' + RULE + RULE +
    b'prterun has exited due to process rank 0 with PID 0 on node vm calling\n'
    b'"abort". This may have caused other processes in the application to be\n'
    b'terminated by signals sent by prterun (as reported here).\n' + RULE + b' \n')


def test_open_mpis_messages_of_a_signal_to_every_rank_are_held():
    """Every rank marked SIGINT (sent to each rank; prterun never sends it): Open MPI's
    framed messages that follow, the rank's MPI_ABORT and prterun's report, each
    blaming rank 0, are held with prterun's blank line after its own, as hydra's
    banner is; the report still reads them; the ranks' own lines pass. Not every rank
    marked (one rank's SIGINT): all of it is shown."""
    asked = []
    gate, report = EndingFilter(lambda: asked.append(1) or True), LauncherReport()
    shown = _run(OPENMPI_SIGINT_TO_EACH_RANK + b'a later line\n', gate, report)
    assert shown.splitlines() == [
        'theanompi-ext: rank 0 of 2 stopped by SIGINT (exit status 130)',
        'theanompi-ext: rank 1 of 2 stopped by SIGINT (exit status 130)', 'a later line']
    assert report.aborted == (0, 'vm', 130) and asked == [1]
    assert len(gate.held) == 14 and gate.summary().startswith(
        "theanompi-ext: 14 lines of mpiexec's own while the job ended not shown (the last: "
        "its report of the ranks it ended; ")
    gate = EndingFilter(lambda: False)
    assert _run(OPENMPI_SIGINT_TO_EACH_RANK, gate, LauncherReport()) == \
        OPENMPI_SIGINT_TO_EACH_RANK.decode()


def test_open_mpis_frames_are_counted_per_stream():
    """A frame opened on one stream (its reader thread) does not close another's: the
    standard output's lines pass while a message on standard error is held; a line
    of fewer dashes (a model's separator) is no frame."""
    gate = EndingFilter(lambda: True)
    opened = threading.Thread(target=gate.let, args=(RULE,))
    opened.start()
    opened.join()
    assert len(gate.held) == 1                          # standard error's frame opened
    assert gate.let(b'rank 0: step 9\n')                # standard output's line passes
    assert gate.let(b'-' * 30 + b'\n') and gate.let(b'after a separator\n')
    assert not gate.let(RULE) and not gate.let(b'in a frame\n') and not gate.let(RULE)
    assert gate.let(b'after the frame\n') and len(gate.held) == 4


# captured: MPICH 5.0.2, 2 ranks on one host, SIGINT sent to each rank: standard error
MPICH_SIGINT_TO_EACH_RANK = (
    b'theanompi-ext: rank 0 of 2 stopped by SIGINT (exit status 130)\n'
    b'theanompi-ext: rank 1 of 2 stopped by SIGINT (exit status 130)\n'
    b'Abort(130) on node 1 (rank 1 in comm 0): application called '
    b'MPI_Abort(MPI_COMM_WORLD, 130) - process 1\n')


def test_mpichs_abort_line_of_a_signal_to_every_rank_is_held():
    """Every rank marked SIGINT: MPICH's line of the abort of the rank that took it
    is held (the report still reads it); one rank's SIGINT keeps it."""
    gate, report = EndingFilter(lambda: True), LauncherReport()
    shown = _run(MPICH_SIGINT_TO_EACH_RANK, gate, report)
    assert shown == MPICH_SIGINT_TO_EACH_RANK.decode().split('Abort(130) on', 1)[0]
    assert report.aborted == (1, None, 130) and len(gate.held) == 1
    assert gate.summary() == (
        "theanompi-ext: 1 line of mpiexec's own while the job ended not shown (the last: "
        "Abort(130) on node 1 (rank 1 in comm 0): application called MPI_Abort(MPI_COMM_WORLD, "
        "130) - process 1; THEANOMPI_EXT_SHOW_MPIEXEC_TEARDOWN=1 shows them)")
    gate = EndingFilter(lambda: False)
    assert _run(MPICH_SIGINT_TO_EACH_RANK, gate, LauncherReport()) == \
        MPICH_SIGINT_TO_EACH_RANK.decode()
