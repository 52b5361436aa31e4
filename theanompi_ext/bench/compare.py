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
errors and the per-step times (``times_s``). ``docs/performance.md`` has
the figures.

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

SYSTEMS = ('theanompi_ext/ar-overlap', 'theanompi_ext/ar', 'pytorch/ddp-gloo')
OURS_MODES = ('compute', 'compute_chunked', 'serial', 'overlap', 'allreduce')
JSON_KEYS = ('system', 'model', 'network', 'compute_s', 'step_s', 'comm_overhead',
             'hidden_fraction')
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
                with open(args.json, 'w') as f:
                    json.dump(rows, f, indent=1)
    if args.json and not rows:
        with open(args.json, 'w') as f:
            json.dump(rows, f)
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
                n_classes=10, ddp_bucket_caps_mb=caps)


def run_setting(spec, model, net, ranks, ddp, timeout):
    """All jobs of one (network, model) setting; returns its result rows."""
    from .allreduce import run_ranks
    spec = dict(spec, model=model, model_spec=MODEL_SPECS[model])
    ours, theirs = [], {cap: [] for cap in spec['ddp_bucket_caps_mb']}
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
                for cap in spec['ddp_bucket_caps_mb']:
                    theirs[cap].append(run_ranks(
                        'theanompi_ext.bench.ddp_worker',
                        dict(spec, port=free_port(), ddp_bucket_cap_mb=cap), net, ranks,
                        timeout, threads))
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


def ddp_system(cap_mb):
    """The system name of DDP with ``bucket_cap_mb=cap_mb`` (25, its default: plain)."""
    return SYSTEMS[2] if cap_mb == 25 else '%s-%gmb' % (SYSTEMS[2], cap_mb)


def summarize(model, network, spec, ours, theirs):
    """Result rows of one setting from the jobs' per-step times.

    ``ours`` is a list of our jobs' results, ``theirs`` maps a DDP bucket
    cap to the list of DDP jobs' results with it.
    """
    rows = []
    common = dict(batch=spec['batch'], ranks=None, threads=spec['threads'])
    if ours:
        t = {m: _all(ours, m) for m in OURS_MODES}
        extra = dict(common, ranks=ours[0]['ranks'], grad_bytes=ours[0]['grad_bytes'],
                     params=ours[0]['params'], allreduce_s=_median(t['allreduce']),
                     compute_chunked_s=_median(t['compute_chunked']),
                     steps_measured=len(t['overlap'][0]), buckets=ours[0]['buckets'],
                     chunks=ours[0]['chunks'])
        rows.append(make_row(SYSTEMS[0], model, network, t['compute'], t['overlap'],
                             t['serial'], **extra))
        rows.append(make_row(SYSTEMS[1], model, network, t['compute'], t['serial'],
                             t['serial'], **extra))
    for cap, jobs in sorted(theirs.items()):
        if not jobs:
            continue
        t = {m: _all(jobs, m) for m in ('compute', 'serial', 'full', 'allreduce')}
        rows.append(make_row(
            ddp_system(cap), model, network, t['compute'], t['full'], t['serial'],
            **dict(common, ranks=len(t['full']), grad_bytes=jobs[0]['grad_bytes'],
                   params=jobs[0]['params'], allreduce_s=_median(t['allreduce']),
                   steps_measured=len(t['full'][0]), torch=jobs[0]['torch'],
                   ddp_bucket_cap_mb=cap)))
    return rows


def targets(rows):
    """The two targets against each DDP system of one setting, as text lines
    (None without DDP).

    Ours (overlapped) must have a communication overhead no larger than
    DDP's and a hidden fraction no smaller. A difference smaller than the
    two figures' combined standard error is called "within noise".
    """
    ours = [r for r in rows if r['system'] == SYSTEMS[0]]
    lines = [_target(ours[0], r) for r in rows
             if ours and r['system'].startswith(SYSTEMS[2])]
    return '\n'.join(lines) or None


