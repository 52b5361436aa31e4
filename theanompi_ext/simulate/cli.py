"""``theanompi-ext simulate``: predicted step time and scaling efficiency.

Prints a table (overlapped buckets and Theano-MPI's serial exchange side by
side) and, as its last line, the bare predicted scaling efficiency for the
largest requested GPU count, in the preset's mode (overlapped unless
``--no-overlap`` or a serial preset), relative to the baseline GPU count.
Errors in the inputs print ``theanompi-ext simulate: error: ...`` and exit 2.
"""
import math
import sys
from dataclasses import replace

from ..cli.argtypes import output_path
from ..files.atomic import write_json

PROG = 'theanompi-ext simulate'
MIB = 2 ** 20

# Without a preset (--layers alone): a Goyal-like cluster and DDP's 25 MiB.
DEFAULT_NETWORK = dict(algorithm='hierarchical', bandwidth_gbit=50.0, latency_us=25.0,
                       intra_bandwidth_gbit=160.0, intra_latency_us=5.0, gpus_per_node=8)
DEFAULT_BUCKET_MB = 25.0


def register(subparsers):
    """Add the ``simulate`` sub-command to the top-level CLI."""
    p = subparsers.add_parser(
        'simulate', help='predict step time and scaling efficiency for k workers',
        description='Predict step time and weak-scaling efficiency of synchronous SGD '
                    'on k GPUs, overlapped (bucketed allreduce during backprop) and '
                    "serial (Theano-MPI's exchange). Prints a table; the last line is the "
                    'bare efficiency at the largest --gpus, relative to the baseline. '
                    'See docs/simulator.md.')
    for add in (_workload_options, _cluster_options, _exchange_options, _output_options):
        add(p)
    p.set_defaults(func=main)


def _workload_options(p):
    from .presets import PRESETS
    src = p.add_argument_group('workload')
    src.add_argument('--preset', choices=sorted(PRESETS),
                     help='named model + device + cluster (default goyal2017 '
                          'unless --layers is given)')
    src.add_argument('--layers', metavar='FILE.json',
                     help='per-layer backward times and gradient sizes, output '
                          'layer first, or the PREFIX.json of train --timeline '
                          "(see docs/simulator.md); replaces the preset's layers")
    src.add_argument('--forward-ms', type=float,
                     metavar='MS',
                     help='forward time per step, milliseconds (default: the preset\'s '
                          "or the file's, else half the backward time)")


def _cluster_options(p):
    net = p.add_argument_group('cluster')
    net.add_argument('--gpus', metavar='K[,K...]',
                     help='worker counts, e.g. 8,16,32 (default: the preset\'s)')
    net.add_argument('--gpus-per-node', type=int, metavar='G',
                     help='GPUs per server, G (default: the preset\'s)')
    net.add_argument('--algorithm', choices=('ring', 'rhd', 'asa', 'hierarchical', 'two-level'),
                     help='allreduce: ring, recursive halving/doubling, asa (alltoall, sum, '
                          'allgather: the 16-bit MPI method), hierarchical '
                          '(intra-node reduce, rhd among servers, intra-node broadcast), or '
                          'two-level (intra-node reduce-scatter, one rhd per local rank '
                          'among servers sharing the link, intra-node allgather)')
    net.add_argument('--bandwidth-gbit', type=float, metavar='GBIT',
                     help='bandwidth between servers, Gbit/s (default: the preset\'s)')
    net.add_argument('--latency-us', type=float, metavar='US',
                     help='latency between servers per allreduce step, microseconds '
                          '(default: the preset\'s)')
    net.add_argument('--intra-bandwidth-gbit', type=float,
                     metavar='GBIT',
                     help='bandwidth inside a server (NVLink/PCIe), Gbit/s (default: the '
                          'preset\'s)')
    net.add_argument('--intra-latency-us', type=float, metavar='US',
                     help='latency inside a server per allreduce step, microseconds '
                          '(default: the preset\'s)')
    net.add_argument('--cores-per-host', type=float, metavar='C',
                     help='two-level only: the cores of a server that its G ranks share for '
                          "the exchange's CPU work (sums, copies, TCP), which then bounds "
                          'each phase from below (default: not modelled; the links alone). '
                          'Per-byte costs: --cpu-ns-per-byte, else measured on this machine')
    net.add_argument('--cpu-ns-per-byte', metavar='SUM,COPY,TCP',
                     help='two-level only: CPU nanoseconds per byte of a float32 sum, a '
                          "copy and TCP's work (both ends) between servers, e.g. "
                          '0.07,0.07,0.3 (implies the CPU model; cores: --cores-per-host, '
                          "default this machine's)")


