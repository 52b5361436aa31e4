"""``theanompi-ext bench compare``: this project's exchangers against PyTorch DDP.

The same network (the CIFAR ResNet-20 or its 4x wide variant, see
:mod:`.ddp_worker` for the PyTorch twin), the same synthetic batch of 32
(3, 32, 32) images per rank, the same 2 ranks on this machine, one compute
thread per rank, three systems:

``theanompi_ext/ar-overlap``  our trainer, ``exch_strategy='ar-overlap'``
                              (chunked backward, bucket allreduces started
                              during backprop on the MPI backend's thread)
``theanompi_ext/ar``          our trainer, ``exch_strategy='ar'`` (one
                              compiled backward, then the buckets)
``pytorch/ddp-gloo``          ``DistributedDataParallel`` on gloo, default
                              buckets (25 MB, first 1 MB); skipped with a
                              message when PyTorch is not installed

With ``--wire-dtype float32,float16`` (a list) our two systems are
measured per wire dtype in the same job, 16-bit ones named with a suffix
(``theanompi_ext/ar-overlap-fp16``, ``theanompi_ext/ar-fp16``; ``-bf16``);
their modes join the same rotation and share its compute step, and the
serial step of a 16-bit system is the ``ar`` exchanger with that wire.
``--ddp-fp16-hook`` adds DDP with ``fp16_compress_hook`` per bucket cap
(``pytorch/ddp-gloo-fp16``, ``pytorch/ddp-gloo-0.1mb-fp16``; see
:mod:`.ddp_worker`). Every row says its ``wire_dtype``.

Both trainers exchange every gradient, batch-norm gamma/beta included
(``exchange_bn=True``), so the two projects move the same bytes; BN running
statistics stay per rank on both sides (DDP ``broadcast_buffers=False``).

Per system three step times are measured (a step ends when its slower
rank ends; the modes alternate step by step):

* ``compute_s``: forward + backward + update with no communication at all
  (ours: the monolithic backward without any exchange; DDP: inside
  ``no_sync()``);
* ``serial_s``: the same plus the whole gradient summed after the backward
  pass (ours: the ``ar`` step; DDP: one flat gloo ``all_reduce``);
* ``step_s``: the system's real step.

and from them ``comm_overhead = step / compute - 1`` and
``hidden_fraction = (serial - step) / (serial - compute)``: the share of the
non-overlapped exchange's cost that the system's step does not pay (0 for a
serial exchanger; ``null`` when that cost is under 1% of the compute step or
under twice its standard error, where the ratio is noise). Both are
estimated from the modes' back-to-back steps (see :func:`make_row`). The
definitions are the same for both projects; figures come with standard
errors and the per-step times (``times_s``, with ``allreduce``: the
system's whole exchange alone). Our overlapped systems also get
``bound_excess`` (:func:`bound_excess`) and 16-bit ones
``wire_time_ratio`` (:func:`wire_ratio`); :func:`targets` judges them.
``docs/performance.md`` has the figures.

Alternation: each (network, model) setting launches ``--launches`` pairs of
jobs, ours then DDP, then DDP then ours, ...; inside a job the modes run in
blocks of ``--steps`` steps in a rotating order, ``--reps`` times. Medians
are over every measured step of every job.

Networks: ``shm`` (this machine: MPI over shared memory, gloo over TCP on
the loopback) and ``tbf:RATE`` (both in a network namespace whose loopback
is rate-limited, MPI forced onto TCP; needs root, see :mod:`.overlap`).
"""
import json
import os
import socket
import sys

import numpy as np

from ..buckets.plan import DEFAULT_CAP_MB, DEFAULT_FIRST_CAP_MB
from ..errors import EXIT_BAD_INPUT, EXIT_CHECK_FAILED, EXIT_OK
from .common import add_common_options, rank_main
from .timing import time_modes
from ..files.atomic import write_json

