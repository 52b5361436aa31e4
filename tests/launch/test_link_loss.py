"""Random packet loss on the emulated hosts' links (launch/link_loss.py).

The program is checked by running it: a small classic-BPF interpreter here
(the four instructions it may use, decoded from tc's bytecode text) gives the
verdict for random numbers around the threshold. The root test sends
datagrams between two emulated hosts and counts what arrives: each link
loses its fraction in each direction, a packet between the hosts crosses
two links, and ``set_loss`` changes it during a run.
"""
import re
import subprocess

import numpy as np
import pytest

from support.hosts import TCP_BULK, python_on, skip_without_hosts
from theanompi_ext.launch.emulated_hosts import EmulatedHosts, check_shaping
from theanompi_ext.launch.link_loss import (drop_threshold, loss_commands, loss_program,
                                            parse_loss)

SHOT, PASS = 2, 0xFFFFFFFF


def verdict(bytecode, random):
    """Run tc's bytecode text on a packet whose random number is ``random``."""
    fields = bytecode.split(',')
    prog = [tuple(int(x) for x in ins.split()) for ins in fields[1:]]
    assert int(fields[0]) == len(prog)
    pc, acc = 0, None
    while True:
        code, jt, jf, k = prog[pc]
        if code == 0x20:                          # ld [k]: only the random number
            assert k == (-0x1000 + 56) & 0xFFFFFFFF, k
            acc = random
        elif code == 0x25:                        # jgt #k
            pc += jt if acc > k else jf
        elif code == 0x06:                        # ret #k
            return k
        else:
            raise AssertionError('unexpected instruction %r' % (prog[pc],))
        pc += 1


@pytest.mark.parametrize('fraction', [0.0, 0.01, 0.3, 0.999])
def test_the_program_drops_that_fraction_of_the_numbers(fraction):
    """Exactly the numbers above 2**32 (1 - fraction) - 1 are dropped: uniform
    random numbers then lose ``fraction`` (to 2**-32), checked by counting the
    verdicts over evenly spaced numbers and at the edge."""
    prog = loss_program(fraction)
    t = drop_threshold(fraction)
    assert verdict(prog, t) == PASS
    assert verdict(prog, 0) == PASS
    if fraction:
        assert verdict(prog, t + 1) == SHOT and verdict(prog, 2 ** 32 - 1) == SHOT
    else:
        assert t == 2 ** 32 - 1 and verdict(prog, t) == PASS
    numbers = np.linspace(0, 2 ** 32 - 1, 10001).astype(np.uint64)
    dropped = sum(verdict(prog, int(x)) == SHOT for x in numbers)
    assert abs(dropped / len(numbers) - fraction) < 2e-4


def test_what_a_loss_may_be():
    """A fraction in [0, 1) or a percentage; anything else is refused naming the flag,
    before anything is made (check_shaping)."""
    assert parse_loss('2%') == pytest.approx(0.02) and parse_loss(0.25) == 0.25
    assert parse_loss(None) == 0.0 and parse_loss('0') == 0.0
    for bad, words in [('2', 'write 2% for 2 percent'), ('100%', 'is cut'), ('-0.1', 'at least 0'),
                       ('lots', 'not a fraction'), ('nan', 'below 1'), (1, 'write 1%')]:
        with pytest.raises(ValueError) as err:
            check_shaping(loss=bad, flag='--')
        assert "--loss %r" % bad in str(err.value) and words in str(err.value), err.value
    with pytest.raises(ValueError, match='loss'):
        EmulatedHosts(hosts=2, loss='5')


def test_the_commands_set_change_and_clear_the_loss():
    """The qdisc is added once, the filter replaced in place, removed at 0."""
    first = loss_commands('eth0', '5%', None)
    assert first[0] == ['qdisc', 'add', 'dev', 'eth0', 'clsact']
    assert first[1][:9] == ['filter', 'replace', 'dev', 'eth0', 'egress', 'pref', '1',
                            'handle', '1'] and first[1][-1] == loss_program(0.05)
    again = loss_commands('eth0', 0.2, 0.05)
    assert len(again) == 1 and again[0][-1] == loss_program(0.2)
    assert loss_commands('eth0', 0, 0.2) == [['filter', 'del', 'dev', 'eth0', 'egress',
                                              'pref', '1']]
    assert loss_commands('eth0', 0, None) == [] and loss_commands('eth0', 0, 0.0) == []


DATAGRAMS = r'''
import socket, sys, time
role, addr, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
if role == 'recv':
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    s.bind((addr, 5002))
    print('ready', flush=True)
    s.settimeout(3.0)
    got = set()
    try:
        while True:
            got.add(int(s.recv(64)))
    except socket.timeout:
        pass
    print(len(got))
else:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for i in range(n):
        s.sendto(b'%d' % i, (addr, 5002))
        if i % 50 == 49:
            time.sleep(0.002)
'''


