"""``theanompi-ext bench overlap``: what overlapping the exchange with backprop buys.

The command (run outside MPI) starts ``mpiexec -n K`` itself, once per
network setting. Every rank builds the same model twice, one trainer per
exchanger (``exch_strategy='ar'`` and ``'ar-overlap'``), on synthetic data
((3, 32, 32), batch 32 per rank), and times blocks of steps of each mode,
alternating the modes over several repetitions:

``compute``          forward + monolithic backward + update; no communication
``compute_chunked``  the same with the chunked backward (its overhead)
``serial``           a training step with the serial exchanger
``overlap``          a training step with the overlapped exchanger
``allreduce``        the serial exchanger's bucket allreduces alone (the
                     same bytes, no compute)

``--contract MODULE:CLASS`` measures a Theano-MPI model class the same way,
unmodified, through two :class:`~theanompi_ext.theanompi_compat.stepper.ContractStepper`
(serial, and overlapped with the chunks found in its graph) on its own
batch: :mod:`theanompi_ext.bench.overlap_contract`.

Reported (medians over steps; the slower rank): the five times, the
*exposed communication* of the overlapped step (from the ranks'
timelines: how long the last transfer outlasts the last rank's backward
pass, see :func:`~theanompi_ext.exchange.timeline.job_exposed_comm`;
``exposed_comm_rank_s`` is the per-rank figure, which also counts a rank
waiting for a slower one), the *hidden fraction*
``(serial - overlap) / (serial - compute)`` (the share of the exchange's
cost the overlap removed; undefined when communication costs nothing
measurable), and ``extra_bytes``: bytes the exchanger allocates beyond the
gradient vector (its buckets are views of it).

Networks
--------
``shm`` (ranks on this machine, MPI over shared memory; default) or
``tbf:RATE`` (e.g. ``tbf:200mbit``: a rate-limited network namespace, MPI
on TCP; needs root and ``ip``/``tc``), as emulated by
:mod:`theanompi_ext.launch.emulated_network`.
"""
import json
import re
import sys

import numpy as np

from ..cli.argtypes import output_path
from ..errors import EXIT_BAD_INPUT, EXIT_CHECK_FAILED, EXIT_OK
from ..launch.emulated_network import NetworkSetupError, format_network, parse_network
from .common import add_common_options, add_mpi_env_option, run_job
from .overlap_contract import measure_contract, parse_contract
# compute_step, hidden_fraction and MODES are read from here by the other benchmarks
from .overlap_pair import MODES, compute_step, hidden_fraction, measure_pair  # noqa: F401
from ..files.atomic import write_json

DEFAULT_MODELS = ('resnet20', 'resnet20_wide')
JSON_KEYS = ('model', 'network', 'compute_s', 'serial_s', 'overlap_s', 'allreduce_s',
             'exposed_comm_s', 'hidden_fraction', 'extra_bytes')


# -- the command --------------------------------------------------------------

def register(sub):
    """Add ``bench overlap`` to the ``bench`` sub-parsers."""
    p = sub.add_parser('overlap', help='serial vs overlapped exchange at 2 ranks (starts mpiexec)',
                       description=__doc__.split('\n\n')[0])
    from ..train.options import ModelNames
    models = p.add_argument('--models', default=None, metavar='LIST',
                            help='comma-separated names from the model zoo: %%(zoo)s '
                                 '(default %s; none when --contract is given)'
                                 % ','.join(DEFAULT_MODELS))
    models.zoo = ModelNames()     # argparse fills %(zoo)s from the action: read when shown
    p.add_argument('--contract', action='append', default=[], metavar='MODULE:CLASS',
                   help='also measure this Theano-MPI model class, unmodified (MODULE importable '
                        'by name, or a .py path), through two ContractSteppers with the '
                        'chunks found in its graph; its own batch size; repeat for several')
    p.add_argument('--workers', type=int, default=2, metavar='K',
                   help='k, the MPI ranks to start (default 2)')
    p.add_argument('--steps', type=int, default=4, metavar='N',
                   help='timed steps per block, iterations (default 4)')
    p.add_argument('--reps', type=int, default=3, metavar='N',
                   help='repetitions of the alternating blocks (default 3)')
    p.add_argument('--batch', type=int, default=32, metavar='N',
                   help='n, examples per rank per step (default 32)')
    p.add_argument('--bucket-cap-mb', type=float, default=None, metavar='MB',
                   help='size cap of one allreduce bucket, MB (default: as train)')
    p.add_argument('--first-bucket-cap-mb', type=float, default=None, metavar='MB',
                   help='size cap of the first bucket, MB (default: as train)')
    p.add_argument('--comm-thread', default=None, metavar='POLICY',
                   help="the communication thread: 'normal', 'nice:N' or 'idle' "
                        "(SCHED_IDLE) priority; 'block' (a blocking Allreduce) or 'poll:US' "
                        "(Iallreduce tested with sleeps up to US microseconds) wait; "
                        "'handoff' or 'no-handoff': whether starting a bucket hands the GIL "
                        "to the idle thread; comma-separated; default: the MPI backend's "
                        "defaults")
    add_mpi_env_option(p)
    p.add_argument('--device', default='cpu', metavar='DEV',
                   help='device of the ranks: cpu, cuda0, opencl0:0, or one per rank '
                        '(cuda0,cuda1); on a device the exchange is host-staged MPI '
                        '(default %(default)s)')
    p.add_argument('--max-chunks', type=int, default=None, metavar='N',
                   help='merge the backward into at most this many chunks (default: one '
                        'per layer with parameters; zoo models only: a --contract model has '
                        'the chunks found in its graph)')
    p.add_argument('--quick', action='store_true',
                   help='tiny model (digits_cnn on 8x8 inputs), 2 steps x 2 repetitions')
    p.add_argument('--timeline', default='', metavar='PREFIX', type=output_path,
                   help='write Chrome traces (+PNG) of the measured steps to PREFIX-*.json')
    add_common_options(p, '200mbit', 3600.0)
    p.set_defaults(func=main)


