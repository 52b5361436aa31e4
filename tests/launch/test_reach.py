"""Across hosts, the launcher's side (no MPI needed): naming the host mpiexec could not start
on (launch/reach.py), hydra's report of a rank on another host (the interface and
transport lines of info: test_network_default.py)."""
import os
import stat
import sys

from theanompi_ext.launch.reach import (LaunchWatch, explain_launch, hostfile_hosts, probe,
                                        proxy_program, unreachable)


def _agent(tmp_path):
    # answers for host 'up' only, as ssh would
    path = tmp_path / 'agent'
    path.write_text('#!/bin/sh\n[ "$1" = up ] && exit 0\n'
                    'echo "ssh: Could not resolve hostname $1: Name or service not known" >&2\n'
                    'exit 255\n')
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_hostfile_hosts_either_format(tmp_path):
    f = tmp_path / 'h'
    f.write_text('# nodes\nn1:2\nn2 slots=4\n\nn1:1  # again\n')
    assert hostfile_hosts(str(f)) == ['n1', 'n2']


def test_probe_and_unreachable(tmp_path):
    agent = _agent(tmp_path)
    assert probe('up', agent) is None
    why = probe('down', agent)
    assert why.startswith('`agent down true` failed with status 255: ssh: Could not resolve')
    assert [h for h, _ in unreachable(['up', 'down', 'gone'], agent)] == ['down', 'gone']
    assert 'cannot run the launcher agent' in probe('up', str(tmp_path / 'none'))


def test_proxy_program_is_hydras_beside_mpiexec(tmp_path):
    here = os.path.join(os.path.dirname(sys.executable), 'hydra_pmi_proxy')
    (tmp_path / 'mpiexec').write_text('')
    # none beside it (a wrapper script): this environment's, if it has one
    assert proxy_program(str(tmp_path / 'mpiexec')) == (here if os.access(here, os.X_OK)
                                                         else None)
    proxy = tmp_path / 'hydra_pmi_proxy'
    proxy.write_text('#!/bin/sh\n')
    proxy.chmod(proxy.stat().st_mode | stat.S_IEXEC)
    assert proxy_program(str(tmp_path / 'mpiexec')) == str(proxy)
    # a link elsewhere to that mpiexec: beside the file it links to
    (tmp_path / 'bin').mkdir()
    os.symlink(str(tmp_path / 'mpiexec'), str(tmp_path / 'bin' / 'mpiexec'))
    assert proxy_program(str(tmp_path / 'bin' / 'mpiexec')) == str(proxy)


def test_watch_and_message(tmp_path):
    agent, hosts = _agent(tmp_path), tmp_path / 'hosts'
    hosts.write_text('up:1\ndown:1\n')
    w = LaunchWatch()
    w.feed(b'[mpiexec@vm] main (mpiexec.c:270): process manager error waiting for completion\n')
    assert not w.failed and explain_launch(w, str(hosts), agent) is None
    w.feed(b'[mpiexec@vm] ui_cmd_cb (pmiserv_pmci.c:51): Launch proxy failed.\n')
    assert explain_launch(w, str(hosts), agent).startswith('cannot start the job on host down (')
    w.feed(b'[proxy:1@n7] HYDU_sock_connect (sock.c:140): unable to connect from "n7" to '
           b'"10.0.0.1" (No route to host)\n')
    assert explain_launch(w, str(hosts), agent).startswith(
        'host n7 could not reach the launcher\'s host at 10.0.0.1 (No route to host): ')


