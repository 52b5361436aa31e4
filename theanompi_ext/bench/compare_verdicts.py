"""The verdicts of ``bench compare``: its targets judged, and the table that shows them."""
import numpy as np

from .compare_stats import MIN_COST
from .compare_systems import SYSTEMS, WIRE_SUFFIX

# The issue's targets: our 16-bit exchange at most this fraction of float32's
# time; our overlapped step at most this much over max(compute, communication).
WIRE_RATIO_TARGET = 0.55
BOUND_TARGET = 0.05


def targets(rows):
    """The targets of one setting, as text lines (None when there is nothing to judge).

    Against each DDP system of the same wire (ours float32 against DDP without
    a hook, our 16-bit systems against DDP with its fp16 hook): a communication
    overhead no larger than DDP's and a hidden fraction no smaller; for a
    16-bit system the hidden fraction must be above DDP's by more than the
    combined standard error. Then per 16-bit wire the exchange time ratio
    (:func:`.compare_stats.wire_ratio`, target :data:`WIRE_RATIO_TARGET` or less) and per
    overlapped system the step's excess over max(compute, communication)
    (:func:`.compare_stats.bound_excess`, target :data:`BOUND_TARGET` or less). A difference
    smaller than the combined standard error is called "within noise".
    """
    ours = [r for r in rows if r['system'] in
            [SYSTEMS[0] + WIRE_SUFFIX[w] for w in WIRE_SUFFIX]]
    lines = []
    for o in ours:
        wire = o.get('wire_dtype', 'float32')
        lines += [_target(o, r, strict=wire != 'float32') for r in rows
                  if r['system'].startswith(SYSTEMS[2])
                  and (r.get('wire_dtype', 'float32') == 'float32') == (wire == 'float32')]
    lines += [_ratio_target(o) for o in ours if 'wire_time_ratio' in o]
    lines += [_bound_target(o) for o in ours if 'bound_excess' in o]
    return '\n'.join(lines) or None


def _verdict(ok, diff, err, shown):
    """'met' or 'NOT met', with ' (within noise, +-SHOWN)' when |diff| < err
    (``shown``: the error as printed)."""
    text = 'met' if ok else 'NOT met'
    return text + (' (within noise, +-%s)' % shown if abs(diff) < err else '')


def _ratio_target(row):
    r, e = row['wire_time_ratio'], row['wire_time_ratio_err']
    return 'target %s exchange time / float32: x%.3f +- %.3f (x%.2f or less): %s' % (
        row['wire_dtype'], r, e, WIRE_RATIO_TARGET,
        _verdict(r <= WIRE_RATIO_TARGET, r - WIRE_RATIO_TARGET, e, '%.3f' % e))


def _bound_target(row):
    b, e = row['bound_excess'], row['bound_excess_err']
    return ('target %s: step over max(compute, allreduce) %+.1f%% +- %.1f%% (%.0f%% or '
            'less): %s' % (row['system'], 100 * b, 100 * e, 100 * BOUND_TARGET,
                           _verdict(b <= BOUND_TARGET, b - BOUND_TARGET, e,
                                    '%.1f%%' % (100 * e))))


def _target(ours, ddp, strict=False):
    """Overhead and hidden fraction of ``ours`` against ``ddp``; ``strict``: the
    hidden fraction is met only when above DDP's by more than the combined error."""
    d = ddp['comm_overhead'] - ours['comm_overhead']
    err = float(np.hypot(ours['comm_overhead_err'], ddp['comm_overhead_err']))
    oh = _verdict(d >= 0, d, err, '%.1f%%' % (100 * err))
    a, b = ours['hidden_fraction'], ddp['hidden_fraction']
    if a is None or b is None:
        hf = 'n/a (an exchange cost within noise)'
    else:
        herr = float(np.hypot(ours.get('hidden_fraction_err') or 0.0,
                              ddp.get('hidden_fraction_err') or 0.0))
        hf = _verdict(a - b > herr if strict else a >= b, a - b, herr, '%.2f' % herr)
    # float32 keeps its line as before; a 16-bit system says which it is
    who = '' if ours['system'] == SYSTEMS[0] else ' of %s' % ours['system']
    return ('targets%s vs %s: overhead %+.1f%% vs %+.1f%%: %s; hidden fraction %s vs %s: %s'
            % (who, ddp['system'], 100 * ours['comm_overhead'],
               100 * ddp['comm_overhead'], oh, _fmt_frac(a, ours.get('hidden_fraction_err')),
               _fmt_frac(b, ddp.get('hidden_fraction_err')), hf))


def _fmt_frac(v, err=None):
    if v is None:
        return 'n/a'
    return '%.2f' % v if err is None else '%.2f +- %.2f' % (v, err)


def format_table(rows):
    """One line per system: times in ms, the step over max(compute, allreduce), overhead
    in % and hidden fraction (each +- its standard error), the hidden fraction of each
    launch; then the targets and the load around the measurement."""
    if not rows:
        return '(no results)'
    r0 = rows[0]
    # which allreduce ours ran (rows written before it was recorded: none said)
    topology = next((r['topology'] for r in rows if r.get('topology')), None)
    lines = ['%s on %s: %s ranks x batch %s, %s compute thread(s) per rank, %.2f MB of gradients%s'
             % (r0['model'], r0['network'], r0.get('ranks'), r0.get('batch'), r0.get('threads'),
                r0.get('grad_bytes', 0) / 1e6,
                ', our allreduce %s' % topology if topology else ''),
             '%-30s %10s %10s %10s %10s %10s %11s %15s %13s %s' % (
                 'system', 'compute ms', 'step ms', 'serial ms', 'allred ms', 'vs bound',
                 'cpu/wall', 'overhead', 'hidden', 'per launch')]
    for r in rows:
        over = ('%+9.1f%%' % (100 * r['bound_excess'])) if 'bound_excess' in r else ''
        cpu = r.get('cpu_per_wall') or {}
        cpu = '%.2f (%.2f)' % (cpu['step'], cpu['compute']) if cpu else ''
        lines.append('%-30s %10.1f %10.1f %10.1f %10.1f %10s %11s %7.1f%% +-%4.1f %13s %s' % (
            r['system'], 1e3 * r['compute_s'], 1e3 * r['step_s'], 1e3 * r['serial_s'],
            1e3 * r.get('allreduce_s', float('nan')), over, cpu, 100 * r['comm_overhead'],
            100 * r.get('comm_overhead_err', float('nan')),
            _fmt_frac(r['hidden_fraction'], r.get('hidden_fraction_err')),
            ' '.join(_fmt_frac(v) for v in r.get('hidden_fraction_launches') or [])))
    verdict = targets(rows)
    if verdict:
        lines.append(verdict)
    if 'load_before' in r0:
        lines.append('(%s launches x %s blocks x %s steps per mode; vs bound: step / '
                     'max(compute, allreduce) - 1; cpu/wall: process CPU / wall time of the '
                     'step (of compute), median over ranks; hidden fraction only where the exchange '
                     'costs over %.0f%% of compute; load average %.2f before, %.2f after: '
                     'the machine is shared)' % (
                         r0.get('launches'), r0.get('reps'), r0.get('steps'), 100 * MIN_COST,
                         r0['load_before'], r0['load_after']))
    return '\n'.join(lines)


__all__ = ['BOUND_TARGET', 'WIRE_RATIO_TARGET', 'format_table', 'targets']