def _exchange_options(p):
    ex = p.add_argument_group('exchange')
    ex.add_argument('--bucket-mb', type=float, metavar='MIB',
                    help='bucket cap of the overlapped exchange, MiB; 0 = one allreduce '
                         'per parameter tensor (default: the preset\'s, else %g)' % DEFAULT_BUCKET_MB)
    ex.add_argument('--overlap', dest='overlap', action='store_true', default=None,
                    help='report the overlapped exchange (default unless the preset is serial)')
    ex.add_argument('--no-overlap', dest='overlap', action='store_false',
                    help="report Theano-MPI's serial exchange: one allreduce per "
                         'tensor after backward')
    ex.add_argument('--barrier', action='store_true',
                    help='add a barrier to the serial exchange, one more collective per '
                         'step')
    ex.add_argument('--wire-dtype', choices=('float32', 'float16', 'bfloat16'),
                    default='float32',
                    help='what the gradients travel as, one of %(choices)s: 16 bits halve '
                         'the bytes of every allreduce (default %(default)s)')
    ex.add_argument('--baseline-gpus', type=int, metavar='K',
                    help='efficiency is relative to this many GPUs (default: the '
                         "preset's, else 1)")


def _output_options(p):
    out = p.add_argument_group('output')
    out.add_argument('--plot', metavar='FILE.png', type=output_path,
                     help='write a plot of the efficiency against k, overlap on and off')
    out.add_argument('--json', metavar='FILE', type=output_path,
                     help='write the results as JSON to FILE')


def parse_gpus(text):
    """``'8,16,32'`` -> ``[8, 16, 32]``; ValueError names a bad entry."""
    ks = []
    for part in text.split(','):
        part = part.strip()
        try:
            k = int(part)
        except ValueError:
            raise ValueError('--gpus: %r is not an integer' % (part,)) from None
        if k < 1:
            raise ValueError('--gpus: %d is not a positive number of GPUs' % (k,))
        ks.append(k)
    return ks


def parse_cpu_ns(text):
    """``'0.07,0.07,0.3'`` -> HostCPU's per-byte keywords in seconds; ValueError
    names a bad entry."""
    parts = [p.strip() for p in text.split(',')]
    if len(parts) != 3:
        raise ValueError('--cpu-ns-per-byte: %r is not three numbers SUM,COPY,TCP' % (text,))
    costs = []
    for name, part in zip(('SUM', 'COPY', 'TCP'), parts):
        try:
            ns = float(part)
        except ValueError:
            raise ValueError('--cpu-ns-per-byte: %s=%r is not a number' % (name, part)) from None
        if not (ns >= 0 and math.isfinite(ns)):
            raise ValueError('--cpu-ns-per-byte: %s must be a finite number >= 0, got %r'
                             % (name, part))
        costs.append(ns * 1e-9)
    return dict(zip(('sum_s_per_byte', 'copy_s_per_byte', 'tcp_s_per_byte'), costs))


