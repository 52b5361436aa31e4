"""An MPICH proxy lost during the run (launch/proxy_lost.py): hydra's words for it
recognised, the rank that ended first found from the launcher's own watch and
the keepers' notes, the launcher's line, and what a restart makes of it. The
jobs themselves: test_stop_and_disk.py (the proxy on one host) and
test_faults_across_hosts.py (the far host's daemon, root)."""
import os
import threading
import time

from theanompi_ext.launch.proxy_lost import ProxyWatch, first_to_end, keepers_word, message
from theanompi_ext.launch.rank_notes import write_rank_note
from theanompi_ext.train.restarts import classify, culprit

# mpiexec's lines, captured (MPICH 5.0.2): the far host's proxy SIGKILLed
LOST = b"""\
[mpiexec@vm] control_cb (/mpich-5.0.2/src/pm/hydra/mpiexec/pmiserv_cb.c:280): assert (!closed) failed
[mpiexec@vm] HYDT_dmxu_poll_wait_for_event (/mpich-5.0.2/src/pm/hydra/lib/tools/demux/demux_poll.c:76): callback returned error status
[mpiexec@vm] HYD_pmci_wait_for_completion (/mpich-5.0.2/src/pm/hydra/mpiexec/pmiserv_pmci.c:180): error waiting for event
[mpiexec@vm] main (/mpich-5.0.2/src/pm/hydra/mpiexec/mpiexec.c:270): process manager error waiting for completion
"""
# other trails that are not it: a rank's death (its proxy's words), a launch that failed
OTHERS = b"""\
[proxy:0@tmxh0] HYD_pmcd_pmip_control_cmd_cb (proxy/pmip_cb.c:480): assert (!closed) failed
[mpiexec@vm] HYDT_bscu_wait_for_completion (lib/tools/bootstrap/utils/bscu_wait.c:109): one of the processes terminated badly; aborting
[mpiexec@vm] HYD_sock_connect (lib/utils/sock.c:110): unable to connect from "tmxh1" to "10.77.0.254" (No route to host)
rank 0: control_cb (x.c:1): assert (!closed) failed
"""


def test_hydras_words_for_a_lost_proxy():
    watch = ProxyWatch()
    for line in OTHERS.splitlines(True):
        watch.feed(line)
    assert not watch.closed
    for line in LOST.splitlines(True):
        watch.feed(line)
    assert watch.closed


NS = 1000 * 1000


def test_the_rank_that_ended_first():
    notes = {0: (100, 'a', 'died'), 1: (101, 'b', 'died'), 2: (102, 'b', 'done')}
    # the keepers' notes, by their times
    assert first_to_end(notes, {0: 50 * NS, 1: 30 * NS, 2: 10 * NS}, {}) == 1
    # a rank of this host seen ending before any keeper's note
    here = dict(notes)
    here[3] = (103, 'here', 'running')
    assert first_to_end(here, {0: 50 * NS, 1: 30 * NS}, {3: 20 * NS}) == 3
    assert first_to_end(here, {0: 50 * NS, 1: 30 * NS}, {3: 40 * NS}) == 1
    # a rank that finished training is no candidate, however early it ended
    assert first_to_end(notes, {0: 50 * NS, 1: 30 * NS}, {2: 1 * NS}) == 1
    # a tie names nobody; nor do notes without a death
    assert first_to_end(notes, {0: 30 * NS, 1: 30 * NS}, {}) is None
    assert first_to_end({0: (1, 'a', 'running')}, {0: 5}, {}) is None


def test_the_launchers_line_and_the_restart():
    notes = {0: (100, 'tmxh0', 'died'), 1: (101, 'tmxh1', 'died')}
    line, status = message(notes, 1, 2)
    assert status == 3
    assert line == (
        "theanompi-ext: mpiexec lost the MPI proxy (hydra_pmi_proxy) of host tmxh1 during the "
        "run: the proxy ended (killed, or the OOM killer), or its host or the launcher's "
        "connection to it was lost; rank 1 of 2 (pid 101 on tmxh1) died: it ended without "
        "finishing training, the first rank to end (its keeper on tmxh1 noted it); mpiexec "
        "stopped the other ranks (exit status 3)")
    assert classify(status, line).restartable and culprit(line) == (1, 'tmxh1')
    # a rank of the launcher's host, seen by the launcher
    line, _ = message({0: (100, 'h0', 'running'), 1: (101, 'h1', 'died')}, 0, 2)
    assert 'of host h0 during' in line and '(the launcher saw it)' in line
    # one host: every rank was the proxy's child, none is named first
    line, _ = message({0: (100, 'vm', 'running'), 1: (101, 'vm', 'running')}, 0, 2)
    assert line.endswith("of host vm during the run: the proxy ended (killed, or the OOM "
                         "killer), or its host or the launcher's connection to it was lost; "
                         "ranks 0, 1 of 2 ended without finishing training, with it (exit "
                         "status 3)")
    assert classify(3, line).restartable and culprit(line) == (None, None)
    # several hosts and no word on which ended first
    line, _ = message({0: (100, 'h0', 'running'), 1: (101, 'h1', 'running')}, None, 2)
    assert 'the MPI proxy (hydra_pmi_proxy) of one of the hosts h0, h1 during' in line
    assert line.endswith('ranks 0, 1 of 2 ended without finishing training (exit status 3)')


def test_the_keepers_word_is_waited_for_a_moment(tmp_path):
    folder = str(tmp_path)
    write_rank_note(folder, 0, 'running')          # this host's (no keeper)
    t0 = time.monotonic()
    notes, _ = keepers_word(folder, here=os.uname()[1], wait_s=5)
    assert time.monotonic() - t0 < 1 and notes[0][2] == 'running'
    # a rank of another host: its keeper's note, 0.3 s later, is waited for
    with open(os.path.join(folder, 'rank1'), 'w') as f:
        f.write('4242 far running\n')
    later = threading.Timer(0.3, lambda: write_rank_note(folder, 1, 'died'))
    later.start()
    t0 = time.monotonic()
    notes, times = keepers_word(folder, here=os.uname()[1], wait_s=5)
    took = time.monotonic() - t0
    later.join()
    assert 0.2 < took < 3 and notes[1][2] == 'died' and 1 in times
    # and when none comes, the wait is bounded
    with open(os.path.join(folder, 'rank1'), 'w') as f:
        f.write('4242 far running\n')
    t0 = time.monotonic()
    keepers_word(folder, here=os.uname()[1], wait_s=0.5)
    assert 0.4 < time.monotonic() - t0 < 3


def test_a_proxy_lost_after_the_work_was_done():
    """Every rank had noted its own end: the run is complete (0), or stopped after
    a checkpoint as asked (75); a rank whose note was not seen is not taken for one
    that finished."""
    done = {0: (100, 'h0', 'done 0'), 1: (101, 'h1', 'done 0')}
    line, status = message(done, None, 2)
    assert status == 0 and line == (
        'theanompi-ext: mpiexec lost an MPI proxy (hydra_pmi_proxy) as the job ended, after '
        'every rank had finished training: the run is complete (exit status 0)'), line
    stopped = {0: (100, 'h0', 'stopped 75'), 1: (101, 'h1', 'stopped 75')}
    line, status = message(stopped, None, 2)
    assert status == 75 and 'the job can be resumed' in line
    line, status = message({0: (100, 'h0', 'done 0')}, None, 2)
    assert status == 3 and 'an MPI proxy (hydra_pmi_proxy) during' in line and \
        'their notes were not seen here' in line
    assert classify(status, line).restartable