SYSTEMS = ('theanompi_ext/ar-overlap', 'theanompi_ext/ar', 'pytorch/ddp-gloo')
# Our modes without an exchange (shared by every wire), and those with one
# (named mode + WIRE_SUFFIX[wire], one set per --wire-dtype).
COMPUTE_MODES = ('compute', 'compute_chunked')
EXCHANGE_MODES = ('serial', 'overlap', 'allreduce')
OURS_MODES = COMPUTE_MODES + EXCHANGE_MODES
WIRE_SUFFIX = {'float32': '', 'float16': '-fp16', 'bfloat16': '-bf16'}
# DDP communication hooks measured by --ddp-fp16-hook: name -> the wire it sends.
DDP_HOOK_WIRE = {'none': 'float32', 'fp16': 'float16'}
JSON_KEYS = ('system', 'model', 'network', 'compute_s', 'step_s', 'comm_overhead',
             'hidden_fraction', 'wire_dtype')
# The issue's targets: our 16-bit exchange at most this fraction of float32's
# time; our overlapped step at most this much over max(compute, communication).
WIRE_RATIO_TARGET = 0.55
BOUND_TARGET = 0.05
# The architectures both sides build: ours with model.resnet.cifar_resnet
# (the same call as the zoo's resnet20 / resnet20_wide) or the zoo's
# digits_cnn, PyTorch with ddp_worker.build_model.
MODEL_SPECS = {
    'resnet20': dict(kind='cifar_resnet', depth=20, width=16, input_shape=[3, 32, 32]),
    'resnet20_wide': dict(kind='cifar_resnet', depth=20, width=64, input_shape=[3, 32, 32]),
    # --quick: the test suite's model; a ResNet compiles 3x longer in Theano.
    'digits_cnn': dict(kind='digits_cnn', width=16, input_shape=[1, 8, 8]),
}
DEFAULT_MODELS = ('resnet20', 'resnet20_wide')


# -- the command ---------------------------------------------------------------------

def register(sub):
    """Add ``bench compare`` to the ``bench`` sub-parsers."""
    p = sub.add_parser('compare', help='our exchangers vs PyTorch DDP, same model and ranks',
                       description=__doc__.split('\n\n')[0])
    p.add_argument('--models', default=','.join(DEFAULT_MODELS), metavar='LIST',
                   help='comma-separated, from %s (default %%(default)s)'
                        % ', '.join(sorted(MODEL_SPECS)))
    p.add_argument('--ranks', type=int, default=2, metavar='K',
                   help='k, the MPI ranks to start (default 2)')
    p.add_argument('--batch', type=int, default=32, metavar='N',
                   help='n, examples per rank per step (default 32)')
    p.add_argument('--threads', type=int, default=1, metavar='N',
                   help='compute threads per rank, both projects (default 1)')
    # One step per block: the modes interleave as finely as possible, so a
    # burst of outside load on a shared machine hits every mode alike.
    p.add_argument('--steps', type=int, default=1, metavar='N',
                   help='timed steps per block, iterations (default 1)')
    p.add_argument('--reps', type=int, default=12, metavar='N',
                   help='alternating blocks per mode in one job (default 12)')
    p.add_argument('--warmup', type=int, default=2, metavar='N',
                   help='untimed steps per mode before the timed ones (default 2)')
    p.add_argument('--launches', type=int, default=2, metavar='N',
                   help='jobs per system and setting, alternating ours/DDP (default 2)')
    p.add_argument('--ddp-bucket-cap-mb', default='25', metavar='LIST',
                   help="DDP's bucket_cap_mb; a comma-separated list measures one DDP "
                        "system per value (default 25, DDP's own default; ours is %g, "
                        "first %g)" % (DEFAULT_CAP_MB, DEFAULT_FIRST_CAP_MB))
    p.add_argument('--wire-dtype', default='float32', metavar='LIST',
                   help='comma-separated wire dtypes of our gradient buckets, from %s; one '
                        'pair of our systems per value, 16-bit ones named with a suffix '
                        '(-fp16, -bf16) (default %%(default)s)' % ', '.join(WIRE_SUFFIX))
    p.add_argument('--ddp-fp16-hook', action='store_true',
                   help="also measure DDP with its fp16_compress_hook (gradients sent as "
                        "float16), one system per --ddp-bucket-cap-mb value, suffix -fp16")
    p.add_argument('--no-ddp', action='store_true',
                   help='measure only this project, not PyTorch DDP')
    p.add_argument('--quick', action='store_true',
                   help='tiny model (digits_cnn on 8x8 inputs, batch 8), 1 job, few steps')
    add_common_options(p, '1gbit', 3600.0, json_help='write one object per system and setting to FILE', timeout_what='one job')
    p.set_defaults(func=main)


