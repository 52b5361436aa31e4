"""``theanompi-ext bench hosts``: allreduce across emulated hosts against its bounds (root).

Makes ``--hosts`` H emulated hosts of ``--ranks-per-host`` R ranks
(launch/emulated_hosts.py: shared memory within a host, TCP between hosts,
each host's link shaped to ``--rate``, with a queue of ``--queue``: by
default deep enough that nothing is dropped there, as the simulator
assumes) and times, for each size, in
alternating blocks on the same ranks:

``flat``      MPI's own ``Allreduce`` on COMM_WORLD (MPICH picks its algorithm)
``rsag``      the two-level sum, reduce-scatter / shard allreduce / allgather
``leader``    the two-level sum, reduce / leaders' allreduce / bcast
``started``   the exchangers' path: ``MPICommunicator(topology='two-level')``'s
              ``start_allreduce`` then ``wait`` (its communication thread)

and with ``--wire-dtype float16|bfloat16`` also ``flat-wire`` (the flat
16-bit exchange, mpi_wire's alltoall-sum-allgather on every rank) and
``started-wire`` (the exchangers' two-level path, 16 bits between hosts
only, in pieces whose phases overlap).

The simulator (simulate/network.py) predicts each float32 method, from the
link rate times TCP's payload share of a 1500-byte frame, a latency
measured in the same run (a 4-byte allreduce between hosts), and the host's
own term measured in the same run (an allreduce of the size within each
host: twice a reduce-scatter's time): ``flat`` as recursive halving over
ranks placed host by host (its first log2 R steps stay in the host, the
rest cross with R flows per link: the bytes and phases of ``rsag``),
``rsag`` and ``started`` as ``two-level`` (``started`` with its pieces),
``leader`` as a reduce and a broadcast within the host (two reduce-scatters'
time each) around ``rhd`` between hosts; with each emulated host's share of
this machine's cores and per-byte costs of a sum, a copy and TCP measured
here before the ranks start (:func:`local_cpu_costs`; simulate/host.py's
``HostCPU``). The second table holds each prediction against the
measurement: the target is within 10%.

Each time is the median over ``--reps`` blocks of the slower rank's time per
call. Against two bounds, from the link rate B alone (bytes across a host's
link, each direction): the two-level lower bound ``2 (H-1)/H * S / B`` (each
host's S bytes cross its link once, as an allreduce among the hosts) and a
flat ring over all P = H R ranks placed host by host, ``2 (P-1)/P * S / B``
(each host's one link in the ring carries what every rank sends). A 16-bit
wire halves both. ``x bound`` is time / two-level bound: the target is
<= 1.10 from 1 MB up.
"""
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from ..errors import EXIT_BAD_INPUT, EXIT_CHECK_FAILED, EXIT_OK
from ..files.atomic import write_json
from ..launch.emulated_hosts import DEFAULT_QUEUE
from ..simulate.host import machine_cores
from .allreduce import format_size, parse_size

DEFAULT_SIZES = (256 << 10, 1 << 20, 4 << 20, 16 << 20)
TARGET = 1.10
TARGET_FROM_BYTES = 1 << 20


