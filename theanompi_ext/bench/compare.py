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
``--mpi-env KEY=VALUE`` (repeatable) sets a variable for our jobs' ranks
(an MPICH CVAR such as ``MPIR_CVAR_ENABLE_HEAVY_YIELD=1``; DDP's jobs do not
get it), and our rows say it as the ranks saw it (``mpi_env``).
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
serial exchanger; ``null`` when that cost is under 5% of the compute step
(:data:`.compare_stats.MIN_COST`) or under twice its standard error, where
the ratio is noise; ``hidden_fraction_launches`` holds each launch's own). Both are
estimated from the modes' back-to-back steps (see
:func:`.compare_stats.make_row`). The
definitions are the same for both projects; figures come with standard
errors and the per-step times (``times_s``, with ``allreduce``: the
system's whole exchange alone). Our overlapped systems also get
``bound_excess`` (:func:`.compare_stats.bound_excess`) and 16-bit ones
``wire_time_ratio`` (:func:`.compare_stats.wire_ratio`);
:func:`.compare_verdicts.targets` judges them. ``docs/performance.md`` has
the figures.

Alternation: each (network, model) setting launches ``--launches`` pairs of
jobs, ours then DDP, then DDP then ours, ...; inside a job the modes run in
blocks of ``--steps`` steps in a rotating order, ``--reps`` times. Medians
are over every measured step of every job.

Networks: ``shm`` (this machine: MPI over shared memory, gloo over TCP on
the loopback), ``tbf:RATE`` (both in a network namespace whose loopback
is rate-limited, MPI forced onto TCP; needs root, see
:mod:`theanompi_ext.launch.emulated_network`) and ``hosts:HxR:RATE[:QUEUE]``
(H emulated hosts of R ranks, their links' queue QUEUE, lossless by default;
``--ranks`` ignored: MPI over shared memory within a host and TCP between
hosts; DDP's ranks started on the hosts the same way, gloo's store on the
first host's address; needs root, see :mod:`theanompi_ext.launch.emulated_hosts`).
Our ranks' allreduce spans hosts as ``train``'s does (``--topology``, default
``auto``: two-level on several hosts of several ranks); the table's first line
says which ran.

The parts: this module (the command, its jobs), :mod:`.compare_systems`
(what is compared), :mod:`.compare_rank` (our side in each rank; DDP's is
:mod:`.ddp_worker`), :mod:`.compare_stats` (the numbers),
:mod:`.compare_verdicts` (targets and table).
"""
import os
import socket
import sys

from ..buckets.plan import DEFAULT_CAP_MB, DEFAULT_FIRST_CAP_MB
from ..collective.two_level import TOPOLOGIES
from ..errors import EXIT_BAD_INPUT, EXIT_CHECK_FAILED, EXIT_OK
from ..launch.emulated_network import (NetworkSetupError, format_network, hosts_layout,
                                       parse_network)
from .common import add_common_options, add_mpi_env_option, run_job
from .compare_stats import summarize
from .compare_systems import MODEL_SPECS, WIRE_SUFFIX
from .compare_verdicts import format_table
from ..files.atomic import write_json

JSON_KEYS = ('system', 'model', 'network', 'compute_s', 'step_s', 'comm_overhead',
             'hidden_fraction', 'wire_dtype')
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
    p.add_argument('--topology', default='auto', choices=TOPOLOGIES,
                   help="how our allreduce spans hosts, as `train --topology` (default "
                        "%(default)s, train's: two-level on several hosts of several ranks, "
                        "else flat); the table's first line says which ran")
    add_mpi_env_option(p)
    p.add_argument('--no-ddp', action='store_true',
                   help='measure only this project, not PyTorch DDP')
    p.add_argument('--ddp-python', default='', metavar='PATH',
                   help='the Python interpreter that runs DDP (empty: this one): where '
                        "PyTorch lives in another environment than the pinned Theano stack; "
                        'it gets this checkout on its PYTHONPATH')
    p.add_argument('--quick', action='store_true',
                   help='tiny model (digits_cnn on 8x8 inputs, batch 8), 1 job, few steps')
    add_common_options(p, '1gbit', 3600.0, json_help='write one object per system and setting to FILE', timeout_what='one job')
    p.set_defaults(func=main)


def main(args):
    """Run every (network, model) setting, print the tables, write --json."""
    from ..launch import in_mpi_job
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
    ddp = None if args.no_ddp else (args.ddp_python or sys.executable)   # its interpreter
    problem = ddp and torch_problem(ddp)
    if problem:
        say('theanompi-ext bench compare: %s; skipping PyTorch DDP\n' % problem)
        ddp = None
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
                ddp_hooks=['none', 'fp16'] if args.ddp_fp16_hook else ['none'],
                mpi_env=dict(args.mpi_env), topology=args.topology)


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
    """All jobs of one (network, model) setting; returns its result rows (``ddp``:
    the interpreter that runs DDP, None: no DDP)."""
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
    ddp_env = dict(threads, **ddp_rendezvous(net))
    if ddp and ddp != sys.executable:
        from .ddp_worker import package_path
        ddp_env['PYTHONPATH'] = os.pathsep.join(
            [package_path()] + [p for p in [os.environ.get('PYTHONPATH')] if p])
    if net[0] == 'hosts':
        h, r, _ = hosts_layout(net)
        ranks = h * r
    for launch in range(spec['launches']):
        # Alternate which project goes first, so drifting load hits both.
        jobs = ['ours', 'ddp'] if launch % 2 == 0 else ['ddp', 'ours']
        for job in jobs:
            if job == 'ours':
                ours.append(run_job('theanompi_ext.bench.compare_rank', spec, net, ranks,
                                    timeout, dict(threads, **spec.get('mpi_env', {}))))
            elif ddp:
                for cap, hook in sorted(theirs):
                    theirs[cap, hook].append(run_job(
                        'theanompi_ext.bench.ddp_worker',
                        dict(spec, port=free_port(), ddp_bucket_cap_mb=cap,
                             ddp_comm_hook=hook), net, ranks, timeout, ddp_env, python=ddp))
    rows = summarize(model, format_network(net), spec, ours, theirs)
    # The machine may be shared: say how busy it was around the measurement.
    for r in rows:
        r.update(load_before=load_before, load_after=os.getloadavg()[0],
                 launches=spec['launches'], steps=spec['steps'], reps=spec['reps'])
    return rows


def ddp_rendezvous(net):
    """gloo's rendezvous on ``net``: on emulated hosts a TCP store on the first
    host's address, and gloo on the hosts' own device (within a host the
    kernel keeps that traffic local; between hosts it crosses the shaped
    link); elsewhere nothing (the loopback, see :mod:`.ddp_worker`)."""
    if net[0] != 'hosts':
        return {}
    from ..launch.emulated_hosts import HOST_DEV, host_address
    # (c10d warns on every rank that an emulated host's name does not resolve)
    return {'MASTER_ADDR': host_address(0), 'GLOO_SOCKET_IFNAME': HOST_DEV,
            'TORCH_CPP_LOG_LEVEL': 'ERROR'}


def free_port():
    """A TCP port nobody listens on now (for gloo's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]