def host_cpu(args, algorithm):
    """(HostCPU or None, where its per-byte costs come from) for ``--cores-per-host``
    and ``--cpu-ns-per-byte``; only the two-level allreduce models them."""
    cores, ns = getattr(args, 'cores_per_host', None), getattr(args, 'cpu_ns_per_byte', None)
    if cores is None and ns is None:
        return None, None
    if algorithm != 'two-level':
        raise ValueError('--cores-per-host and --cpu-ns-per-byte apply to --algorithm '
                         'two-level only (the algorithm here is %s)' % algorithm)
    from .host import HostCPU
    if cores is not None and not (cores > 0 and math.isfinite(cores)):
        raise ValueError('--cores-per-host must be a finite number > 0, got %r' % (cores,))
    if ns is not None:
        return HostCPU(cores, **parse_cpu_ns(ns)), 'given'
    # measured here: what the exchange's sums, copies and TCP cost on this machine
    from ..bench.hosts import local_cpu_costs
    return HostCPU(cores, **local_cpu_costs()), 'measured on this machine'


def build_config(args):
    """Resolve preset, layers file and overrides into one scenario dict."""
    from .model import load_workload
    from .network import Network
    from .presets import get_preset

    name = args.preset or (None if args.layers else 'goyal2017')
    preset = get_preset(name) if name else None
    fwd = None
    if args.forward_ms is not None:
        if not args.forward_ms >= 0:
            raise ValueError('--forward-ms must be >= 0, got %r' % (args.forward_ms,))
        fwd = args.forward_ms / 1e3
    if args.layers:
        workload = load_workload(args.layers, forward_s=fwd)
    else:
        workload = preset.workload
        if fwd is not None:
            workload = replace(workload, forward_s=fwd)

    units = _network_units(preset.network) if preset else dict(DEFAULT_NETWORK)
    for key in units:
        if getattr(args, key) is not None:
            units[key] = getattr(args, key)
    for key in ('bandwidth_gbit', 'intra_bandwidth_gbit'):
        if not units[key] > 0:
            raise ValueError('--%s must be > 0, got %r' % (key.replace('_', '-'), units[key]))
    for key in ('latency_us', 'intra_latency_us'):
        if not units[key] >= 0:
            raise ValueError('--%s must be >= 0, got %r' % (key.replace('_', '-'), units[key]))
    if units['gpus_per_node'] < 1:
        raise ValueError('--gpus-per-node must be >= 1, got %r' % (units['gpus_per_node'],))
    network = Network.from_units(**units)
    cpu, cpu_from = host_cpu(args, network.algorithm)
    if cpu is not None:
        network = replace(network, cpu=cpu)

    bucket_mb = args.bucket_mb if args.bucket_mb is not None else (
        preset.bucket_mb if preset else DEFAULT_BUCKET_MB)
    if not bucket_mb >= 0:
        raise ValueError('--bucket-mb must be >= 0, got %r' % (bucket_mb,))
    ks = parse_gpus(args.gpus) if args.gpus else list(
        preset.gpus if preset else [network.gpus_per_node * 2 ** i for i in range(6)])
    if args.baseline_gpus is not None:
        baseline = args.baseline_gpus
    elif preset and preset.baseline_gpus == preset.network.gpus_per_node:
        baseline = network.gpus_per_node       # "one server" follows --gpus-per-node
    else:
        baseline = preset.baseline_gpus if preset else 1
    if baseline < 1:
        raise ValueError('--baseline-gpus must be >= 1, got %r' % (baseline,))
    for k in ks + [baseline]:
        network.check_workers(k)
    overlap = args.overlap if args.overlap is not None else (preset.overlap if preset else True)
    return dict(preset=preset, workload=workload, network=network, bucket_mb=bucket_mb,
                ks=ks, baseline=baseline, overlap=overlap, barrier=args.barrier,
                wire_dtype=getattr(args, 'wire_dtype', 'float32'),
                report_images=preset.report_images if preset else None, cpu_from=cpu_from)


def _baseline_label(cfg):
    b, net = cfg['baseline'], cfg['network']
    if b == 1:
        return '1 GPU'
    if b == net.gpus_per_node:
        return '%d GPUs = one server' % b
    return '%d GPUs' % b


def _plural(n, word):
    return '%d %s%s' % (n, word, '' if n == 1 else 's')