def main(args):
    """Run every (network, model) setting, print the tables, write --json."""
    from ..launch import in_mpi_job
    from .overlap import parse_network, format_network, NetworkSetupError
    from .ddp_worker import torch_problem
    say = sys.stderr.write
    if in_mpi_job():
        say('theanompi-ext bench compare: error: run it outside mpiexec; it starts its '
            'own jobs (ours and DDP)\n')
        return EXIT_BAD_INPUT
    try:
        spec = make_spec(args)
        networks = [parse_network(n) for n in (args.network or ['shm'])]
    except ValueError as exc:
        say('theanompi-ext bench compare: error: %s\n' % exc)
        return EXIT_BAD_INPUT
    ddp = not args.no_ddp
    if ddp and torch_problem():
        say('theanompi-ext bench compare: %s; skipping PyTorch DDP\n' % torch_problem())
        ddp = False
    rows, status = [], EXIT_OK
    for net in networks:
        for model in spec['models']:
            try:
                got = run_setting(spec, model, net, args.ranks, ddp, args.timeout)
            except NetworkSetupError as exc:
                say('theanompi-ext bench compare: network %s cannot be emulated here (%s): '
                    'SKIPPED\n' % (format_network(net), exc))
                break
            except RuntimeError as exc:
                say('theanompi-ext bench compare: %s, %s: %s\n'
                    % (format_network(net), model, exc))
                status = EXIT_CHECK_FAILED
                continue
            rows.extend(got)
            print(format_table(got))
            sys.stdout.flush()
            if args.json:   # after every setting: a long run keeps what it measured
                write_json(args.json, rows, 'the results', indent=1)
    if args.json and not rows:
        write_json(args.json, rows, 'the results')
    return status


def make_spec(args):
    """The settings every job gets (a JSON-able dict)."""
    if args.ranks < 2:
        raise ValueError('--ranks must be >= 2 (nothing to exchange with one rank)')
    for name in ('batch', 'threads', 'steps', 'reps', 'launches'):
        if getattr(args, name) < 1:
            raise ValueError('--%s must be >= 1' % name)
    try:
        caps = [float(c) for c in str(args.ddp_bucket_cap_mb).split(',') if c]
    except ValueError:
        caps = []
    if args.warmup < 0 or not caps or min(caps) <= 0:
        raise ValueError('--warmup must be >= 0 and --ddp-bucket-cap-mb a list of sizes > 0')
    wires = parse_wire_dtypes(args.wire_dtype)
    quick = bool(args.quick)
    models = ['digits_cnn'] if quick and args.models == ','.join(DEFAULT_MODELS) \
        else [m for m in args.models.split(',') if m]
    for m in models:
        if m not in MODEL_SPECS:
            raise ValueError('unknown model %r; choose from %s' % (m, sorted(MODEL_SPECS)))
    return dict(models=models, batch=8 if quick and args.batch == 32 else args.batch,
                threads=args.threads, steps=2 if quick else args.steps,
                reps=2 if quick else args.reps, warmup=1 if quick else args.warmup,
                launches=1 if quick else args.launches,
                n_classes=10, ddp_bucket_caps_mb=caps, wire_dtypes=wires,
                ddp_hooks=['none', 'fp16'] if args.ddp_fp16_hook else ['none'])


def parse_wire_dtypes(text):
    """The list of ``--wire-dtype`` values (ValueError naming a bad or missing one)."""
    wires = [w.strip() for w in str(text).split(',') if w.strip()]
    for w in wires:
        if w not in WIRE_SUFFIX:
            raise ValueError('--wire-dtype: unknown wire dtype %r; choose from %s'
                             % (w, ', '.join(WIRE_SUFFIX)))
    if not wires or len(set(wires)) != len(wires):
        raise ValueError('--wire-dtype must list wire dtypes from %s, each once, not %r'
                         % (', '.join(WIRE_SUFFIX), text))
    return wires