def register(sub):
    """Add ``bench hosts`` to the ``bench`` sub-parsers."""
    p = sub.add_parser('hosts', help='allreduce across emulated hosts vs its bounds (root)',
                       description=__doc__.split('\n\n')[0])
    p.add_argument('--hosts', type=int, default=2, metavar='H', help='emulated hosts to make, H (default %(default)s)')
    p.add_argument('--ranks-per-host', type=int, default=2, metavar='R',
                   help='ranks on each host (default 2)')
    p.add_argument('--rate', default='200mbit', help="each host's link, tc units "
                                                     '(default %(default)s)')
    p.add_argument('--delay', default=None, help='added between hosts, tc units (e.g. 1ms)')
    p.add_argument('--queue', default=DEFAULT_QUEUE, metavar='TIME',
                   help='how long a packet may wait at a link before it is dropped, tc units '
                        '(default %(default)s: lossless; 50ms: a shallow queue that TCP '
                        'overflows)')
    p.add_argument('--loss', default=None, metavar='P',
                   help='packets each link loses in each direction, at random: a fraction '
                        '(0.01) or a percentage (1%%); the bounds and predictions stay those '
                        'of a lossless link (default none)')
    p.add_argument('--per-frame', action='store_true',
                   help='one frame per packet on every link (no segmentation offload): '
                        '--loss per frame, as on a wire; costs the machine CPU')
    p.add_argument('--sizes', default=None, metavar='LIST',
                   help='bytes, comma-separated, K/M suffixes (default 256K,1M,4M,16M)')
    p.add_argument('--reps', type=int, default=5, metavar='N',
                   help='alternating blocks per method and size (default %(default)s)')
    p.add_argument('--wire-dtype', default='float32',
                   choices=('float32', 'float16', 'bfloat16'),
                   help='also time 16-bit exchanges (flat-wire, started-wire)')
    p.add_argument('--pieces-kb', default='', metavar='LIST',
                   help='also time rsag cut into parts of these KB whose phases overlap '
                        '(rsag-NNNk; the two-level default is 1024)')
    p.add_argument('--json', default='', metavar='FILE', help='write the results to FILE')
    p.add_argument('--timeout', type=float, default=900.0, metavar='S',
                   help='stop the job after this many seconds (default %(default)s)')
    p.set_defaults(func=main)


def main(args):
    """Make the hosts, run the ranks, print the table."""
    from ..launch.emulated_hosts import EmulatedHosts, check_shaping
    from ..launch.emulated_network import NetworkSetupError, tbf_link
    try:
        check_shaping(args.rate, args.delay, args.queue, flag='--', loss=args.loss)
        sizes = [parse_size(s) for s in args.sizes.split(',')] if args.sizes else \
            list(DEFAULT_SIZES)
        rate_Bps = tbf_link(args.rate)[0]
        if args.hosts < 2 or args.ranks_per_host < 1 or args.reps < 1:
            raise ValueError('--hosts must be >= 2, --ranks-per-host and --reps >= 1')
    except ValueError as exc:
        sys.stderr.write('theanompi-ext bench hosts: error: %s\n' % exc)
        return EXIT_BAD_INPUT
    spec = dict(sizes=sizes, reps=args.reps, wire_dtype=args.wire_dtype,
                pieces_kb=[int(k) for k in args.pieces_kb.split(',') if k])
    cpu_costs = local_cpu_costs()       # before the ranks run: this process alone
    try:
        with EmulatedHosts(args.hosts, args.ranks_per_host, args.rate, args.delay,
                           queue=args.queue, loss=args.loss, per_frame=args.per_frame) as eh:
            res = run_on_hosts(eh, spec, args.timeout)
            res['link_events'] = {h: eh.link_events(h) for h in eh.hosts}
            res['load'] = list(os.getloadavg())
    except (NetworkSetupError, RuntimeError) as exc:
        sys.stderr.write('theanompi-ext bench hosts: %s\n' % exc)
        return EXIT_CHECK_FAILED
    res.update(hosts=args.hosts, ranks_per_host=args.ranks_per_host, rate=args.rate,
               delay=args.delay, queue=args.queue, loss=eh.loss, per_frame=eh.per_frame,
               rate_Bps=rate_Bps,
               cpu=dict(cpu_costs, cores=machine_cores()))
    print(format_table(res))
    if args.json:
        write_json(args.json, res, 'the results', indent=1)
    return EXIT_OK