def format_table(cfg, rows):
    """The human-readable report, without the final bare-efficiency line."""
    wl, net, preset = cfg['workload'], cfg['network'], cfg['preset']
    o0, s0 = rows[0]['overlap'], rows[0]['serial']
    lines = ['%s: %s%s' % (PROG, wl.name, ' [preset %s]' % preset.name if preset else '')]
    lines.append('  %d layers, %d tensors, %.1f MB of gradients; forward %.1f ms, '
                 'backward %.1f ms' % (len(wl.layers), wl.tensors, wl.grad_bytes / 1e6,
                                       wl.forward_s * 1e3, wl.backward_s * 1e3))
    u = _network_units(net)
    lines.append('  network: %(algorithm)s allreduce, %(gpus_per_node)d GPUs/node; inter-node '
                 '%(bandwidth_gbit)g Gbit/s, %(latency_us)g us; intra-node '
                 '%(intra_bandwidth_gbit)g Gbit/s, %(intra_latency_us)g us' % u)
    if net.cpu is not None:
        lines.append("  host CPU: %g cores per server for the exchange's work; per byte: sum "
                     '%.3g, copy %.3g, TCP %.3g ns (%s)' % (
                         net.cpu.cores, net.cpu.sum_s_per_byte * 1e9,
                         net.cpu.copy_s_per_byte * 1e9, net.cpu.tcp_s_per_byte * 1e9,
                         cfg.get('cpu_from') or 'given'))
    bucket = ('%s, cap %g MiB' % (_plural(len(o0.messages), 'bucket'), cfg['bucket_mb'])
              if cfg['bucket_mb'] else 'no bucketing')
    lines.append('  overlapped: %s per step (%s) during backprop, one FIFO '
                 'comm stream' % (_plural(o0.allreduces, 'allreduce'), bucket))
    lines.append('  serial (Theano-MPI): %s, one per tensor, after backprop%s'
                 % (_plural(s0.allreduces, 'allreduce'), ' + barrier' if cfg['barrier'] else ''))
    if cfg.get('wire_dtype', 'float32') != 'float32':
        lines.append('  wire: %s, half the bytes of every allreduce' % cfg['wire_dtype'])
    lines.append('  efficiency relative to %s: step(%d) / step(k), same exchange, '
                 'per-worker batch fixed' % (_baseline_label(cfg), cfg['baseline']))
    batch = wl.per_worker_batch
    lines.append('  reported (last line): %s exchange at %d GPUs'
                 % ('overlapped' if cfg['overlap'] else 'serial', max(cfg['ks'])))
    lines.append('')
    lines.append('%14s | %-38s | %-28s' % ('', 'overlapped', 'serial'))
    lines.append('%6s %7s | %9s %9s %10s %6s | %9s %9s %6s'
                 % ('GPUs', 'batch', 'step ms', 'comm ms', 'exposed ms', 'eff',
                    'step ms', 'comm ms', 'eff'))
    for r in rows:
        o, s = r['overlap'], r['serial']
        lines.append('%6d %7s | %9.1f %9.1f %10.1f %6.3f | %9.1f %9.1f %6.3f'
                     % (r['k'], r['k'] * batch if batch else '-', o.step_s * 1e3,
                        o.comm_s * 1e3, o.exposed_comm_s * 1e3, r['overlap_rel'],
                        s.step_s * 1e3, s.comm_s * 1e3, r['serial_rel']))
    n_img = cfg['report_images']
    if n_img and batch:
        mode = 'overlap' if cfg['overlap'] else 'serial'
        lines.append('')
        lines.append('seconds per %d images (%s exchange):' % (n_img, mode))
        lines.append('%6s %10s %9s %9s' % ('GPUs', 'compute', 'comm', 'total'))
        for r in rows:
            res = r[mode]
            steps = n_img / float(r['k'] * batch)
            lines.append('%6d %10.2f %9.2f %9.2f'
                         % (r['k'], (res.forward_s + res.backward_s) * steps,
                            res.exposed_comm_s * steps, res.step_s * steps))
    if preset and preset.paper_note:
        lines.append('')
        lines.append('paper: ' + preset.paper_note)
    return '\n'.join(line.rstrip() for line in lines)