def test_a_program_missing_on_one_host(tmp_path):
    # hydra's lines name no host; the shell's names the program: each host is asked
    # whether it has it (`AGENT HOST test -x PATH`), and only 'b' has not
    agent, hosts = tmp_path / 'agent', tmp_path / 'hosts'
    agent.write_text('#!/bin/sh\nhost=$1; shift\n[ "$host" = b ] && [ "$1" = test ] && exit 1\n'
                     'exit 0\n')
    agent.chmod(agent.stat().st_mode | stat.S_IEXEC)
    hosts.write_text('a:1\nb:1\n')
    w = LaunchWatch()
    w.feed(b'bash: line 1: /opt/mpi/bin/hydra_pmi_proxy: No such file or directory\n')
    assert explain_launch(w, str(hosts), str(agent)) is None      # not a failed launch
    w.feed(b'[mpiexec@vm] ui_cmd_cb (pmiserv_pmci.c:51): Launch proxy failed.\n')
    assert explain_launch(w, str(hosts), str(agent)).startswith(
        "host b has no /opt/mpi/bin/hydra_pmi_proxy (the MPI launcher's program")
    # no shell's line came (hydra ended the launch first): the program mpiexec starts
    # by its own path is asked for
    w.missing = None
    assert explain_launch(w, str(hosts), str(agent), expected='/opt/mpi/bin/hydra_pmi_proxy') \
        .startswith("host b has no /opt/mpi/bin/hydra_pmi_proxy (the MPI launcher's program")
    # every host has it: nothing is guessed, the agent's own name is said
    w.missing = '/bin/sh'
    hosts.write_text('a:1\n')
    assert explain_launch(w, str(hosts), str(agent)) == (
        "mpiexec could not start its proxies on every host (a), and each answers "
        "`agent HOST true`: see mpiexec's lines above")


OPENMPI_NO_REPORT = b"""------------------------------------------------------------
A daemon failed to report back after being spawned. This could
be due to several factors, including inability to find the
daemon executable, or the executable was unable to find its
required supporting libraries. In some cases, the daemon was
able to execute, but was unable to complete a TCP connection
back to prterun:

  Local host:    vm
  Remote host:   tmxh1
  Daemon exit status: %d

This may also be caused by a firewall on the remote host. Please
check that any firewall (e.g., iptables) has been disabled and
try again.
------------------------------------------------------------
"""


def test_open_mpis_daemon_that_did_not_report_back():
    # measured, Open MPI 5: the far host's link down at the start (status 1), prted
    # missing there (127); the banner names the host, not the launcher's
    for status, start in ((1, "host tmxh1: Open MPI's daemon (prted) did not report back "
                              "to the launcher (its exit status 1): it could not reach"),
                          (127, "host tmxh1 could not start Open MPI's daemon (prted; exit "
                                "status 127, not found)")):
        w = LaunchWatch()
        for line in (OPENMPI_NO_REPORT % status).splitlines(True):
            w.feed(line)
        assert w.failed and explain_launch(w, None).startswith(start), explain_launch(w, None)
    # a second banner does not rename the host
    w.feed(b'  Remote host:   tmxh2\n')
    assert explain_launch(w, None).startswith('host tmxh1 ')
    # a banner cut short (no host line): the generic words, with no host invented
    w = LaunchWatch()
    w.feed(OPENMPI_NO_REPORT.splitlines(True)[1])
    assert explain_launch(w, None).startswith('mpiexec could not start its proxies on '
                                              'every host, and each answers')


HYDRA_FAR = b"""===================================================================================
=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES
=   PID 3837 RUNNING AT tmxh1
=   EXIT CODE: 9
=   CLEANING UP REMAINING PROCESSES
"""


def test_hydras_report_of_a_rank_on_another_host():
    # measured on 2 emulated hosts: no exit string, mpiexec exits 255
    from theanompi_ext.launch.launcher_report import LauncherReport
    from theanompi_ext.launch.why_ended import explain
    rep = LauncherReport()
    for line in HYDRA_FAR.splitlines(True):
        rep.feed(line)
    notes = {0: (3836, 'tmxh0', 'running'), 1: (3837, 'tmxh1', 'running')}
    msg, status = explain(255, rep, notes, 2)
    assert status == 9
    assert ('rank 1 of 2 (pid 3837 on tmxh1) died: exit code 9 (or killed by signal 9: '
            "hydra's report of a rank on another host)") in msg
    # a status of the rank's own (not hydra's 255) is kept, and nothing is guessed
    msg, status = explain(3, rep, notes, 2)
    assert status == 3 and 'died: exit code 9;' in msg


OPENMPI_PEER_LOST = b"""--------------------------------------------------------------------------
An MPI communication peer process has unexpectedly disconnected.  This
usually indicates a failure in the peer process (e.g., a crash or
otherwise exiting without calling MPI_FINALIZE first).

  Local host: tmxh0
  Local PID:  13105
  Peer host:  tmxh1
--------------------------------------------------------------------------
[tmxh0:00000] *** An error occurred in Socket closed
[tmxh0:00000] *** reported by process [1298399233,0]
--------------------------------------------------------------------------
prterun has exited due to process rank 0 with PID 13393 on node tmxh0 calling
"abort". This may have caused other processes in the application to be
terminated by signals sent by prterun (as reported here).
"""