def run_on_hosts(eh, spec, timeout):
    """Run :func:`measure` on every slot of emulated hosts ``eh``; rank 0's result."""
    from ..launch.mpiexec import child_env, mpiexec_command
    with tempfile.TemporaryDirectory(prefix='bench-hosts-') as tmp:
        spec = dict(spec, out=os.path.join(tmp, 'result.json'))
        path = os.path.join(tmp, 'spec.json')
        write_json(path, spec, 'the job spec')
        cmd = mpiexec_command(eh.n * eh.ranks_per_host,
                              [sys.executable, '-u', '-m', __name__, path],
                              hostfile=eh.hostfile, mpiexec=eh.mpiexec)
        try:
            proc = subprocess.run(cmd, env=eh.env(child_env()), timeout=timeout)
        except subprocess.TimeoutExpired:
            raise RuntimeError('stopped after --timeout %g s' % timeout)
        if proc.returncode != 0:
            raise RuntimeError('the ranks failed (exit status %d)' % proc.returncode)
        import json
        with open(spec['out']) as f:
            return json.load(f)


def bounds(nbytes, hosts, ranks, rate_Bps, wire='float32'):
    """``(two-level bound, flat ring)`` in seconds for ``nbytes`` float32 bytes."""
    s = nbytes / (2.0 if wire != 'float32' else 1.0)
    p = hosts * ranks
    return 2.0 * (hosts - 1) / hosts * s / rate_Bps, 2.0 * (p - 1) / p * s / rate_Bps


CALIBRATION_BYTES = 16 << 20


