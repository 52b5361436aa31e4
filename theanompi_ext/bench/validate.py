"""``theanompi-ext bench validate``: the simulator's step times against measured ones.

For each worker count k (default 2, 4, 8) the ranks of ``bench overlap``
are started (same model, modes and emulated network), which measures the
step with no exchange (``compute``), with the serial exchanger, with the
overlapped one, and the serial exchanger's allreduces alone, with the
ranks' CPU time per wall second. The simulator
(:func:`theanompi_ext.simulate.model.step_time`) is then fed, for that k,
what was measured at that k:

* compute: from the runs' timelines, per step the slowest rank (a
  synchronous step waits for it): the overlapped run's forward and
  per-chunk backward times (the gap before a chunk counted in it), the
  serial run's forward+backward, the update;
* the trainer's bucket plan (the buckets' bytes on the comm lane);
* the CPU share of a rank (``cpu_per_wall_compute``);
* the 16-bit wire's casts, timed in this process (CPU seconds).

and, measured once at the smallest k, the CPU seconds of one allreduce
step (the serial steps' loss-statistics allreduce on the slowest rank,
times the CPU share of those steps, over its recursive-doubling steps).
The link is the ``tbf`` setting itself (rate and burst); a bucket costs
the larger of its CPU steps and its bytes through the link. The model
and this machine's figures are in docs/simulator.md.
"""
import json
import os
import sys
import tempfile

from ..cli.argtypes import output_path
from .common import add_common_options
from ..files.atomic import write_json

DEFAULT_WORKERS = '2,4,8'


def register(sub):
    """Add ``bench validate`` to the ``bench`` sub-parsers."""
    p = sub.add_parser('validate', help='simulator predictions vs measured steps at 2, 4, 8 ranks',
                       description=__doc__.split('\n\n')[0])
    p.add_argument('--workers', default=DEFAULT_WORKERS, metavar='K[,K...]',
                   help='worker counts to measure and predict, ranks (default %(default)s)')
    from ..train.options import ModelNames
    p.add_argument('--model', default='digits_cnn', choices=ModelNames(), metavar='NAME',
                   help='network of the runs, small enough for 8 ranks here, one of '
                        '%(choices)s (default %(default)s)')
    p.add_argument('--batch', type=int, default=16, metavar='N',
                   help='n, examples per rank per step (default %(default)s)')
    p.add_argument('--steps', type=int, default=4, metavar='N',
                   help='timed steps per block, iterations (default %(default)s)')
    p.add_argument('--reps', type=int, default=3, metavar='N',
                   help='repetitions of the alternating blocks (default %(default)s)')
    p.add_argument('--wire-dtype', default='float32', choices=('float32', 'float16', 'bfloat16'),
                   help='what the gradients travel as, in the runs and in the simulator, '
                        'one of %(choices)s (default %(default)s)')
    p.add_argument('--quick', action='store_true',
                   help='1 step x 1 repetition on 8x8 inputs: checks the command runs, its '
                        'figures mean nothing')
    p.add_argument('--save-runs', metavar='DIR', type=output_path,
                   help='keep the measured rows and timelines in DIR (created), for --from-runs')
    p.add_argument('--from-runs', metavar='DIR',
                   help='predict from the measurements kept by --save-runs in DIR; runs nothing')
    add_common_options(p, '200mbit', 3600.0, timeout_what='one worker count')
    p.set_defaults(func=main)