def run_setting(spec, model, net, ranks, ddp, timeout):
    """All jobs of one (network, model) setting; returns its result rows."""
    from .allreduce import run_ranks
    spec = dict(spec, model=model, model_spec=MODEL_SPECS[model])
    ours = []
    theirs = {(cap, hook): [] for cap in spec['ddp_bucket_caps_mb']
              for hook in spec.get('ddp_hooks', ['none'])}
    load_before = os.getloadavg()[0]
    # The same compute threads for both projects, whatever the caller's
    # environment says (Theano's BLAS reads these; PyTorch gets the count
    # through the spec).
    threads = {v: str(spec['threads'])
               for v in ('OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS', 'MKL_NUM_THREADS')}
    for launch in range(spec['launches']):
        # Alternate which project goes first, so drifting load hits both.
        jobs = ['ours', 'ddp'] if launch % 2 == 0 else ['ddp', 'ours']
        for job in jobs:
            if job == 'ours':
                ours.append(run_ranks('theanompi_ext.bench.compare', spec, net, ranks,
                                      timeout, threads))
            elif ddp:
                for cap, hook in sorted(theirs):
                    theirs[cap, hook].append(run_ranks(
                        'theanompi_ext.bench.ddp_worker',
                        dict(spec, port=free_port(), ddp_bucket_cap_mb=cap,
                             ddp_comm_hook=hook), net, ranks, timeout, threads))
    from .overlap import format_network
    rows = summarize(model, format_network(net), spec, ours, theirs)
    # The machine may be shared: say how busy it was around the measurement.
    for r in rows:
        r.update(load_before=load_before, load_after=os.getloadavg()[0],
                 launches=spec['launches'], steps=spec['steps'], reps=spec['reps'])
    return rows


def free_port():
    """A TCP port nobody listens on now (for gloo's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


# -- numbers -------------------------------------------------------------------------

def median_and_error(values):
    """Median of ``values`` and an estimate of its standard error.

    The error is 1.2533 sigma / sqrt(n), the median's standard error for
    normal data, with sigma = 1.4826 MAD (a robust standard deviation), so
    that a few steps stalled by another job on a shared machine do not
    inflate it.
    """
    v = np.asarray(values, float)
    med = float(np.median(v))
    sigma = 1.4826 * float(np.median(np.abs(v - med)))
    return med, 1.2533 * sigma / np.sqrt(len(v))


def job_steps(per_rank):
    """Per-step seconds of the job: step k ends when its slower rank ends.

    ``per_rank`` holds each rank's per-step seconds. With one step per
    block (the default) every step starts at a barrier, so the k-th steps
    of the ranks ran side by side, in the compute-only modes too: their
    maximum is what a synchronous step would have waited for.
    """
    return np.max(np.asarray(per_rank, float), axis=0)


def make_row(system, model, network, compute, step, serial, **extra):
    """One result object with the derived ratios (see the module docstring).

    ``compute``, ``step`` and ``serial`` hold each rank's per-step seconds.
    Entry k of every mode comes from repetition k of :func:`time_modes`, so
    the modes' k-th steps ran back to back; the ratios are medians of these
    paired figures, relative to the compute step of the same repetition,
    which cancels slow drifts of the machine's load::

        comm_overhead   = median_k(step_k / compute_k) - 1
        cost            = median_k((serial_k - compute_k) / compute_k)
        hidden_fraction = median_k((serial_k - step_k) / compute_k) / cost

    ``hidden_fraction`` is None when ``cost`` (the exchange's cost, as a
    fraction of the compute step) is under 1% or under twice its standard
    error; ``hidden_fraction_err`` is its bootstrap standard error
    (:func:`bootstrap_error`). The
    row also holds the medians of the three step times (``*_s``), standard
    errors (``*_err``, see :func:`median_and_error`) and the per-rank,
    per-step times (``times_s``).
    """
    c, t, s = [job_steps(v) for v in (compute, step, serial)]
    n = min(len(c), len(t), len(s))
    c, t, s = c[:n], t[:n], s[:n]
    (mc, ec), (mt, et), (ms, es) = [median_and_error(v) for v in (c, t, s)]
    overhead, overhead_err = median_and_error(t / c - 1.0)
    cost, cost_err = median_and_error((s - c) / c)
    hidden, hidden_err = None, None
    if cost > max(0.01, 2.0 * cost_err):
        hidden = paired_hidden_fraction(c, t, s)
        hidden_err = bootstrap_error(paired_hidden_fraction, (c, t, s))
    row = dict(system=system, model=model, network=network, compute_s=mc, step_s=mt,
               comm_overhead=overhead, hidden_fraction=hidden,
               hidden_fraction_err=hidden_err, serial_s=ms,
               comm_overhead_err=overhead_err, comm_cost=cost, comm_cost_err=cost_err,
               compute_err_s=ec, step_err_s=et, serial_err_s=es,
               times_s=dict(compute=compute, step=step, serial=serial))
    row.update(extra)
    return row


def paired_hidden_fraction(c, t, s):
    """median_k((s_k - t_k) / c_k) / median_k((s_k - c_k) / c_k) of paired step
    times (compute, step, serial); None when the cost's median is not positive."""
    cost = float(np.median((s - c) / c))
    return float(np.median((s - t) / c)) / cost if cost > 0 else None