def test_open_mpis_report_of_a_lost_peer_on_another_host():
    # captured (Open MPI 5.0.11, 2 emulated hosts x 1 rank): rank 1 on tmxh1 SIGKILLed,
    # rank 0 lost its connection and aborted, prterun exited 14 naming only rank 0
    from theanompi_ext.launch.launcher_report import LauncherReport
    from theanompi_ext.launch.why_ended import explain
    from theanompi_ext.train.restarts import classify, culprit
    rep = LauncherReport()
    for line in OPENMPI_PEER_LOST.splitlines(True):
        rep.feed(line)
    assert rep.peer_lost == ('tmxh1', 'tmxh0') and rep.pid is None
    msg, status = explain(14, rep, {0: (13393, 'tmxh0', 'running'),
                                    1: (13400, 'tmxh1', 'running')}, 2)
    assert status == 3 and msg.startswith(
        'theanompi-ext: rank 1 of 2 (pid 13400 on tmxh1) died: a rank on tmxh0 saw its '
        'connection closed')
    assert classify(status, msg).restartable and culprit(msg) == (1, 'tmxh1')
    # two ranks on the far host: both named as candidates, neither blamed
    msg, _ = explain(14, rep, {0: (1, 'tmxh0', 'running'), 1: (2, 'tmxh0', 'running'),
                               2: (3, 'tmxh1', 'running'), 3: (4, 'tmxh1', 'running')}, 4)
    assert msg.startswith('theanompi-ext: a rank on tmxh1 (one of ranks 2, 3) died: ')
    # only the rank's own MPI error (measured: Open MPI left its text out, 1 run in 3):
    # the running rank off the host that saw it is the one named
    rep = LauncherReport()
    for line in OPENMPI_PEER_LOST.splitlines(True)[9:]:
        rep.feed(line)
    assert rep.peer_lost == (None, 'tmxh0') and rep.pid is None
    msg, status = explain(14, rep, {0: (13393, 'tmxh0', 'running'),
                                    1: (13400, 'tmxh1', 'running')}, 2)
    assert status == 3 and msg.startswith(
        'theanompi-ext: rank 1 of 2 (pid 13400 on tmxh1) died: a rank on tmxh0 saw its '
        'connection closed (Open MPI: "An error occurred in Socket closed")')
    assert culprit(msg) == (1, 'tmxh1')
    msg, _ = explain(14, rep, {0: (1, 'tmxh0', 'running'), 1: (2, 'tmxh1', 'running'),
                               2: (3, 'tmxh2', 'running')}, 3)
    assert msg.startswith('theanompi-ext: a rank on another host (one of ranks 1, 2) died: ')
    # but rank 0's own abort (its watchdog) seen on tmxh0, then the line from tmxh1:
    # no lost peer, the abort is the story
    rep = LauncherReport()
    lines = OPENMPI_PEER_LOST.splitlines(True)
    for line in lines[11:] + [ln.replace(b'tmxh0', b'tmxh1') for ln in lines[9:11]]:
        rep.feed(line)
    assert rep.aborted == (0, 'tmxh0', None) and rep.peer_lost is None
    # rank 1 of 2 on tmxh0 raised (its note: failed 3) and aborted; rank 0, on the same
    # host, printed the lost socket after it: the rank's own error is the story
    rep = LauncherReport()
    for line in [ln.replace(b'rank 0 with PID 13393', b'rank 1 with PID 13394')
                 for ln in lines[9:]]:
        rep.feed(line)
    assert rep.aborted == (1, 'tmxh0', None) and rep.peer_lost == (None, 'tmxh0')
    msg, status = explain(3, rep, {0: (13393, 'tmxh0', 'running'),
                                   1: (13394, 'tmxh0', 'failed 3'),
                                   2: (13400, 'tmxh1', 'running')}, 3)
    assert (msg, status) == ('theanompi-ext: rank 1 of 3 (pid 13394 on tmxh0) ended the job '
                             '(exit status 3); its own line above says why', 3)


