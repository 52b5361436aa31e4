"""Random packet loss on an emulated link, without netem.

Kernels without ``sch_netem`` (this machine's) cannot ``tc qdisc ... netem loss``,
and the tc actions that drop (``gact``, ``police``, ``drop``) may be missing too.
What such kernels still have is the ``clsact`` qdisc and the ``bpf`` classifier,
whose *direct-action* mode lets a classic BPF program return the verdict itself:
``TC_ACT_SHOT`` (2) drops the packet, ``TC_ACT_UNSPEC`` (-1) lets it go on. The
program here loads a fresh random 32-bit number for each packet (the ancillary
load ``SKF_AD_RANDOM``) and drops the packet when it is above a threshold, so
each packet is lost with probability ``fraction``, independently, the way
netem's plain ``loss P%`` does. It sits on a device's egress, so a link loses
``fraction`` of the frames in each direction when both its ends carry it (ARP
included, as a real lossy link would).

Plain functions: :func:`parse_loss` checks what a user wrote, :func:`loss_program`
is the bytecode for ``tc filter ... bpf bytecode``, :func:`loss_commands` the
``tc`` argument lists that set or clear it on one device.
"""

#: ``SKF_AD_OFF + SKF_AD_RANDOM`` (linux/filter.h: -0x1000 + 56) as the unsigned k of
#: ``ld [k]``: the packet's random number instead of packet bytes.
LOAD_RANDOM_K = 0x100000000 - 0x1000 + 56
# classic BPF opcodes (linux/bpf_common.h)
LD_W_ABS = 0x00 | 0x00 | 0x20       # BPF_LD | BPF_W | BPF_ABS
JGT_K = 0x05 | 0x20 | 0x00          # BPF_JMP | BPF_JGT | BPF_K
RET_K = 0x06 | 0x00                 # BPF_RET | BPF_K
TC_ACT_SHOT = 2
TC_ACT_UNSPEC = 0xFFFFFFFF          # -1: no verdict, the packet goes on
#: The filter's preference and handle on a device's egress: one loss filter per
#: device, replaced in place when the fraction changes.
PREF = '1'


def parse_loss(value, what='loss'):
    """The fraction of packets to lose, from a number in [0, 1) or a string
    'N%' (0 <= N < 100), as netem writes it; ValueError naming ``what``
    otherwise (a whole link lost is a cut: ``EmulatedHosts.cut``)."""
    if value is None:
        return 0.0
    text = str(value).strip()
    try:
        fraction = float(text[:-1]) / 100 if text.endswith('%') else float(text)
    except ValueError:
        raise ValueError('%s %r: not a fraction (0.02) or a percentage (2%%)' % (what, value))
    if not 0 <= fraction < 1:
        hint = (' (write %s%% for %s percent)' % (text, text)
                if not text.endswith('%') and 1 <= fraction < 100 else '')
        raise ValueError('%s %r: the fraction of packets lost must be at least 0 and below '
                         '1 (100%%)%s; a link that loses everything is cut' % (what, value, hint))
    return fraction


def drop_threshold(fraction):
    """The unsigned 32-bit number above which a packet is dropped: ``2**32 - 1 -
    round(fraction * 2**32)`` (numbers above it occur with probability ``fraction``)."""
    return 0xFFFFFFFF - int(round(parse_loss(fraction) * 2 ** 32))


def loss_program(fraction):
    """tc's ``bytecode`` text (``'4,c jt jf k,...'``: the length, then each
    instruction) of the program that drops each packet with probability
    ``fraction``: ``ld rand; jgt #threshold, drop, pass; pass: ret #-1; drop: ret #2``."""
    program = [(LD_W_ABS, 0, 0, LOAD_RANDOM_K),
               (JGT_K, 1, 0, drop_threshold(fraction)),
               (RET_K, 0, 0, TC_ACT_UNSPEC),
               (RET_K, 0, 0, TC_ACT_SHOT)]
    return ','.join([str(len(program))] + ['%d %d %d %d' % ins for ins in program])


def loss_commands(dev, fraction, before):
    """The ``tc`` argument lists (without ``tc`` and the namespace) that make ``dev``
    lose ``fraction`` of what it sends from now on, where ``before`` is the fraction
    it lost until now (None: the device has no ``clsact`` qdisc of ours yet, so one
    is added first). The filter is replaced in place; ``fraction`` 0 removes it
    (the qdisc stays, empty)."""
    fraction = parse_loss(fraction)
    if fraction > 0:
        add = [['qdisc', 'add', 'dev', dev, 'clsact']] if before is None else []
        return add + [['filter', 'replace', 'dev', dev, 'egress', 'pref', PREF, 'handle', '1',
                       'bpf', 'da', 'bytecode', loss_program(fraction)]]
    if before:
        return [['filter', 'del', 'dev', dev, 'egress', 'pref', PREF]]
    return []


__all__ = ['drop_threshold', 'loss_commands', 'loss_program', 'parse_loss']