def bootstrap_error(stat, arrays, n_boot=400, seed=0):
    """Standard deviation of ``stat`` over ``n_boot`` resamples of the paired
    entries of ``arrays`` (drawn with replacement, the same indices for every
    array; a fixed seed makes it reproducible). Resamples where ``stat`` is
    None are left out; None when fewer than half remain."""
    n = len(arrays[0])
    rng = np.random.RandomState(seed)
    vals = []
    for _ in range(n_boot):
        idx = rng.randint(0, n, n)
        v = stat(*[a[idx] for a in arrays])
        if v is not None:
            vals.append(v)
    return float(np.std(vals)) if len(vals) >= n_boot // 2 else None


def _median(per_rank):
    return float(np.median(job_steps(per_rank)))


def _all(results, mode):
    """Each rank's per-step times of ``mode``, over every job."""
    return [sum((r[mode][k] for r in results), []) for k in range(len(results[0][mode]))]


def ours_modes(wires):
    """Our timed modes for the wire dtypes ``wires``: the shared compute modes,
    then :data:`EXCHANGE_MODES` suffixed per wire (float32: no suffix)."""
    return COMPUTE_MODES + tuple(m + WIRE_SUFFIX[w] for w in wires for m in EXCHANGE_MODES)


def ddp_system(cap_mb, hook='none'):
    """The system name of DDP with ``bucket_cap_mb=cap_mb`` (25, its default: plain),
    suffixed ``-fp16`` with the fp16 compression hook."""
    name = SYSTEMS[2] if cap_mb == 25 else '%s-%gmb' % (SYSTEMS[2], cap_mb)
    return name + ('-fp16' if hook == 'fp16' else '')


def summarize(model, network, spec, ours, theirs):
    """Result rows of one setting from the jobs' per-step times.

    ``ours`` is a list of our jobs' results, ``theirs`` maps ``(bucket cap,
    hook)`` (or a bare cap: no hook) to the list of DDP jobs' results with it.
    """
    common = dict(batch=spec['batch'], ranks=None, threads=spec['threads'])
    rows = _our_rows(model, network, spec, ours, common) if ours else []
    keyed = [(k if isinstance(k, tuple) else (k, 'none'), jobs) for k, jobs in theirs.items()]
    for (cap, hook), jobs in sorted(keyed, key=lambda kj: (kj[0][0], kj[0][1] != 'none')):
        if not jobs:
            continue
        t = {m: _all(jobs, m) for m in ('compute', 'serial', 'full', 'allreduce')}
        row = make_row(
            ddp_system(cap, hook), model, network, t['compute'], t['full'], t['serial'],
            **dict(common, ranks=len(t['full']), grad_bytes=jobs[0]['grad_bytes'],
                   params=jobs[0]['params'], allreduce_s=_median(t['allreduce']),
                   steps_measured=len(t['full'][0]), torch=jobs[0]['torch'],
                   ddp_bucket_cap_mb=cap, ddp_comm_hook=hook, wire_dtype=DDP_HOOK_WIRE[hook],
                   hook_check=jobs[0].get('hook_check')))
        row['times_s']['allreduce'] = t['allreduce']
        rows.append(row)
    return rows