OPENMPI_TIMEOUT_RACE = b"""[tmxh0:00000] *** An error occurred in Socket closed
[tmxh0:00000] *** reported by process [3719626753,0]
[tmxh0:00000] *** on a NULL communicator
[tmxh0:00000] *** Unknown error
[tmxh0:00000] *** MPI_ERRORS_ARE_FATAL (processes in this communicator will now abort,
[tmxh0:00000] ***    and MPI will try to terminate your MPI job as well)
--------------------------------------------------------------------------
prterun has exited due to process rank 0 with PID 0 on node tmxh0 calling
"abort". This may have caused other processes in the application to be
terminated by signals sent by prterun (as reported here).
--------------------------------------------------------------------------
"""


def test_a_ranks_own_timeout_wins_over_the_socket_it_closed():
    # captured in CI (Open MPI 5.0.11, 2 emulated hosts x 1 rank, a crawling link):
    # rank 1 on tmxh1 timed out (its note: failed 4) and ended; rank 0 on tmxh0 saw
    # the socket close first, Open MPI's handler aborted it, and prterun named rank 0.
    # The timeout is the story and its status the job's, not "rank 1 died" (exit 3)
    from theanompi_ext.launch.launcher_report import LauncherReport
    from theanompi_ext.launch.why_ended import explain
    from theanompi_ext.train.restarts import classify
    rep = LauncherReport()
    for line in OPENMPI_TIMEOUT_RACE.splitlines(True):
        rep.feed(line)
    assert rep.peer_lost == (None, 'tmxh0') and rep.aborted[:2] == (0, 'tmxh0')
    notes = {0: (21025, 'tmxh0', 'running'), 1: (21026, 'tmxh1', 'failed 4')}
    msg, status = explain(14, rep, notes, 2)
    assert (msg, status) == ('theanompi-ext: rank 1 of 2 (pid 21026 on tmxh1) ended the job '
                             '(exit status 4); its own line above says why', 4)
    assert classify(status, msg) == classify(4, '')
    # mpiexec reported success (it lost the far host, and was stopped as if every rank
    # had ended): a rank that died without a word is still a vanished rank
    msg, status = explain(0, LauncherReport(), {0: (1, 'tmxh0', 'done 0'),
                                                1: (2, 'tmxh1', 'died')}, 2)
    assert status == 3 and msg.startswith('theanompi-ext: rank 1 (pid 2 on tmxh1) of 2 ended '
                                          'without finishing training'), msg
    # with keepers (launch/rank_keeper.py), rank 0's note says died: the same story
    notes[0] = (21025, 'tmxh0', 'died')
    assert explain(14, rep, notes, 2)[1] == 4
    # two ranks noted their own errors: both named, the first one's status the job's
    notes = {0: (1, 'tmxh0', 'running'), 1: (2, 'tmxh1', 'failed 3'),
             2: (3, 'tmxh1', 'failed 4')}
    msg, status = explain(14, rep, notes, 3)
    assert status == 3 and msg.startswith('theanompi-ext: ranks 1, 2 of 3 (on tmxh1) ended')
    # no rank noted an error of its own: the lost peer is still the story, whether
    # the notes say running or (their keepers') died
    for state in ('running', 'died'):
        notes = {0: (21025, 'tmxh0', state), 1: (21026, 'tmxh1', state)}
        msg, status = explain(14, rep, notes, 2)
        assert status == 3 and msg.startswith(
            'theanompi-ext: rank 1 of 2 (pid 21026 on tmxh1) died: a rank on tmxh0 saw its '
            'connection closed'), msg