def main(args):
    """Run every network setting, print the table, write --json."""
    try:
        spec = make_spec(args)
        networks = [parse_network(n) for n in (args.network or ['shm'])]
    except ValueError as exc:
        sys.stderr.write('theanompi-ext bench overlap: error: %s\n' % exc)
        return EXIT_BAD_INPUT
    results, status = [], EXIT_OK
    for net in networks:
        try:
            rows = run_setting(spec, net, args.workers, args.mpi_env, args.timeout)
        except (NetworkSetupError, RuntimeError) as exc:
            sys.stderr.write('theanompi-ext bench overlap: %s: %s\n' % (format_network(net), exc))
            status = EXIT_CHECK_FAILED
            continue
        results.extend(rows)
        print(format_table(rows))
        sys.stdout.flush()
    if args.json:
        write_json(args.json, results, 'the results', indent=1)
    return status


def make_spec(args):
    """The per-rank measurement settings (a JSON-able dict)."""
    if args.workers < 2:
        raise ValueError('--workers must be >= 2 (there is nothing to exchange with one rank)')
    if args.steps < 1 or args.reps < 1:
        raise ValueError('--steps and --reps must be >= 1')
    from ..engine.devices import parse_device_list
    device = ','.join(parse_device_list(args.device))
    nice, idle, poll_us, handoff = parse_comm_thread(args.comm_thread)
    quick = bool(args.quick)
    contracts = list(args.contract)
    for ref in contracts:
        parse_contract(ref)
    if args.models is not None:
        models = [m for m in args.models.split(',') if m]
    else:
        models = [] if contracts else ['digits_cnn'] if quick else list(DEFAULT_MODELS)
    if not models and not contracts:
        raise ValueError('nothing to measure: give --models or --contract')
    return dict(models=models, contracts=contracts, input_shape=[1, 8, 8] if quick else [3, 32, 32],
                batch=args.batch, steps=2 if quick else args.steps,
                reps=2 if quick else args.reps, bucket_cap_mb=args.bucket_cap_mb,
                first_bucket_cap_mb=args.first_bucket_cap_mb, thread_nice=nice,
                thread_idle=idle, thread_poll_us=poll_us, thread_handoff=handoff,
                comm_thread=args.comm_thread or 'default',
                max_chunks=args.max_chunks, timeline=args.timeline, device=device)


def parse_comm_thread(text):
    """The ``--comm-thread`` policies, comma-separated ('normal' | 'nice:N' | 'idle';
    'block' | 'poll:US'; 'handoff' | 'no-handoff') or None -> (thread_nice,
    thread_idle, thread_poll_us, thread_handoff); None = the backend's default."""
    nice = idle = poll_us = handoff = None
    for part in ([] if text is None else text.split(',')):
        m_nice = re.fullmatch(r'nice:(\d+)', part)
        m_poll = re.fullmatch(r'poll:(\d+(\.\d+)?)', part)
        if part in ('normal', 'idle'):
            nice, idle = 0, part == 'idle'
        elif m_nice and 0 <= int(m_nice.group(1)) <= 19:
            nice, idle = int(m_nice.group(1)), False
        elif part == 'block':
            poll_us = 0
        elif m_poll and float(m_poll.group(1)) > 0:
            poll_us = float(m_poll.group(1))
        elif part in ('handoff', 'no-handoff'):
            handoff = part == 'handoff'
        else:
            raise ValueError("--comm-thread takes 'normal', 'nice:N' (0..19), 'idle', 'block', "
                             "'poll:US' (US > 0), 'handoff' or 'no-handoff', comma-separated; "
                             "got %r" % part)
    return nice, idle, poll_us, handoff


def run_setting(spec, net, workers, mpi_env=(), timeout=3600.0):
    """Start the ranks for one network setting (``mpi_env``: (KEY, VALUE) pairs for
    the ranks); return their result rows."""
    env = dict(mpi_env)
    spec = dict(spec)
    if spec['timeline']:
        spec['timeline'] = '%s-%s' % (spec['timeline'], re.sub(r'\W', '', format_network(net)))
    return run_job('theanompi_ext.bench.overlap', spec, net, workers, timeout, env)


# -- the table ------------------------------------------------------------------