def main(args):
    """Measure every k (or read the kept measurements), predict it, print the comparison."""
    from ..launch.emulated_network import NetworkSetupError, parse_network
    from ..simulate.cli import parse_gpus
    from ..simulate.trace import bucket_bytes
    try:
        if args.from_runs:
            measured, casts, info = load_runs(args.from_runs)
            for key, value in info.items():
                setattr(args, key, value)
            net = tuple(info['network'])
            for k, (row, trace) in measured.items():     # a record without them
                if k not in casts:
                    with open(trace) as f:
                        casts[k] = wire_cast_cpu(bucket_bytes(json.load(f), trace), k,
                                                 args.wire_dtype)
        else:
            ks = sorted(set(parse_gpus(args.workers)))
            if ks[0] < 2:
                raise ValueError('--workers: every count must be >= 2 (one rank exchanges '
                                 'nothing)')
            nets = [parse_network(n) for n in (args.network or ['shm'])]
            if len(nets) != 1:
                raise ValueError('--network: give one network (the link speed is measured '
                                 'on it)')
            if args.steps < 1 or args.reps < 1 or args.batch < 1:
                raise ValueError('--steps, --reps and --batch must be >= 1')
            net = nets[0]
    except ValueError as exc:
        sys.stderr.write('theanompi-ext bench validate: error: %s\n' % exc)
        return 2
    if not args.from_runs:
        with tempfile.TemporaryDirectory(prefix='bench-validate-') as tmp:
            try:
                measured, casts = measure(ks, args, net, args.save_runs or tmp)
            except (NetworkSetupError, RuntimeError) as exc:
                sys.stderr.write('theanompi-ext bench validate: %s\n' % exc)
                return 1
            rows = predict_or_say(measured, args, net, casts)
    else:
        rows = predict_or_say(measured, args, net, casts)
    if rows is None:
        return 1
    print(format_rows(rows, args, net))
    if args.json:
        write_json(args.json, rows, 'the results', indent=1)
    return 0


def predict_or_say(measured, args, net, casts):
    """:func:`predict`, or None after saying why the measurements cannot be used."""
    try:
        return predict(measured, args.wire_dtype, network_link(net), casts)
    except (OSError, ValueError) as exc:
        sys.stderr.write('theanompi-ext bench validate: cannot predict: %s\n' % exc)
        return None


RUNS_FILE = 'runs.json'


def network_link(net):
    """The emulated link of a parsed ``--network`` (None for shared memory)."""
    from ..launch.emulated_network import tbf_link
    return tbf_link(net[1]) if net[0] == 'tbf' else None


def measure(ks, args, net, folder):
    """Run ``bench overlap``'s ranks for every k, and time the wire casts.

    Returns ``({k: (row, overlapped timeline path)}, {k: cast CPU seconds})``.
    The rows and timelines are left in ``folder`` (with ``runs.json``
    describing them, which :func:`load_runs` reads back).
    """
    from .overlap import run_setting
    from ..simulate.trace import bucket_bytes
    os.makedirs(folder, exist_ok=True)
    measured, casts = {}, {}
    tag = ''.join(c for c in ('%s:%s' % net if net[1] else net[0]) if c.isalnum())
    for k in ks:
        prefix = os.path.join(folder, 'k%d' % k)
        spec = dict(models=[args.model], input_shape=[1, 8, 8] if args.quick else [3, 32, 32],
                    batch=args.batch, steps=1 if args.quick else args.steps,
                    reps=1 if args.quick else args.reps, bucket_cap_mb=None,
                    first_bucket_cap_mb=None, thread_nice=None, thread_idle=None,
                    thread_poll_us=None, comm_thread='default', max_chunks=None,
                    timeline=prefix, wire_dtype=args.wire_dtype)
        load = [os.getloadavg()[0]]
        try:
            row = run_setting(spec, net, k, timeout=args.timeout)[0]
        except RuntimeError as exc:
            raise RuntimeError('%d ranks: %s' % (k, exc)) from None
        row['loadavg_1min'] = load + [os.getloadavg()[0]]     # before, after
        trace = '%s-%s-%s-overlap.json' % (prefix, tag, args.model)
        measured[k] = (row, trace)
        with open(trace) as f:
            casts[k] = wire_cast_cpu(bucket_bytes(json.load(f), trace), k, args.wire_dtype)
    doc = dict(model=args.model, batch=args.batch, wire_dtype=args.wire_dtype,
               network=list(net), quick=bool(args.quick),
               runs={str(k): dict(row=row, trace=os.path.basename(trace), cast_cpu_s=casts[k])
                     for k, (row, trace) in measured.items()})
    write_json(os.path.join(folder, RUNS_FILE), doc, 'the saved runs', indent=1)
    return measured, casts