def local_cpu_costs(nbytes=CALIBRATION_BYTES, reps=5):
    """Per-byte CPU seconds on this machine, measured here in one process (not from
    the allreduce): a float32 sum into a buffer (numpy's, as MPI's reduction loop),
    a copy, and TCP over loopback (this process's CPU time, both ends' threads and
    kernel work, per byte sent). The least of ``reps`` (the work's own cost: the
    contention is the model's part, and other jobs' load only adds to a time);
    buffers of ``nbytes``, beyond the caches like the exchange's. Under 0.1 s."""
    import socket
    import threading
    a = np.ones(nbytes // 4, np.float32)
    b = np.ones(nbytes // 4, np.float32)

    def per_byte(fn, clock=time.perf_counter):
        fn()                                                # pages in
        times = []
        for _ in range(reps):
            t0 = clock()
            fn()
            times.append(clock() - t0)
        return min(times) / nbytes

    def tcp_once():
        srv = socket.create_server(('127.0.0.1', 0))
        out = socket.create_connection(srv.getsockname())
        inn = srv.accept()[0]
        view = memoryview(b).cast('B')

        def drain():
            sink = bytearray(1 << 20)
            got = 0
            while got < nbytes:
                got += inn.recv_into(sink) or nbytes
        t = threading.Thread(target=drain)
        t.start()
        out.sendall(view)
        t.join()
        for sk in (out, inn, srv):
            sk.close()
    return dict(sum_s_per_byte=per_byte(lambda: np.add(a, b, out=a)),
                copy_s_per_byte=per_byte(lambda: np.copyto(a, b)),
                tcp_s_per_byte=per_byte(tcp_once, time.process_time))


def host_cpu(res):
    """The :class:`~theanompi_ext.simulate.host.HostCPU` of one emulated host of run
    ``res``: its share of the machine's cores (all hosts on one machine) and the
    run's per-byte costs; None for a run without them."""
    from ..simulate.host import HostCPU, emulated_cores_per_host
    c = res.get('cpu')
    if not c:
        return None
    return HostCPU(emulated_cores_per_host(res['hosts'], c['cores']), c['sum_s_per_byte'],
                   c['copy_s_per_byte'], c['tcp_s_per_byte'])


def format_table(res):
    """One line per size: each method's ms and its ratio to the two-level bound."""
    methods = res['methods']
    head = '%8s %9s %9s' % ('size', 'bound ms', 'ring ms') + ''.join(
        ' %9s %6s' % (m + ' ms', 'x bnd') for m in methods)
    # results written before the queue was an option had tbf's 50 ms
    lines = ['allreduce on %d emulated hosts x %d ranks, %s links%s, %s queue%s%s (%s)' % (
        res['hosts'], res['ranks_per_host'], res['rate'],
        ', +%s' % res['delay'] if res.get('delay') else '', res.get('queue', '50ms'),
        ', %g%% lost each way' % (100 * res['loss']) if res.get('loss') else '',
        ', a frame per packet' if res.get('per_frame') else '',
        res['mpi']), head]
    missed = []
    for r in res['rows']:
        line = '%8s' % format_size(r['bytes'])
        b32, ring32 = bounds(r['bytes'], res['hosts'], res['ranks_per_host'], res['rate_Bps'])
        line += ' %9.1f %9.1f' % (1e3 * b32, 1e3 * ring32)
        for m in methods:
            wire = res['wire_dtype'] if m.endswith('-wire') else 'float32'
            b = bounds(r['bytes'], res['hosts'], res['ranks_per_host'], res['rate_Bps'],
                       wire)[0]
            ratio = r[m] / b
            line += ' %9.1f %6.3f' % (1e3 * r[m], ratio)
            if r['bytes'] >= TARGET_FROM_BYTES and m in ('started', 'started-wire') and ratio > TARGET:
                missed.append('%s %s %.3f' % (m, format_size(r['bytes']), ratio))
        lines.append(line)
    lines.append(format_predictions(res))
    if res.get('link_events'):
        ev = res['link_events']
        lines.append('links during the run (every size and method): %s; load average %s' % (
            '; '.join('%s: %d tbf drops, %d lost, %d TCP segments retransmitted, %d '
                      'timeouts, %d loss probes' % (h, e['drops'], e.get('lost', 0), e['retrans'],
                                                    e['timeouts'], e['probes'])
                      for h, e in sorted(ev.items())),
            ' '.join('%.2f' % x for x in res.get('load', []))))
    lines.append('(median of %d alternating blocks, slower rank; bound = 2(H-1)/H S/B, ring = '
                 '2(P-1)/P S/B, 16-bit methods against half; two-level within %.2f x bound '
                 'from %s: %s)' % (res['reps'], TARGET, format_size(TARGET_FROM_BYTES),
                                   'met' if not missed else 'NOT met: ' + ', '.join(missed)))
    return '\n'.join(lines)


def predictions(res, row, cpu='run'):
    """``{method: predicted seconds}`` for the float32 methods of ``row``; ``cpu``: the
    host's :class:`~theanompi_ext.simulate.host.HostCPU`, by default the run's
    (:func:`host_cpu`), None for the link terms alone."""
    from ..collective.two_level import MAX_PIECES, PIECE_BYTES
    from ..simulate.network import tcp_payload_share, two_level_allreduce
    cpu = host_cpu(res) if cpu == 'run' else cpu
    h, g, n = res['hosts'], res['ranks_per_host'], row['bytes']
    bw = res['rate_Bps'] * tcp_payload_share(res.get('mtu', 1500))
    alpha = res['alpha_s']
    scatter = row.get('intra', 0.0) / 2.0       # one reduce-scatter within the host
    # the host's term enters through an equivalent link: zero latency, bw from scatter
    ibw = (g - 1.0) / g * n / scatter if g > 1 and scatter > 0 else 1e30

    def two(pieces):
        return two_level_allreduce(n, h, g, alpha, bw, 0.0, ibw, pieces, cpu)
    # leader: a reduce and a bcast within the host (two reduce-scatters' time each)
    # around an allreduce of N among the hosts' local ranks 0 (one rank per host)
    out = {'flat': two(1), 'rsag': two(1),
           'leader': 4 * scatter + two_level_allreduce(n, h, 1, alpha, bw, 0.0, 1e30, 1, cpu),
           'started': two(max(1, min(n // PIECE_BYTES, MAX_PIECES)))}
    for m in res['methods']:
        if m.startswith('rsag-') and m.endswith('k') and not m.endswith('-wire'):
            out[m] = two(max(1, min(n // (int(m[5:-1]) << 10), MAX_PIECES)))
    return out


def format_predictions(res):
    """Predicted vs measured ms for every float32 method and size, and the misses.

    ``sim`` is the lossless model; where the run counted TCP retransmission
    timeouts (``_timeouts``: per block, the most of any host), each block is
    also predicted as ``sim + timeouts * RTO`` (:func:`~theanompi_ext.simulate.network.with_timeouts`)
    and ``sim+rto/meas`` is the median over blocks of that against the block.
    """
    from ..simulate.network import with_timeouts
    lines = ['simulator (simulate/network.py) vs measured: link %.1f MB/s payload, latency '
             '%.0f us between hosts (measured)' % (
                 res['rate_Bps'] * _payload(res) / 1e6, 1e6 * res['alpha_s']),
             '%8s %-12s %9s %7s %9s %7s %6s %11s' % ('size', 'method', 'sim ms', 'cpu ms',
                                                     'meas ms', 'sim/meas', 'RTOs',
                                                     'sim+rto/meas')]
    cpu = host_cpu(res)
    if cpu:
        c = res['cpu']
        lines.insert(1, 'host CPU (measured here, this process alone): %g cores per host '
                        '(%d on the machine / %d hosts); sum %.3f, copy %.3f, TCP %.3f '
                        'ns/byte; cpu ms = what the host\'s CPU adds' % (
                            cpu.cores, c['cores'], res['hosts'], 1e9 * c['sum_s_per_byte'],
                            1e9 * c['copy_s_per_byte'], 1e9 * c['tcp_s_per_byte']))
    misses, rto_misses = [], []
    for r in res['rows']:
        bare = predictions(res, r, cpu=None)
        for m, t in predictions(res, r, cpu).items():
            if m not in r:
                continue
            ratio = t / r[m]
            lost = r.get(m + '_timeouts')
            line = '%8s %-12s %9.1f %7.1f %9.1f %7.3f' % (
                format_size(r['bytes']), m, 1e3 * t, 1e3 * (t - bare[m]), 1e3 * r[m], ratio)
            if lost is not None:
                per_block = [with_timeouts(t, n) / b for n, b in zip(lost, r[m + '_all'])]
                with_rto = float(np.median(per_block))
                line += ' %6d %11.3f' % (sum(lost), with_rto)
                if abs(with_rto - 1) > 0.10:
                    rto_misses.append('%s %s %.3f' % (m, format_size(r['bytes']), with_rto))
            lines.append(line)
            if abs(ratio - 1) > 0.10:
                misses.append('%s %s %.3f' % (m, format_size(r['bytes']), ratio))
    lines.append('(within 10%%: %s%s)' % (
        'all' if not misses else 'not ' + ', '.join(misses),
        '' if not any(m + '_timeouts' in r for r in res['rows'] for m in res['methods'])
        else '; with the RTOs: %s' % ('all' if not rto_misses else 'not ' + ', '.join(rto_misses))))
    return '\n'.join(lines)


def _payload(res):
    from ..simulate.network import tcp_payload_share
    return tcp_payload_share(res.get('mtu', 1500))


# -- inside each rank ---------------------------------------------------------------------

def measure(spec):
    """Time every method on every size (collective); returns the result dict."""
    from ..collective.mpi import MPICommunicator, library_version
    from ..collective.mpi_wire import wire_allreduce
    from ..collective.two_level import TwoLevel
    from ..collective.world import import_mpi
    MPI = import_mpi()
    world = MPI.COMM_WORLD
    wire = spec.get('wire_dtype', 'float32')
    comms = {a: TwoLevel(world, a, piece_bytes=0) for a in ('rsag', 'leader')}
    for kb in spec.get('pieces_kb', []):
        comms['rsag-%dk' % kb] = TwoLevel(world, 'rsag', piece_bytes=kb << 10)
    started = MPICommunicator(topology='two-level')
    methods = ['flat', 'rsag', 'leader'] + ['rsag-%dk' % kb for kb in
                                           spec.get('pieces_kb', [])] + ['started']
    if wire != 'float32':
        methods += ['flat-wire', 'started-wire']
    rows = []
    try:
        alpha = _between_hosts_latency(comms['leader'], world, spec['reps'])
        for nbytes in spec['sizes']:
            buf = np.zeros(nbytes // 4, np.float32)
            calls = {
                'flat': lambda: world.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM),
                'rsag': lambda: comms['rsag'].allreduce(buf),
                'leader': lambda: comms['leader'].allreduce(buf),
                'started': lambda: started.start_allreduce(buf).wait(),
                'flat-wire': lambda: wire_allreduce(world, buf, wire),
                **{m: (lambda c=c: c.allreduce(buf)) for m, c in comms.items()},
                'started-wire': lambda: started.start_allreduce(buf, wire=wire).wait(),
            }
            for m in methods:            # warm-up: connections, pages, the thread
                calls[m]()
            local = {m: [] for m in methods}
            lost = {m: [] for m in methods}
            counts = comms['rsag'].local_rank == 0      # one rank per host reads its stack
            for rep in range(spec['reps']):
                k = rep % len(methods)
                for m in methods[k:] + methods[:k]:
                    before = _timeouts() if counts else 0
                    world.Barrier()
                    t0 = time.perf_counter()
                    calls[m]()
                    local[m].append(time.perf_counter() - t0)
                    lost[m].append(_timeouts() - before if counts else 0)
            row = dict(bytes=int(nbytes),
                       intra=_within_host(comms['rsag'].local, world, buf, spec['reps']))
            for m in methods:
                slow = np.max(world.allgather(local[m]), axis=0)
                row[m] = float(np.median(slow))
                row[m + '_all'] = [float(v) for v in slow]
                # hosts' timeouts at once stall the call once: the most of any host
                row[m + '_timeouts'] = [int(v) for v in np.max(world.allgather(lost[m]),
                                                               axis=0)]
            rows.append(row)
    finally:
        started.close()
        for c in comms.values():
            c.free()
    return dict(benchmark='hosts', mpi=library_version(), reps=spec['reps'], rows=rows,
                alpha_s=alpha,
                methods=methods, wire_dtype=wire,
                ranks=world.Get_size())


def _timeouts():
    """TCP retransmission timeouts counted so far by this rank's network namespace
    (its emulated host)."""
    from ..launch.emulated_hosts import tcp_counters
    with open('/proc/net/snmp') as a, open('/proc/net/netstat') as b:
        return tcp_counters(a.read() + b.read()).get('TCPTimeouts', 0)


def _within_host(local, world, buf, reps):
    """Median over ``reps`` of the slowest rank's allreduce of ``buf`` within its host."""
    from ..collective.world import import_mpi
    MPI = import_mpi()
    times = []
    for _ in range(reps + 1):
        world.Barrier()
        t0 = time.perf_counter()
        local.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        times.append(world.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    return float(np.median(times[1:]))


def _between_hosts_latency(two, world, reps):
    """The latency term between hosts: a 4-byte allreduce among the hosts' local
    ranks 0 (rhd: 2 log2(H) steps), median of ``10 reps`` after a warm-up."""
    import math
    from ..collective.world import import_mpi
    MPI = import_mpi()
    x = np.zeros(1, np.float32)
    times = []
    for _ in range(10 * reps + 1):
        world.Barrier()
        t0 = time.perf_counter()
        if two.local_rank == 0:
            two.cross.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)
        times.append(time.perf_counter() - t0)
    hosts = world.allreduce(1 if two.local_rank == 0 else 0)
    t = world.bcast(float(np.median(times[1:])), root=0)
    return t / (2 * math.log2(hosts)) if hosts > 1 else 0.0


def worker_main(spec_path):
    """Entry point of each rank: ``python -m theanompi_ext.bench.hosts SPEC.json``."""
    from .common import rank_main
    return rank_main(spec_path, measure)


if __name__ == '__main__':
    sys.exit(worker_main(sys.argv[1]))