def _our_rows(model, network, spec, ours, common):
    """Our two systems per wire dtype, all paired against the shared compute step;
    overlapped ones carry :func:`bound_excess`, 16-bit ones :func:`wire_ratio`."""
    wires = spec.get('wire_dtypes', ['float32'])
    t = {m: _all(ours, m) for m in ours_modes(wires)}
    base = dict(common, ranks=ours[0]['ranks'], grad_bytes=ours[0]['grad_bytes'],
                params=ours[0]['params'], compute_chunked_s=_median(t['compute_chunked']),
                buckets=ours[0]['buckets'], chunks=ours[0]['chunks'])
    rows, by_wire = [], {}
    for wire in wires:
        sfx = WIRE_SUFFIX[wire]
        extra = dict(base, wire_dtype=wire, allreduce_s=_median(t['allreduce' + sfx]),
                     steps_measured=len(t['overlap' + sfx][0]))
        for system, mode in ((SYSTEMS[0], 'overlap'), (SYSTEMS[1], 'serial')):
            row = make_row(system + sfx, model, network, t['compute'], t[mode + sfx],
                           t['serial' + sfx], **extra)
            row['times_s']['allreduce'] = t['allreduce' + sfx]
            rows.append(row)
        overlapped = rows[-2]
        overlapped['bound_excess'], overlapped['bound_excess_err'] = bound_excess(overlapped)
        by_wire[wire] = overlapped
    for wire, row in by_wire.items():
        if wire != 'float32' and 'float32' in by_wire:
            ratio = wire_ratio(row, by_wire['float32'])
            for r in rows:
                if r.get('wire_dtype') == wire:
                    r['wire_time_ratio'], r['wire_time_ratio_err'] = ratio
    return rows


def _paired(row, modes):
    """The per-step times (slower rank) of ``modes`` of ``row``, cut to a common length."""
    v = [job_steps(row['times_s'][m]) for m in modes]
    n = min(len(x) for x in v)
    return [x[:n] for x in v]


def wire_ratio(row16, row32):
    """(median, error) of the exchange time ratio 16-bit / float32, repetition by
    repetition: median_k(allreduce16_k / allreduce32_k) of the two rows'
    ``times_s['allreduce']`` (both from the same jobs, entry k of the same
    repetition, so a drift of the load cancels)."""
    a = job_steps(row16['times_s']['allreduce'])
    b = job_steps(row32['times_s']['allreduce'])
    n = min(len(a), len(b))
    return median_and_error(a[:n] / b[:n])


def bound_excess(row):
    """(median, error) of how far a step is above max(compute, communication):
    median_k(step_k / max(compute_k, allreduce_k)) - 1, the three times of
    repetition k paired as for the overhead; the communication time is the
    system's own allreduce of the whole gradient alone."""
    c, t, a = _paired(row, ('compute', 'step', 'allreduce'))
    return median_and_error(t / np.maximum(c, a) - 1.0)