def _arrived(eh, n):
    """Datagrams of ``n`` sent from host 0 to host 1 that arrived (each counted once)."""
    recv = subprocess.Popen(python_on(eh, 1, DATAGRAMS, 'recv', eh.address(1), n),
                            stdout=subprocess.PIPE, text=True)
    try:
        assert recv.stdout.readline().strip() == 'ready'
        subprocess.run(python_on(eh, 0, DATAGRAMS, 'send', eh.address(1), n), check=True,
                       timeout=60)
        return int(recv.communicate(timeout=30)[0])
    finally:
        recv.kill()
        recv.wait()


@pytest.mark.root
def test_datagrams_between_two_lossy_links():
    """Each host's link loses 20% in each direction: 64% of host 0's datagrams reach
    host 1 (0.8 x 0.8, within 6 binomial standard deviations), and the links count
    what they lost; ``set_loss`` during the run: host 1's link at 0 -> 80%, both at 0
    -> every datagram. (The hosts first learn each other's addresses over lossless
    links: at 20% a link, ARP fails its 3 tries 1 time in 5, and the datagrams of
    the 0.2 s it takes to send them are then lost for want of an address.)"""
    skip_without_hosts()
    n = 4000

    def within(got, p):
        sd = (n * p * (1 - p)) ** 0.5
        assert abs(got - n * p) < 6 * sd, (got, n * p, sd)

    with EmulatedHosts(hosts=2, ranks_per_host=1) as eh:
        assert _arrived(eh, 100) == 100
        for host in eh.hosts:
            eh.set_loss(host, '20%')
        within(_arrived(eh, n), 0.64)
        lost = eh.link_events(0)['lost'] + eh.link_events(1)['lost']
        assert abs(lost - 0.2 * n - 0.2 * 0.8 * n) < 12 * (n * 0.2 * 0.8) ** 0.5, lost
        assert eh.link_events(0)['drops'] == 0
        eh.set_loss('tmxh1', 0)
        within(_arrived(eh, n), 0.8)
        eh.set_loss(0, None)
        assert _arrived(eh, n) == n
        eh.set_loss(0, 0.5)
        within(_arrived(eh, n), 0.5)


def _into_host_1(eh, nbytes):
    """Send ``nbytes`` over TCP from host 0 to host 1: (bytes received, packets and
    bytes the hub's end of host 1's link sent meanwhile, and of those packets how
    many frames its loss filter saw (tc counts an offload packet's frames) and how
    many packets it dropped)."""
    def counters():
        dev = '/sys/class/net/%s/statistics/' % eh.link(1)
        out = subprocess.run(['ip', 'netns', 'exec', eh.hub, 'cat', dev + 'tx_packets',
                              dev + 'tx_bytes'], capture_output=True, text=True).stdout
        tc = subprocess.run(['ip', 'netns', 'exec', eh.hub, 'tc', '-s', 'qdisc', 'show', 'dev',
                             eh.link(1)], capture_output=True, text=True).stdout
        seen = re.search(r'qdisc clsact .*\n Sent \d+ bytes (\d+) pkt \(dropped (\d+)', tc)
        return [int(x) for x in out.split()] + [int(seen.group(1)), int(seen.group(2))]

    recv = subprocess.Popen(python_on(eh, 1, TCP_BULK, 'recv', eh.address(1), 1, nbytes),
                            stdout=subprocess.PIPE, text=True)
    try:
        assert recv.stdout.readline().strip() == 'ready'
        before = counters()
        subprocess.run(python_on(eh, 0, TCP_BULK, 'send', eh.address(1), 1, nbytes),
                       check=True, timeout=120)
        got = int(recv.communicate(timeout=60)[0])
    finally:
        recv.kill()
        recv.wait()
    return [got] + [b - a for a, b in zip(before, counters())]


@pytest.mark.root
@pytest.mark.parametrize('per_frame', [True, False])
def test_loss_per_frame_or_per_packet(per_frame):
    """8 MB over TCP into a host whose link loses 2% each way. ``per_frame``: the
    link carries frames (at most 1514 bytes a packet), 2% of them are lost (within
    6 binomial standard deviations) and TCP still delivers every byte. Otherwise
    the link carries the kernel's offload packets of several frames each (why
    ``per_frame`` exists: a packet lost is then a burst of frames), and the loss is
    2% of those."""
    skip_without_hosts()
    nbytes = 8 << 20
    with EmulatedHosts(hosts=2, ranks_per_host=1, rate='200mbit', loss='2%',
                       per_frame=per_frame) as eh:
        got, packets, sent_bytes, seen, dropped = _into_host_1(eh, nbytes)
    assert got == nbytes
    offered = packets + dropped        # the filter sees each packet before the device
    if per_frame:
        assert sent_bytes / packets <= 1514 and packets > nbytes / 1514, (sent_bytes, packets)
        # a stray packet (IPv6 neighbour discovery, the close's retransmits at 2% loss)
        # may pass between the two counters' reads: 3 once in CI, under load; the other
        # case is more than twice as many
        assert abs(seen - offered) <= 2 + offered // 1000, (seen, offered)
    else:
        assert sent_bytes / packets > 2 * 1514, (sent_bytes, packets)
        assert seen > 2 * offered, (seen, offered)
    assert abs(dropped - 0.02 * offered) < 6 * (offered * 0.02 * 0.98) ** 0.5 + 1, \
        (dropped, offered)