def format_table(rows):
    """One line per model: times in ms, fractions, bytes."""
    head = ('model', 'network', 'compute', 'chunked', 'serial', 'overlap', 'allreduce',
            'exposed', 'hidden', 'extra B')
    w = max([14] + [len(r['model']) for r in rows])
    lines = ['%-*s %-13s %9s %9s %9s %9s %9s %9s %7s %8s' % ((w,) + head),
             '%-*s %-13s %9s %9s %9s %9s %9s %9s %7s %8s' % (
                 w, '', '', 'ms', 'ms', 'ms', 'ms', 'ms', 'ms', '', '')]
    for r in rows:
        hf = r['hidden_fraction']
        lines.append('%-*s %-13s %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %7s %8d' % (
            w, r['model'], r['network'], 1e3 * r['compute_s'], 1e3 * r['compute_chunked_s'],
            1e3 * r['serial_s'], 1e3 * r['overlap_s'], 1e3 * r['allreduce_s'],
            1e3 * r['exposed_comm_s'], 'n/a' if hf is None else '%.2f' % hf, r['extra_bytes']))
    if rows:
        r = rows[0]
        lines.append('(%d ranks, batch %s/rank, medians of %d x %d steps per mode; comm thread %s; '
                     'chunked = compute with the chunked backward)' % (
                         r['workers'], '/'.join(sorted(set(str(x['batch']) for x in rows))),
                         r['reps'], r['steps'], r['comm_thread']))
    return '\n'.join(lines)


# -- inside each rank -------------------------------------------------------------

def synthetic_dataset(shape, n_examples, n_classes=10, seed=0):
    """Random normal images and random labels (the bench needs no data set)."""
    from ..data.digits import ArrayDataset
    rng = np.random.RandomState(seed)
    x = rng.standard_normal((n_examples,) + tuple(shape)).astype(np.float32)
    y = rng.randint(0, n_classes, n_examples).astype(np.int32)
    return ArrayDataset('synthetic', x, y, x[:n_examples // 4], y[:n_examples // 4], n_classes)


def measure_model(comm, name, spec):
    """Time the modes for zoo model ``name`` (every rank); returns the row on rank 0, else None."""
    shape, n = tuple(spec['input_shape']), spec['batch']
    data = synthetic_dataset(shape, 4 * n * comm.size)
    serial, overlap = _trainer_pair(comm, name, spec, data)
    x, y = data.train_batch(np.arange(comm.rank * n, (comm.rank + 1) * n))
    return measure_pair(comm, name, spec, serial, overlap, (x, y), (x, y), dict(
        source='zoo', batch=n, bucket_cap_mb=serial.cfg.bucket_cap_mb,
        first_bucket_cap_mb=serial.cfg.first_bucket_cap_mb))


def _trainer_pair(comm, name, spec, data):
    """Two trainers of model ``name`` on ``data``: serial (``ar``) and overlapped
    (``ar-overlap``, with ``spec['max_chunks']`` chunks if given)."""
    from ..model import build_model
    from ..train.config import TrainConfig
    from ..train.trainer import Trainer
    opts = dict(model=name, batch_per_worker=spec['batch'], epochs=1, warmup='none',
                base_lr=0.01, quiet=True, checkpoint=False)
    for key in ('bucket_cap_mb', 'first_bucket_cap_mb', 'wire_dtype'):
        if spec.get(key):
            opts[key] = spec[key]
    trainers = {}
    for strategy in ('ar', 'ar-overlap'):
        net = build_model(name, tuple(spec['input_shape']), data.n_classes, seed=0)
        trainers[strategy] = Trainer(net, data, TrainConfig(exch_strategy=strategy, **opts),
                                     comm, log=lambda *a, **kw: None,
                                     max_chunks=spec.get('max_chunks') or None)
    return trainers['ar'], trainers['ar-overlap']


def _measure_all(spec):
    from ..collective.mpi import MPICommunicator
    comm = MPICommunicator(thread_nice=spec['thread_nice'], thread_idle=spec['thread_idle'],
                           thread_poll_us=spec.get('thread_poll_us'),
                           thread_handoff=spec.get('thread_handoff'))
    try:
        # Trainers wrap their communicator in the step watchdog; wrapping it
        # once here lets every trainer share one watchdog thread.
        from ..collective.watchdog import watch
        comm = watch(comm)
    except ImportError:
        pass
    from ..engine.open import open_on_every_rank
    open_on_every_rank(spec.get('device', 'cpu'), comm)
    rows = [measure_model(comm, name, spec) for name in spec['models']]
    rows += [measure_contract(comm, ref, spec) for ref in spec.get('contracts', ())]
    if comm.rank == 0:
        write_json(spec['out'], rows, 'the rank results')
    comm.barrier()
    comm.close()


def worker_main(spec_path):
    """Entry point of each rank: ``python -m theanompi_ext.bench.overlap SPEC.json``."""
    from ..train.worker import guarded
    with open(spec_path) as f:
        spec = json.load(f)
    return guarded(lambda: _measure_all(spec))


if __name__ == '__main__':
    sys.exit(worker_main(sys.argv[1]))