def test_a_daemon_lost_during_the_run_is_named():
    # captured (Open MPI 5.0.11, 2 emulated hosts x 1 rank): every process of tmxh1
    # SIGKILLed mid-run; prterun printed its spawn banner and exited 0
    from theanompi_ext.launch.launcher_report import LauncherReport
    from theanompi_ext.launch.why_ended import explain
    from theanompi_ext.launch.reach import LaunchWatch, with_daemon_lost
    from theanompi_ext.train.restarts import classify
    watch = LaunchWatch()
    for line in (OPENMPI_NO_REPORT % 0).splitlines(True):
        watch.feed(line)
    assert watch.no_report == ['tmxh1', 0]
    notes = {0: (6606, 'tmxh0', 'died'), 1: (6612, 'tmxh1', 'running')}
    msg, status = explain(0, LauncherReport(), notes, 2)
    msg = with_daemon_lost(msg, watch.no_report)
    assert (msg, status) == (
        "theanompi-ext: host tmxh1: Open MPI's daemon (prted) ended during the run (its exit "
        "status 0): the host, the daemon or the launcher's connection to it was lost; rank 0 "
        "(pid 6606 on tmxh0), rank 1 (pid 6612 on tmxh1) of 2 ended without finishing "
        "training although mpiexec reported success; the run is incomplete (exit status 3)", 3)
    assert classify(status, msg).restartable
    # no banner, or one without a host: the message as it was
    assert with_daemon_lost('theanompi-ext: x', None) == 'theanompi-ext: x'
    assert with_daemon_lost('theanompi-ext: x', [None, None]) == 'theanompi-ext: x'
    assert LaunchWatch().daemon_ended is None


# captured (Open MPI 5.0.11, 2 emulated hosts x 1 rank, CI): tmxh1's prted alone
# SIGKILLed mid-run; prterun printed this banner instead of the spawn one, and exited 0
OPENMPI_LOST_DAEMON = b"""--------------------------------------------------------------------------
PRTE has lost communication with a remote daemon.

  HNP daemon   : [prterun-vm-9295@0,0] on node vm
  Remote daemon: [prterun-vm-9295@0,2] on node tmxh1

This is usually due to either a failure of the TCP network
connection to the node, or possibly an internal failure of
the daemon itself. We cannot recover from this failure, and
therefore will terminate the job.
--------------------------------------------------------------------------
"""


def test_a_daemon_lost_by_prrtes_other_banner_is_named():
    """The host is the remote daemon's, not the launcher's (``HNP daemon``); the
    launch itself did not fail."""
    from theanompi_ext.launch.launcher_report import LauncherReport
    from theanompi_ext.launch.why_ended import explain
    from theanompi_ext.launch.reach import LaunchWatch, with_daemon_lost
    watch = LaunchWatch()
    for line in OPENMPI_LOST_DAEMON.splitlines(True):
        watch.feed(line)
    assert watch.daemon_ended == ['tmxh1', None] and not watch.failed
    assert watch.no_report is None          # not a daemon that never reported back
    notes = {0: (9348, 'tmxh0', 'running'), 1: (9349, 'tmxh1', 'running')}
    msg, status = explain(0, LauncherReport(), notes, 2)
    assert (with_daemon_lost(msg, watch.daemon_ended), status) == (
        "theanompi-ext: host tmxh1: Open MPI's daemon (prted) ended during the run: the host, "
        "the daemon or the launcher's connection to it was lost; rank 0 (pid 9348 on tmxh0), "
        "rank 1 (pid 9349 on tmxh1) of 2 ended without finishing training although mpiexec "
        "reported success; the run is incomplete (exit status 3)", 3)
    # the spawn banner, when both came, names the host with the daemon's status
    for line in (OPENMPI_NO_REPORT % 0).splitlines(True):
        watch.feed(line)
    assert watch.daemon_ended == ['tmxh1', 0]


# captured: 2 emulated hosts x 1 rank, a prohibit route between the hosts (the hub
# reachable): Open MPI 5.0.11's standard error, and MPICH 5.0.2's (one rank's stack)
OPENMPI_CANNOT_CONNECT = b"""[tmxh1][[60021,1],1][/openmpi-5.0.11/opal/mca/btl/tcp/btl_tcp_endpoint.c:854:mca_btl_tcp_endpoint_start_connect] peer: tmxh0 Unable to connect to the peer 10.77.0.1 on port 1024: Permission denied

[tmxh1:00000] *** An error occurred in Socket closed
[tmxh1:00000] *** reported by process [3933536257,1]
[tmxh1:00000] *** on a NULL communicator
[tmxh1:00000] *** Unknown error
--------------------------------------------------------------------------
prterun has exited due to process rank 1 with PID 22179 on node tmxh1 calling
"abort". This may have caused other processes in the application to be
terminated by signals sent by prterun (as reported here).
--------------------------------------------------------------------------
"""
MPICH_INIT_FAILED = b"""Abort(678577423) on node 1: Fatal error in internal_Init_thread: Other MPI error, error stack:
internal_Init_thread(71)....................: MPI_Init_thread(argc=(nil), argv=(nil), required=3, provided=0x7ffc468c9d60) failed
MPII_Init_thread(333).......................: 
MPIR_init_comm_world(37)....................: 
check_num_nics(130).........................: 
MPIC_Sendrecv(273)..........................: 
MPIDI_OFI_send_lightweight(108).............: OFI call tinjectdata failed (default nic=eth0: Permission denied)
Abort(611468559) on node 0: Fatal error in internal_Init_thread: Other MPI error, error stack:
internal_Init_thread(71)....................: MPI_Init_thread(argc=(nil), argv=(nil), required=3, provided=0x7ffe88177bd0) failed
MPIDI_OFI_send_lightweight(108).............: OFI call tinjectdata failed (default nic=eth0: Invalid argument)
"""
REACH = ('the ranks of different hosts must reach each other over TCP, on any port (a '
         'firewall between the hosts, or an interface they do not share: --iface; '
         'docs/multinode.md)')