def _target(ours, ddp):
    d = ddp['comm_overhead'] - ours['comm_overhead']
    err = float(np.hypot(ours['comm_overhead_err'], ddp['comm_overhead_err']))
    oh = 'met' if d >= 0 else 'NOT met'
    if abs(d) < err:
        oh += ' (within noise, +-%.1f%%)' % (100 * err)
    a, b = ours['hidden_fraction'], ddp['hidden_fraction']
    if a is None or b is None:
        hf = 'n/a (an exchange cost within noise)'
    else:
        hf = 'met' if a >= b else 'NOT met'
        herr = float(np.hypot(ours.get('hidden_fraction_err') or 0.0,
                              ddp.get('hidden_fraction_err') or 0.0))
        if abs(a - b) < herr:
            hf += ' (within noise, +-%.2f)' % herr
    return ('targets vs %s: overhead %+.1f%% vs %+.1f%%: %s; hidden fraction %s vs %s: %s' % (
        ddp['system'], 100 * ours['comm_overhead'], 100 * ddp['comm_overhead'], oh,
        _fmt_frac(a, ours.get('hidden_fraction_err')),
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
             '%-26s %10s %10s %10s %10s %15s %13s' % ('system', 'compute ms', 'step ms',
                                                     'serial ms', 'allred ms', 'overhead',
                                                     'hidden')]
    for r in rows:
        lines.append('%-26s %10.1f %10.1f %10.1f %10.1f %7.1f%% +-%4.1f %13s' % (
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
    for :data:`OURS_MODES`, plus sizes.
    """
    from ..collective.mpi import MPICommunicator
    from ..collective.watchdog import watch
    from ..model import build_model
    from ..model.resnet import cifar_resnet
    from ..train.config import TrainConfig
    from ..train.trainer import Trainer
    from .overlap import synthetic_dataset, compute_step
    # As users run it: the trainers' step watchdog included (one shared).
    comm = watch(MPICommunicator())
    m, n, k = spec['model_spec'], spec['batch'], comm.size
    shape = tuple(m['input_shape'])
    data = synthetic_dataset(shape, 4 * n * k, spec['n_classes'])
    trainers = {}
    for strategy in ('ar', 'ar-overlap'):
        if m['kind'] == 'cifar_resnet':
            net = cifar_resnet(shape, spec['n_classes'], depth=m['depth'], width=m['width'],
                               seed=0, name=spec['model'])
        else:
            net = build_model(m['kind'], shape, spec['n_classes'], seed=0, width=m['width'])
        cfg = TrainConfig(model=spec['model'], batch_per_worker=n, epochs=1, warmup='none',
                          base_lr=0.01, quiet=True, checkpoint=False, exchange_bn=True,
                          exch_strategy=strategy)
        trainers[strategy] = Trainer(net, data, cfg, comm, log=lambda *a, **kw: None)
    serial, overlap = trainers['ar'], trainers['ar-overlap']
    x, y = data.train_batch(np.arange(comm.rank * n, (comm.rank + 1) * n))
    lr = np.float32(0.001)
    zeros = np.zeros_like(serial.grads)
    run = {
        'compute': lambda: compute_step(serial, x, y, lr),
        'compute_chunked': lambda: compute_step(overlap, x, y, lr),
        'serial': lambda: serial.step(x, y),
        'overlap': lambda: overlap.step(x, y),
        'allreduce': lambda: serial.exchanger.reduce(zeros),
    }
    local = time_modes(run, OURS_MODES, spec['steps'], spec['reps'], comm.barrier,
                       warmup=spec['warmup'])
    everyone = [json.loads(e) for e in comm.allgather(json.dumps(local))]
    out = {mode: [[float(v) for v in r[mode]] for r in everyone] for mode in OURS_MODES}
    out.update(grad_bytes=4 * int(serial.n_exch), params=int(serial.layout.total),
               buckets=len(serial.buckets), chunks=overlap.backward.n_chunks, ranks=k)
    comm.barrier()
    comm.close()
    return out


def worker_main(spec_path):
    """Entry point of each rank: ``python -m theanompi_ext.bench.compare SPEC.json``."""
    return rank_main(spec_path, measure_ours)


if __name__ == '__main__':
    sys.exit(worker_main(sys.argv[1]))