def load_runs(folder):
    """Read what ``--save-runs`` kept: ``({k: (row, trace path)}, {k: cast CPU s}, settings)``.

    Raises ValueError naming the folder when it holds no (or a broken) record.
    """
    path = os.path.join(folder, RUNS_FILE)
    try:
        with open(path) as f:
            doc = json.load(f)
        measured = {int(k): (r['row'], os.path.join(folder, r['trace']))
                    for k, r in doc['runs'].items()}
        casts = {int(k): float(r['cast_cpu_s']) for k, r in doc['runs'].items()
                 if 'cast_cpu_s' in r}
        info = {key: doc[key] for key in ('model', 'batch', 'wire_dtype', 'network', 'quick')}
    except OSError as exc:
        raise ValueError('--from-runs: cannot read %r: %s' % (path, exc.strerror)) from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError('--from-runs: %r is not a record of bench validate --save-runs (%s)'
                         % (path, exc)) from None
    if not measured:
        raise ValueError('--from-runs: %r holds no runs' % (path,))
    return measured, casts, info


def link_seconds(wire_bytes, k, link, refill_s=float('inf')):
    """Seconds the emulated link adds to one step's allreduces of ``wire_bytes`` (total).

    Every rank's traffic crosses the one shaped loopback: a ring (or
    reduce-scatter + allgather) of b bytes puts 2 (k-1) b bytes through
    it. tbf lets what its bucket holds through at once and the rest at its
    rate; the bucket holds at most ``burst`` bytes and refills at the rate
    during the ``refill_s`` seconds since the last exchange (a training
    step's compute: 10 ms refill the 256 KB at 200 Mbit/s). ``link`` None
    (shared memory): 0, the copies are CPU work.
    """
    if link is None:
        return 0.0
    rate, burst = link
    return max(0.0, 2 * (k - 1) * wire_bytes - min(burst, rate * refill_s)) / rate


def block_link_seconds(wire_bytes, k, link, steps):
    """Median seconds the link adds per allreduce in a block of ``steps`` back to back.

    What ``bench overlap``'s allreduce-alone blocks see: the tbf bucket is
    full when a block starts (the modes before it computed for longer than
    it takes to refill) and hardly refills between the block's allreduces,
    so the first ones pass in the burst and the later ones at the rate.
    """
    if link is None:
        return 0.0
    import numpy as np
    rate, burst = link
    per = 2 * (k - 1) * wire_bytes
    over = [max(0.0, i * per - burst) for i in range(steps + 1)]
    return float(np.median([(over[i + 1] - over[i]) / rate for i in range(steps)]))