def _fed(text):
    from theanompi_ext.launch.postmortem import LauncherReport
    rep = LauncherReport()
    for line in text.splitlines(True):
        rep.feed(line)
    return rep


def test_ranks_that_cannot_reach_each_other_are_said_so_not_a_death():
    """Before, Open MPI's case read 'a rank on another host died: a rank on tmxh1 saw
    its connection closed', and MPICH's 'the job ended with exit status 15; the ranks'
    lines above say why' after 30 lines of error stacks."""
    from theanompi_ext.launch.why_ended import explain
    rep = _fed(OPENMPI_CANNOT_CONNECT)
    assert rep.unreachable_peer == (1, 'tmxh1', 'tmxh0', '10.77.0.1', 1024, 'Permission denied')
    msg, status = explain(14, rep, {}, 2)
    assert status == 3 and msg == (
        'theanompi-ext: rank 1 of 2 on tmxh1 could not connect to a rank on tmxh0 (10.77.0.1, '
        'port 1024: Permission denied): %s; mpiexec stopped the other ranks (exit status 3)'
        % REACH)
    # the first rank's stack, its deepest words
    rep = _fed(MPICH_INIT_FAILED)
    assert rep.init_failed == (1, 'OFI call tinjectdata failed (default nic=eth0: Permission '
                                  'denied)')
    msg, status = explain(15, rep, {}, 2)
    assert status == 3 and msg == (
        "theanompi-ext: rank 1 of 2 could not start MPI (MPICH's MPI_Init: OFI call "
        "tinjectdata failed (default nic=eth0: Permission denied)); with ranks on several "
        "hosts, %s (exit status 3)" % REACH)
    # a stack without words: the rank is named, the stack above is the cause
    rep = _fed(MPICH_INIT_FAILED.splitlines(True)[0] + b'internal_Init_thread(71)...: \n')
    assert rep.init_failed == (1, None)
    assert 'see its error stack above' in explain(15, rep, {}, 2)[0]


def test_an_abort_after_mpi_started_is_not_a_failed_start():
    from theanompi_ext.launch.why_ended import explain
    rep = _fed(b'Abort(4) on node 0 (rank 0 in comm 0): application called '
               b'MPI_Abort(MPI_COMM_WORLD, 4) - process 0\n')
    assert rep.init_failed is None and rep.aborted == (0, None, 4)
    # a rank noted its own error before an init failure was seen elsewhere: that error
    rep = _fed(MPICH_INIT_FAILED)
    msg, status = explain(3, rep, {0: (5, 'h0', 'failed 3'), 1: (6, 'h1', 'running')}, 2)
    assert 'could not start MPI' not in msg


def test_ranks_that_cannot_reach_each_other_may_be_restarted_once():
    # a link may come back; a firewall stays, and the same failure twice ends the restarts
    from theanompi_ext.launch.why_ended import explain
    from theanompi_ext.train.restarts import classify
    for text, status in ((OPENMPI_CANNOT_CONNECT, 14), (MPICH_INIT_FAILED, 15)):
        msg, status = explain(status, _fed(text), {}, 2)
        assert classify(status, msg) == (True, 'the ranks of different hosts could not reach '
                                               'each other')