def _result_dict(res, rel):
    return {'step_s': res.step_s, 'forward_s': res.forward_s, 'backward_s': res.backward_s,
            'comm_s': res.comm_s, 'exposed_comm_s': res.exposed_comm_s,
            'allreduces': res.allreduces, 'messages': len(res.messages),
            'efficiency_vs_1gpu': res.efficiency, 'efficiency': rel}


def _network_units(net):
    # Rounded so that unit round trips (us -> s -> us) print as entered.
    return {'algorithm': net.algorithm, 'gpus_per_node': net.gpus_per_node,
            'bandwidth_gbit': round(net.bandwidth * 8 / 1e9, 9),
            'latency_us': round(net.alpha * 1e6, 9),
            'intra_bandwidth_gbit': round(net.intra_bandwidth * 8 / 1e9, 9),
            'intra_latency_us': round(net.intra_alpha * 1e6, 9)}


def results_json(cfg, rows, final):
    """The ``--json`` document: inputs, one entry per k, the reported number."""
    wl, net = cfg['workload'], cfg['network']
    return {
        'preset': cfg['preset'].name if cfg['preset'] else None,
        'paper': dict(cfg['preset'].paper) if cfg['preset'] else None,
        'workload': {'name': wl.name, 'layers': len(wl.layers), 'tensors': wl.tensors,
                     'grad_bytes': wl.grad_bytes, 'forward_s': wl.forward_s,
                     'backward_s': wl.backward_s, 'per_worker_batch': wl.per_worker_batch},
        'network': _network_units(net),
        'host_cpu': None if net.cpu is None else {
            'cores': net.cpu.cores, 'sum_s_per_byte': net.cpu.sum_s_per_byte,
            'copy_s_per_byte': net.cpu.copy_s_per_byte,
            'tcp_s_per_byte': net.cpu.tcp_s_per_byte, 'from': cfg.get('cpu_from')},
        'bucket_mb': cfg['bucket_mb'],
        'baseline_gpus': cfg['baseline'],
        'mode': 'overlap' if cfg['overlap'] else 'serial',
        'rows': [{'gpus': r['k'],
                  'batch': r['k'] * wl.per_worker_batch if wl.per_worker_batch else None,
                  'overlap': _result_dict(r['overlap'], r['overlap_rel']),
                  'serial': _result_dict(r['serial'], r['serial_rel'])} for r in rows],
        'gpus': max(cfg['ks']),
        'efficiency': final,
    }


def run(cfg):
    """Simulate a resolved scenario; returns (rows, reported efficiency)."""
    from .model import scaling
    ks = sorted(set(cfg['ks']) | {cfg['baseline']})
    rows = scaling(cfg['workload'], cfg['network'], ks, cfg['bucket_mb'] * MIB,
                   cfg['baseline'], cfg['barrier'], cfg.get('wire_dtype', 'float32'))
    top = [r for r in rows if r['k'] == max(cfg['ks'])][0]
    return rows, top['overlap_rel' if cfg['overlap'] else 'serial_rel']


def main(args):
    """Entry point of ``theanompi-ext simulate``; returns the exit status."""
    try:
        cfg = build_config(args)
        rows, final = run(cfg)
    except ValueError as exc:
        print('%s: error: %s' % (PROG, exc), file=sys.stderr)
        return 2
    print(format_table(cfg, rows))
    try:
        if args.json:
            write_json(args.json, results_json(cfg, rows, final), 'the results', indent=2)
        if args.plot:
            from .plot import plot_efficiency
            plot_efficiency(rows, args.plot, title=cfg['workload'].name,
                            baseline_k=cfg['baseline'])
    except OSError as exc:
        print('%s: error: cannot write %s: %s' % (PROG, exc.filename, exc.strerror),
              file=sys.stderr)
        return 2
    print('%.3f' % final)
    return 0