def wire_cast_cpu(sizes, k, wire, reps=5):
    """CPU seconds of one exchange's 16-bit wire arithmetic for buckets of ``sizes`` bytes.

    Times, on this process, what ``collective/mpi_wire.py``'s ``asa``
    method computes around its two collectives on every rank: encode the
    bucket and look for inf/nan, decode and sum the k received chunks in
    float32, encode the sum, look again, decode the result. Median of
    ``reps`` (``time.process_time``: CPU time, so outside load does not
    count), on standard-normal values: the casts cost the same at any
    magnitude (:func:`~theanompi_ext.collective.wire.float32_to_float16`),
    so this holds for real, mostly tiny, gradients. 0 for a float32 wire.
    """
    import time
    import numpy as np
    from ..collective import wire as w
    if wire == 'float32':
        return 0.0
    total = []
    for _ in range(reps):
        cpu = 0.0
        for nbytes in sizes:
            n = max(1, int(nbytes) // 4)
            x = np.random.RandomState(0).standard_normal(n).astype(np.float32)
            c0 = time.process_time()
            bits = w.encode(x, wire)
            w.nonfinite_count(bits, wire)
            mine = w.chunk_counts(n, k)[0]
            parts = np.resize(bits, k * mine).reshape(k, mine)
            w.encode(w.sum_encoded(parts, wire), wire)
            w.nonfinite_count(bits, wire)
            w.decode(bits, wire, x)
            cpu += time.process_time() - c0
        total.append(cpu)
    return float(np.median(total))


def predict(measured, wire_dtype, link=None, casts=None):
    """Predicted vs measured rows from ``{k: (bench overlap row, path of its
    overlapped run's timeline)}`` (the serial run's timeline lies beside it).

    ``link``: ``(bytes/s, burst bytes)`` of the emulated network (None: shared
    memory); ``casts``: ``{k: CPU seconds of one step's wire casts}``
    (:func:`wire_cast_cpu`; None: none). The model, with its calibration
    at the smallest k, is in docs/simulator.md.
    """
    from ..simulate.host import contended, step_cpu_seconds
    from ..simulate.model import WIRE_SCALE, step_time
    inputs = {k: measured_inputs(row, path, (casts or {}).get(k, 0.0))
              for k, (row, path) in sorted(measured.items())}
    k0 = min(inputs)
    # Calibration at k0: the loss statistics' allreduce (a few numbers) in the
    # serial steps of the slowest rank is latency alone, CPU work at the share
    # those steps ran at. (Not the buckets' allreduce-alone blocks: over the
    # shaped link they are mostly bytes, which would be booked as CPU.)
    c = inputs[k0]
    step_cpu = step_cpu_seconds(c['stats'], c['serial_share'], stats_steps(k0))
    out = []
    for k, c in sorted(inputs.items()):
        row, wire_bytes = c['row'], WIRE_SCALE[wire_dtype] * sum(c['sizes'])
        alpha = contended(step_cpu, c['share'])
        link_s = link_seconds(wire_bytes, k, link, refill_s=c['serial'].compute_s)
        net = _host_network(wire_dtype, k, alpha, link_s, wire_bytes)
        cast_per_byte = contended(c['cast'], c['share']) / sum(c['sizes'])
        for mode, overlap in (('serial', False), ('overlap', True)):
            res = step_time(c[mode], net, k, overlap=overlap, wire_dtype=wire_dtype,
                            buckets=c['sizes'], cast_s_per_byte=cast_per_byte,
                            sync_s=stats_steps(k) * alpha, sync_queued=True, shared_link=True)
            pred = res.step_s + c['update']
            meas = row['%s_s' % mode]
            out.append({'workers': k, 'mode': mode, 'measured_s': meas, 'predicted_s': pred,
                        'error': pred / meas - 1.0,
                        'measured_efficiency': row['compute_s'] / meas,
                        'predicted_efficiency': row['compute_s'] / pred,
                        'cpu_share': c['share'], 'step_cpu_s': step_cpu,
                        'step_latency_s': alpha, 'cast_s': cast_per_byte * sum(c['sizes']),
                        'link_s': link_s, 'allreduce_measured_s': row['allreduce_s'],
                        'allreduce_predicted_s': _alone(res.messages, c, wire_dtype, k, alpha,
                                                        link, cast_per_byte, wire_bytes),
                        'buckets': len(c['sizes']), 'calibrated_at': k0})
    return out


def _host_network(wire_dtype, k, alpha, link_s, wire_bytes):
    """The simulator's network for k ranks on this host: latency ``alpha`` per
    step, and a bandwidth that gives ``wire_bytes`` the ``link_s`` seconds."""
    from ..simulate.network import Network
    algorithm = 'ring' if wire_dtype == 'float32' else 'asa'
    # both algorithms move 2 (k-1)/k b bytes per rank: that over bw is link_s
    bw = 2.0 * (k - 1) / k * wire_bytes / link_s if link_s > 0 else 1e30
    return Network(algorithm=algorithm, alpha=alpha, bandwidth=bw, intra_alpha=alpha,
                   intra_bandwidth=bw, gpus_per_node=1)


def _alone(messages, c, wire_dtype, k, alpha, link, cast_per_byte, wire_bytes):
    """Predicted seconds of one step's bucket allreduces (``wire_bytes`` on the wire
    in all) in the allreduce-alone blocks."""
    from ..simulate.model import WIRE_SCALE
    net = _host_network(wire_dtype, k, alpha,
                        block_link_seconds(wire_bytes, k, link, int(c['row'].get('steps', 1))),
                        wire_bytes)
    return sum(m.cost(net, k, WIRE_SCALE[wire_dtype], cast_per_byte, shared_link=True)
               for m in messages)


def measured_inputs(row, path, cast_cpu):
    """What the simulator is fed for one k: the row, both modes' workloads (the
    slowest rank's, from the timelines at ``path`` and beside it), the bucket
    plan, the update and loss-statistics times, the CPU shares (computing, and
    in the serial steps) and the casts' CPU seconds."""
    from ..simulate.model import Layer, Workload
    from ..simulate.trace import SLOWEST, bucket_bytes, layers_from_trace, piece_seconds
    with open(path) as f:
        over = json.load(f)
    with open(path.replace('-overlap.json', '-serial.json')) as f:
        ser = json.load(f)
    wl = load_workload_doc(layers_from_trace(over, source=path, rank=SLOWEST, gaps=True), path)
    fb = piece_seconds(ser, 'forward_backward', source=path, rank=SLOWEST)
    return dict(row=row, overlap=wl,
                serial=Workload([Layer('forward_backward', fb, wl.grad_bytes, wl.tensors)], 0.0),
                sizes=bucket_bytes(over, source=path),
                update=piece_seconds(over, 'update', source=path, rank=SLOWEST),
                stats=piece_seconds(ser, 'stats', source=path, rank=SLOWEST),
                share=min(1.0, row['cpu_per_wall_compute']),
                serial_share=min(1.0, row['cpu_per_wall_serial']), cast=cast_cpu)


def stats_steps(k):
    """Latency steps of the loss statistics' allreduce (a few numbers) among k ranks.

    MPICH reduces messages under 2 KB by recursive doubling: ceil(log2 k)
    exchanges (a non-power of two adds one to fold the extra ranks in).
    """
    pof2 = 1 << (k.bit_length() - 1)
    return (pof2.bit_length() - 1) + (2 if pof2 != k else 0)


def load_workload_doc(doc, source):
    """A :class:`~theanompi_ext.simulate.model.Workload` of a layers object."""
    from ..simulate.model import Workload, parse_layers
    return Workload(parse_layers(doc['layers'], source=source), doc.get('forward_s', 0.0),
                    name=doc['name'])


def format_rows(rows, args, net):
    """The side-by-side table."""
    r0 = rows[0]
    lines = ['bench validate: %s, batch %d/rank, %s wire, network %s; calibrated at %d ranks: '
             '%.3f ms CPU per allreduce step' % (args.model, args.batch, args.wire_dtype,
                                                 net[0] if net[1] is None else '%s:%s' % net,
                                                 r0['calibrated_at'], 1e3 * r0['step_cpu_s']),
             '%5s %-8s %12s %12s %8s %9s %9s %6s %8s %8s' % (
                 'ranks', 'mode', 'measured ms', 'predicted ms', 'error', 'eff meas', 'eff pred',
                 'share', 'ar meas', 'ar pred')]
    for r in rows:
        lines.append('%5d %-8s %12.1f %12.1f %7.1f%% %9.3f %9.3f %6.3f %8.1f %8.1f' % (
            r['workers'], r['mode'], 1e3 * r['measured_s'], 1e3 * r['predicted_s'],
            100 * r['error'], r['measured_efficiency'], r['predicted_efficiency'],
            r['cpu_share'], 1e3 * r['allreduce_measured_s'], 1e3 * r['allreduce_predicted_s']))
    worst = max(abs(r['error']) for r in rows)
    lines.append('largest error %.1f%% (target: within 10%% on every point); share: CPU per '
                 'wall second of a computing rank; ar: the buckets\' allreduces alone'
                 % (100 * worst))
    return '\n'.join(lines)