def targets(rows):
    """The targets of one setting, as text lines (None when there is nothing to judge).

    Against each DDP system of the same wire (ours float32 against DDP without
    a hook, our 16-bit systems against DDP with its fp16 hook): a communication
    overhead no larger than DDP's and a hidden fraction no smaller; for a
    16-bit system the hidden fraction must be above DDP's by more than the
    combined standard error. Then per 16-bit wire the exchange time ratio
    (:func:`wire_ratio`, target :data:`WIRE_RATIO_TARGET` or less) and per
    overlapped system the step's excess over max(compute, communication)
    (:func:`bound_excess`, target :data:`BOUND_TARGET` or less). A difference
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
    """One line per system: times in ms, overhead in % and hidden fraction (each +- its standard error)."""
    if not rows:
        return '(no results)'
    r0 = rows[0]
    lines = ['%s on %s: %s ranks x batch %s, %s compute thread(s) per rank, %.2f MB of gradients'
             % (r0['model'], r0['network'], r0.get('ranks'), r0.get('batch'), r0.get('threads'),
                r0.get('grad_bytes', 0) / 1e6),
             '%-30s %10s %10s %10s %10s %15s %13s' % ('system', 'compute ms', 'step ms',
                                                     'serial ms', 'allred ms', 'overhead',
                                                     'hidden')]
    for r in rows:
        lines.append('%-30s %10.1f %10.1f %10.1f %10.1f %7.1f%% +-%4.1f %13s' % (
            r['system'], 1e3 * r['compute_s'], 1e3 * r['step_s'], 1e3 * r['serial_s'],
            1e3 * r.get('allreduce_s', float('nan')), 100 * r['comm_overhead'],
            100 * r.get('comm_overhead_err', float('nan')),
            _fmt_frac(r['hidden_fraction'], r.get('hidden_fraction_err'))))
    verdict = targets(rows)
    if verdict:
        lines.append(verdict)
    return '\n'.join(lines)


# -- our side, inside each rank -----------------------------------------------------------

def measure_ours(spec):
    """Time this project's modes on this rank (collective over COMM_WORLD).

    Returns, on every rank, ``{mode: [[per-step seconds] of each rank]}``
    for :func:`ours_modes` of ``spec['wire_dtypes']``, plus sizes. The
    compute modes run on the first wire's trainers (they exchange nothing).
    """
    from ..collective.mpi import MPICommunicator
    from ..collective.watchdog import watch
    from .overlap import synthetic_dataset, compute_step
    # As users run it: the trainers' step watchdog included (one shared).
    comm = watch(MPICommunicator())
    n, k = spec['batch'], comm.size
    wires = spec.get('wire_dtypes', ['float32'])
    data = synthetic_dataset(tuple(spec['model_spec']['input_shape']), 4 * n * k,
                             spec['n_classes'])
    trainers = {(s, w): _our_trainer(comm, spec, data, s, w)
                for w in wires for s in ('ar', 'ar-overlap')}
    x, y = data.train_batch(np.arange(comm.rank * n, (comm.rank + 1) * n))
    lr = np.float32(0.001)
    first = trainers['ar', wires[0]]
    zeros = np.zeros_like(first.grads)
    run = {'compute': lambda: compute_step(first, x, y, lr),
           'compute_chunked': lambda: compute_step(trainers['ar-overlap', wires[0]], x, y, lr)}
    for w in wires:
        serial, overlap = trainers['ar', w], trainers['ar-overlap', w]
        sfx = WIRE_SUFFIX[w]
        run['serial' + sfx] = lambda t=serial: t.step(x, y)
        run['overlap' + sfx] = lambda t=overlap: t.step(x, y)
        run['allreduce' + sfx] = lambda t=serial: t.exchanger.reduce(zeros)
    modes = ours_modes(wires)
    local = time_modes(run, modes, spec['steps'], spec['reps'], comm.barrier,
                       warmup=spec['warmup'])
    everyone = [json.loads(e) for e in comm.allgather(json.dumps(local))]
    out = {mode: [[float(v) for v in r[mode]] for r in everyone] for mode in modes}
    out.update(grad_bytes=4 * int(first.n_exch), params=int(first.layout.total),
               buckets=len(first.buckets),
               chunks=trainers['ar-overlap', wires[0]].backward.n_chunks, ranks=k)
    comm.barrier()
    comm.close()
    return out


def _our_trainer(comm, spec, data, strategy, wire):
    """A trainer of ``spec``'s model with ``exch_strategy=strategy`` and ``wire_dtype=wire``."""
    from ..model import build_model
    from ..model.resnet import cifar_resnet
    from ..train.config import TrainConfig
    from ..train.trainer import Trainer
    m, shape = spec['model_spec'], tuple(spec['model_spec']['input_shape'])
    if m['kind'] == 'cifar_resnet':
        net = cifar_resnet(shape, spec['n_classes'], depth=m['depth'], width=m['width'],
                           seed=0, name=spec['model'])
    else:
        net = build_model(m['kind'], shape, spec['n_classes'], seed=0, width=m['width'])
    cfg = TrainConfig(model=spec['model'], batch_per_worker=spec['batch'], epochs=1,
                      warmup='none', base_lr=0.01, quiet=True, checkpoint=False,
                      exchange_bn=True, exch_strategy=strategy, wire_dtype=wire)
    return Trainer(net, data, cfg, comm, log=lambda *a, **kw: None)


def worker_main(spec_path):
    """Entry point of each rank: ``python -m theanompi_ext.bench.compare SPEC.json``."""
    return rank_main(spec_path, measure_ours)


if __name__ == '__main__':
    sys.exit(worker_main(sys.argv[1]))
