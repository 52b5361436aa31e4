"""``theanompi-ext bench validate``: the simulator's step times against measured ones.

For each worker count k (default 2, 4, 8) the ranks of ``bench overlap``
are started (same model, modes and emulated network), which measures the
step with no exchange (``compute``), with the serial exchanger, with the
overlapped one, and the serial exchanger's allreduces alone. The
simulator (:func:`theanompi_ext.simulate.model.step_time`) is then fed,
for that k:

* the per-chunk backward times and gradient bytes of the overlapped run's
  timeline (:func:`theanompi_ext.simulate.trace.layers_from_trace`), and
  its forward time; the rest of the measured compute step (update, copies)
  is added to the prediction as measured;
* the link speed measured once, at the smallest k, from the allreduce-only
  time. The emulated network is one rate-limited loopback that every rank's
  traffic shares, so a ring allreduce of b bytes puts 2 (k-1) b bytes
  through it: rate R = 2 (k0-1) B / t_allreduce(k0), and the simulator gets
  per-link bandwidth R / k with no separate latency term (a single message
  size cannot tell latency from bandwidth: both are folded into R);
* the wire dtype (``--wire-dtype``): the measured runs send it, the
  simulator halves the bytes for 16 bits.

Printed: per k and mode, measured and predicted step time, the error, and
measured and predicted efficiency (compute / step at the same k). The
bar (within 10%) and this machine's figures are in docs/simulator.md.
"""
import json
import os
import sys
import tempfile

from .common import add_common_options

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
    add_common_options(p, '200mbit', 3600.0, timeout_what='one worker count')
    p.set_defaults(func=main)


def main(args):
    """Measure every k, predict it, print the comparison."""
    from .overlap import NetworkSetupError, parse_network, run_setting
    from ..simulate.cli import parse_gpus
    try:
        ks = sorted(set(parse_gpus(args.workers)))
        if ks[0] < 2:
            raise ValueError('--workers: every count must be >= 2 (one rank exchanges nothing)')
        nets = [parse_network(n) for n in (args.network or ['shm'])]
        if len(nets) != 1:
            raise ValueError('--network: give one network (the link speed is measured on it)')
        if args.steps < 1 or args.reps < 1 or args.batch < 1:
            raise ValueError('--steps, --reps and --batch must be >= 1')
    except ValueError as exc:
        sys.stderr.write('theanompi-ext bench validate: error: %s\n' % exc)
        return 2
    net = nets[0]
    measured = {}
    with tempfile.TemporaryDirectory(prefix='bench-validate-') as tmp:
        for k in ks:
            prefix = os.path.join(tmp, 'k%d' % k)
            spec = dict(models=[args.model], input_shape=[1, 8, 8] if args.quick else [3, 32, 32],
                        batch=args.batch, steps=1 if args.quick else args.steps,
                        reps=1 if args.quick else args.reps, bucket_cap_mb=None,
                        first_bucket_cap_mb=None, thread_nice=None, thread_idle=None,
                        thread_poll_us=None, comm_thread='default', max_chunks=None,
                        timeline=prefix, wire_dtype=args.wire_dtype)
            try:
                row = run_setting(spec, net, k, timeout=args.timeout)[0]
            except (NetworkSetupError, RuntimeError) as exc:
                sys.stderr.write('theanompi-ext bench validate: %d ranks: %s\n' % (k, exc))
                return 1
            tag = ''.join(c for c in ('%s:%s' % net if net[1] else net[0]) if c.isalnum())
            measured[k] = (row, '%s-%s-%s-overlap.json' % (prefix, tag, args.model))
        rows = predict(measured, args.wire_dtype, shared_link=net[0] == 'tbf')
    print(format_rows(rows, args, net))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(rows, f, indent=1)
    return 0


def link_rate(row, k, wire_dtype, shared_link=True):
    """Bytes/s of the link, from one measured allreduce-only time (see module doc).

    ``shared_link``: every rank's traffic crosses one link (the emulated
    network): the rate of the whole link. Otherwise (shared memory) the
    per-rank ring bandwidth 2 (k-1)/k B / t.
    """
    from ..simulate.model import WIRE_SCALE
    wire_bytes = WIRE_SCALE[wire_dtype] * row['grad_bytes']
    moved = 2 * (k - 1) * wire_bytes if shared_link else 2.0 * (k - 1) / k * wire_bytes
    return moved / row['allreduce_s']


def predict(measured, wire_dtype, shared_link=True):
    """Predicted vs measured rows from ``{k: (bench overlap row, path of its
    overlapped run's timeline)}``."""
    from ..simulate.model import load_workload, step_time
    from ..simulate.network import Network
    k0 = min(measured)
    rate = link_rate(measured[k0][0], k0, wire_dtype, shared_link)
    out = []
    for k, (row, trace) in sorted(measured.items()):
        workload = load_workload(trace)
        bw = rate / k if shared_link else rate
        network = Network(algorithm='ring', alpha=0.0, bandwidth=bw, intra_alpha=0.0,
                          intra_bandwidth=bw, gpus_per_node=1)
        # what the compute step does beyond forward and backward (update, copies)
        other = max(0.0, row['compute_s'] - workload.forward_s - workload.backward_s)
        cap = row['bucket_cap_mb'] * 2 ** 20     # buckets/plan.py's MB; its smaller first bucket is not modelled
        for mode, overlap in (('serial', False), ('overlap', True)):
            res = step_time(workload, network, k, overlap=overlap, bucket_cap_bytes=cap,
                            wire_dtype=wire_dtype)
            pred = res.step_s + other
            meas = row['%s_s' % mode]
            out.append({'workers': k, 'mode': mode, 'measured_s': meas, 'predicted_s': pred,
                        'error': pred / meas - 1.0,
                        'measured_efficiency': row['compute_s'] / meas,
                        'predicted_efficiency': (res.forward_s + res.backward_s + other) / pred,
                        'link_bytes_per_s': rate, 'calibrated_at': k0})
    return out


def format_rows(rows, args, net):
    """The side-by-side table."""
    lines = ['bench validate: %s, batch %d/rank, %s wire, network %s; link %.1f Mbit/s '
             'measured at %d ranks' % (args.model, args.batch, args.wire_dtype,
                                       net[0] if net[1] is None else '%s:%s' % net,
                                       rows[0]['link_bytes_per_s'] * 8 / 1e6,
                                       rows[0]['calibrated_at']),
             '%5s %-8s %12s %12s %8s %9s %9s' % ('ranks', 'mode', 'measured ms', 'predicted ms',
                                                 'error', 'eff meas', 'eff pred')]
    for r in rows:
        lines.append('%5d %-8s %12.1f %12.1f %7.1f%% %9.3f %9.3f' % (
            r['workers'], r['mode'], 1e3 * r['measured_s'], 1e3 * r['predicted_s'],
            100 * r['error'], r['measured_efficiency'], r['predicted_efficiency']))
    worst = max(abs(r['error']) for r in rows)
    lines.append('largest error %.1f%% (target: within 10%% on every point)' % (100 * worst))
    return '\n'.join(lines)
