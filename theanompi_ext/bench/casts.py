"""``theanompi-ext bench casts``: the 16-bit wire's casts, ours against numpy's.

Times, in one process (no MPI), the casts a 16-bit wire runs on every
bucket (:mod:`theanompi_ext.collective.wire`): ``encode`` (float32 to the
wire's bits, on the training thread between backward chunks) and
``decode`` (back, on the waiting thread; the ``asa`` sum decodes too), for
values of several magnitudes. Gradients are small: most entries of a
ResNet-20 bucket are below float16's smallest normal (6.1e-5), where
numpy's own float32 -> float16 cast sets the floating-point underflow
status once per value and is ~25 times slower than on values near 1.
Each figure is the median over ``--reps`` timed calls, in ns per element;
the numpy column is its ``astype`` (float16 only: numpy has no bfloat16).
"""
import sys
import time

import numpy as np

from ..cli.argtypes import output_path
from ..files.atomic import write_json
from ..errors import EXIT_BAD_INPUT, EXIT_OK

DEFAULT_SCALES = '1,1e-3,1e-5,1e-7'


def register(sub):
    """Add ``bench casts`` to the ``bench`` sub-parsers."""
    p = sub.add_parser('casts', help="the 16-bit wire's casts against numpy's, by magnitude",
                       description=__doc__.split('\n\n')[0])
    p.add_argument('--elements', type=int, default=36864, metavar='N',
                   help='elements of the timed bucket (default %(default)s: the largest '
                        'ResNet-20 bucket)')
    p.add_argument('--scales', default=DEFAULT_SCALES, metavar='LIST',
                   help='comma-separated standard deviations of the normal values cast '
                        '(default %(default)s)')
    p.add_argument('--reps', type=int, default=50, metavar='N',
                   help='timed calls of each cast (default %(default)s)')
    p.add_argument('--json', default='', metavar='FILE', type=output_path,
                   help='write the results to FILE')
    p.set_defaults(func=main)


def parse_scales(text):
    """The list of ``--scales`` (ValueError naming a bad value)."""
    out = []
    for item in str(text).split(','):
        try:
            v = float(item)
        except ValueError:
            v = float('nan')
        if not (v > 0 and np.isfinite(v)):
            raise ValueError('--scales: %r is not a positive number' % item.strip())
        out.append(v)
    return out


def median_ns(fn, n, reps):
    """Median over ``reps`` calls of ``fn()``, in ns per element of ``n``."""
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e9 * float(np.median(times)) / n


def measure(n, scales, reps, seed=0):
    """One row per (wire, scale): median ns per element of each cast."""
    from ..collective.wire import decode, encode
    rng = np.random.RandomState(seed)
    base = rng.standard_normal(n).astype(np.float32)
    rows = []
    for wire in ('float16', 'bfloat16'):
        for scale in scales:
            x = base * np.float32(scale)
            w = encode(x, wire)
            row = dict(wire=wire, scale=scale, elements=n,
                       encode_ns=median_ns(lambda: encode(x, wire, w), n, reps),
                       decode_ns=median_ns(lambda: decode(w, wire), n, reps),
                       numpy_encode_ns=None, numpy_decode_ns=None)
            if wire == 'float16':
                half = w.view(np.float16)
                with np.errstate(all='ignore'):
                    row['numpy_encode_ns'] = median_ns(lambda: x.astype(np.float16), n, reps)
                row['numpy_decode_ns'] = median_ns(lambda: half.astype(np.float32), n, reps)
            rows.append(row)
    return rows


def format_table(rows):
    """The rows as a table; the last column: numpy's encode time over ours (float16)."""
    def cell(v):
        return '%10s' % ('n/a' if v is None else '%.2f' % v)
    lines = ['%-9s %8s %10s %10s %10s %10s %11s' % ('wire', 'scale', 'encode', 'numpy enc',
                                                 'decode', 'numpy dec', 'numpy/ours')]
    for r in rows:
        ratio = (r['numpy_encode_ns'] / r['encode_ns']) if r['numpy_encode_ns'] else None
        lines.append('%-9s %8.0e %s %s %s %s %11s' % (
            r['wire'], r['scale'], cell(r['encode_ns']), cell(r['numpy_encode_ns']),
            cell(r['decode_ns']), cell(r['numpy_decode_ns']),
            'n/a' if ratio is None else 'x%.1f' % ratio))
    return '\n'.join(['ns per element, median of each cast on %d elements' % rows[0]['elements']]
                     + lines)


def main(args):
    """Measure, print the table, write --json."""
    try:
        scales = parse_scales(args.scales)
        if args.elements < 1 or args.reps < 1:
            raise ValueError('--elements and --reps must be >= 1')
    except ValueError as exc:
        sys.stderr.write('theanompi-ext bench casts: error: %s\n' % exc)
        return EXIT_BAD_INPUT
    rows = measure(args.elements, scales, args.reps)
    print(format_table(rows))
    if args.json:
        write_json(args.json, dict(benchmark='casts', rows=rows))
    return EXIT_OK
