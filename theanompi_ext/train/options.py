"""Command-line and key=value-file options mapped onto :class:`TrainConfig`.

Every TrainConfig field is an option (``batch_per_worker`` is
``--batch-per-worker``); a ``--config FILE`` in the key=value style of
Theano-MPI's session files sets the same fields (keys case-insensitive),
and command-line options override the file.
"""
import argparse
import dataclasses

from .config import TrainConfig

_SKIP = {'extra'}
# Defaults that depend on other options, described instead of shown.
_DEFAULT_HELP = {'exch_strategy': 'ar-overlap with sync_type kn, ar with avg/cdd'}

# One sentence per option: what it does, and its unit. ``train --help``
# shows them under the group titles of GROUPS.
HELP = {
    'model': 'network to train, one of %(choices)s',
    'data': "training data: 'digits' (the built-in 8x8 digits) or the path of an HDF5 "
            "file written by 'theanompi-ext convert'",
    'crop': 'HDF5 data: side of the random crop, pixels (0: the stored size)',
    'scale_min': 'HDF5 data: smallest area of the random-resized crop, a fraction of '
                 'the image in (0, 1]',
    'batch_per_worker': 'n, examples per worker per iteration (the minibatch is k x n)',
    'seed': 'random seed of the model initialisation (the same on every rank)',
    'data_seed': 'random seed of the per-epoch shuffles and of the augmentation',
    'epochs': 'length of training, epochs',
    'max_steps': 'stop after this many iterations in total (0: run every epoch)',
    'base_lr': 'learning rate at the reference minibatch --ref-batch; training uses '
               'base_lr x kn / ref_batch (linear scaling rule)',
    'ref_batch': 'reference minibatch of --base-lr, examples (the paper: 0.1 at 256)',
    'warmup': 'warm-up, one of %(choices)s: gradual ramps the rate every iteration from '
              'base_lr to the scaled rate, constant holds base_lr then jumps, none starts '
              'at the scaled rate, theanompi multiplies by k^(1/5) per epoch for 5 epochs',
    'warmup_epochs': 'length of the gradual or constant warm-up, epochs (fractions allowed)',
    'decay_epochs': 'epochs at whose start the rate is multiplied by --decay-factor, '
                    'comma-separated whole epochs (empty: no decay)',
    'decay_factor': 'multiplier of the rate at each decay epoch, in (0, 1]',
    'momentum': 'momentum m, in [0, 1)',
    'momentum_form': 'momentum SGD form, one of %(choices)s: eq9 u=m*u+g, w-=lr*u; eq10 '
                     'v=m*v+lr*g, w-=v with momentum correction when the rate changes; '
                     'eq10-nocorrect the same without the correction',
    'nesterov': 'Nesterov momentum, true or false (the bare flag means true)',
    'weight_decay': 'L2 weight decay lambda added to each gradient (BN gamma/beta are '
                    'never decayed), per iteration',
    'sync_type': "exchange rule, one of %(choices)s: kn sums the workers' gradients "
                 "(the paper), avg and cdd are Theano-MPI's parameter averaging and "
                 "momentum exchange",
    'exch_strategy': 'how the gradients travel, one of %(choices)s: ar is one allreduce '
                     'after the backward, ar-overlap starts each bucket\'s allreduce '
                     'during the backward',
    'exchange_bn': 'also exchange the BN gamma/beta, true or false (default: each worker '
                   'keeps its own, as in the paper)',
    'device': "where each rank computes: cpu, a GPU as Theano-MPI names it (cuda0, "
              "cuda1, ...), OpenCL's opencl0:0, or one per rank (cuda0,cuda1: rank r takes "
              "entry r, or its local rank's); a device needs `make gpu-deps` (docs/gpu.md)",
    'exchange_path': 'how device buffers are exchanged, one of %(choices)s: auto picks '
                     'nccl on CUDA devices where NCCL can run on every rank, else '
                     'host-staged, which copies each ready bucket to the host for MPI; '
                     'nccl sums each bucket on the GPU (refused with the reason where '
                     'NCCL cannot run)',
    'backend': 'collective backend of the ranks, one of %(choices)s: auto is mpi under '
               'an MPI launcher with several ranks, else local (one process)',
    'topology': 'how an allreduce spans hosts, one of %(choices)s: two-level sums within '
                'each host over shared memory, then crosses between hosts once '
                '(docs/multinode.md); auto picks it where there are several hosts and a '
                'host with several ranks, flat is MPI\'s own allreduce (mpi backend)',
    'bucket_cap_mb': 'size cap of one allreduce bucket, MB',
    'wire_dtype': 'what the gradient buckets travel as, one of %(choices)s: 16 bits halve '
                  'the bytes, the sum stays float32 (kn only; inf/nan after the cast stops '
                  'the run)',
    'first_bucket_cap_mb': 'size cap of the first bucket (the output layers, ready '
                           'first), MB',
    'checkpoint': 'write OUT/checkpoint.h5, true or false (needs --out)',
    'checkpoint_every': 'iterations between checkpoints (0: at the end of each epoch)',
    'checkpoint_every_s': 'also write a checkpoint once this many seconds have passed since '
                          'the last one, at an iteration rank 0 chooses for every rank '
                          '(0: off)',
    'checkpoint_signal': 'a signal that asks for a checkpoint now, one of USR1, USR2: every '
                         'rank writes one after the same next iteration, whichever rank or '
                         'the launcher received it (a batch scheduler\'s warning before its '
                         'time limit, e.g. SLURM\'s --signal=B:USR1@120; '
                         'docs/faults.md#a-checkpoint-asked-for-by-a-signal; empty: none)',
    'on_checkpoint_signal': 'after the checkpoint --checkpoint-signal asked for, one of '
                            '%(choices)s: stop ends every rank with exit status 75, to be '
                            'resumed with --resume',
    'max_restarts': 'when the job fails with a status a restart can cure (a rank killed, a '
                    'collective or write timeout, a host or link lost), stop every rank and '
                    'start again from the newest good checkpoint, at most this many times '
                    '(needs --out; docs/faults.md#restarts)',
    'restart_backoff_s': 'wait before each restart, seconds',
    'start_timeout_s': 'a job (with --max-restarts: an attempt) whose ranks have not all '
                       'joined MPI within this many seconds (a host or link down, a rank '
                       'dead before MPI started, a hung start) is stopped, status 4; under '
                       '--max-restarts a failure a restart may cure. Across hosts it needs '
                       '--out (0: never)',
    'resume': 'continue from OUT/checkpoint.h5 instead of starting afresh',
    'overwrite': 'start a new run in an --out that holds another run, replacing its '
                 'checkpoint and outputs (without it such a folder is refused)',
    'write_timeout_s': 'a checkpoint or final-output write this long aborts every rank, '
                       'naming the writer, seconds (0: never)',
    'collective_timeout_s': 'a wait inside a step this long aborts every rank, seconds '
                            '(0: never)',
    'stall_warn_s': 'a wait inside a step this long logs the ranks that have not '
                    'arrived, seconds (0: never)',
    'check_replicas_every': 'iterations between checks that the exchanged parameters are '
                            'identical on every rank (0: off)',
    'out': 'output folder for summary.json, params.npz, curves.png and checkpoint.h5 '
           '(empty: write nothing)',
    'timeline': 'write a Chrome trace of every step to PREFIX.json and PREFIX.png '
                '(empty: none)',
    'eval_every': 'validate every this many epochs (the last epoch always), epochs',
    'quiet': 'print nothing on rank 0 but warnings and errors: no plan, progress or '
             'epoch lines',
    'progress_every': 'when stdout is not a terminal, a progress line every this many '
                      'iterations (0: ten per epoch for epochs of 100 iterations or more; '
                      'a terminal gets one line refreshed in place)',
}

GROUPS = (
    ('model and data', ('model', 'data', 'crop', 'scale_min', 'batch_per_worker', 'seed',
                        'data_seed', 'device')),
    ("the paper's recipe (Goyal et al. 2017; defaults are its ImageNet ones)",
     ('epochs', 'max_steps', 'base_lr', 'ref_batch', 'warmup', 'warmup_epochs',
      'decay_epochs', 'decay_factor', 'momentum', 'momentum_form', 'nesterov',
      'weight_decay')),
    ('exchange', ('sync_type', 'exch_strategy', 'exchange_bn', 'bucket_cap_mb',
                  'first_bucket_cap_mb', 'wire_dtype', 'exchange_path', 'backend', 'topology')),
    ('checkpoints and faults', ('checkpoint', 'checkpoint_every', 'checkpoint_every_s',
                                'checkpoint_signal', 'on_checkpoint_signal',
                                'max_restarts', 'restart_backoff_s', 'start_timeout_s',
                                'resume', 'overwrite',
                                'collective_timeout_s', 'stall_warn_s', 'write_timeout_s',
                                'check_replicas_every')),
    ('output', ('out', 'timeline', 'eval_every', 'quiet', 'progress_every')),
)


# Placeholders in the usage line that say what a value is.
METAVARS = {'model': 'NAME', 'data': 'digits|FILE.h5', 'out': 'DIR', 'timeline': 'PREFIX',
            'decay_epochs': 'E1,E2,..', 'base_lr': 'LR', 'bucket_cap_mb': 'MB',
            'first_bucket_cap_mb': 'MB', 'collective_timeout_s': 'S', 'stall_warn_s': 'S',
            'write_timeout_s': 'S', 'device': 'DEV', 'checkpoint_every_s': 'S',
            'restart_backoff_s': 'S', 'checkpoint_signal': 'SIG', 'start_timeout_s': 'S',
            'max_restarts': 'N',
            'crop': 'PIXELS', 'scale_min': 'FRACTION', 'warmup_epochs': 'EPOCHS',
            'epochs': 'EPOCHS', 'decay_factor': 'X', 'momentum': 'M', 'weight_decay': 'L2',
            'eval_every': 'EPOCHS', 'ref_batch': 'N', 'batch_per_worker': 'N'}


class ModelNames(object):
    """The model zoo's names, read from the registry when first needed.

    Loading the zoo imports Theano, which ``theanompi-ext info`` and a bad
    option should not wait for: argparse only looks at the choices when it
    checks a given ``--model`` or prints the help.
    """

    def _names(self):
        from .. import model
        model._load_zoo()
        return sorted(model.MODELS)

    def __contains__(self, name):
        # the built-in names without Theano: a rank of the user's own mpiexec
        # checks --model before it opens --device (Theano loads on one device)
        from ..model.registry import BUILTIN_NAMES
        return name in BUILTIN_NAMES or name in self._names()

    def __iter__(self):
        return iter(self._names())

    def __str__(self):
        return ', '.join(self._names())


def _choices():
    from ..exchange.modes import SYNC_TYPES, EXCH_STRATEGIES
    from ..update.momentum import FORMS
    from ..update.schedule import WARMUPS
    from .config import WIRE_DTYPES
    from ..step.device import EXCHANGE_PATHS
    from ..collective.registry import host_backends
    from ..collective.two_level import TOPOLOGIES
    from .checkpoint_request import THEN
    return {'on_checkpoint_signal': THEN, 'topology': TOPOLOGIES, 'model': ModelNames(),
            'warmup': WARMUPS, 'momentum_form': FORMS,
            'sync_type': SYNC_TYPES, 'exch_strategy': EXCH_STRATEGIES,
            'wire_dtype': WIRE_DTYPES, 'exchange_path': EXCHANGE_PATHS,
            'backend': host_backends()}


def _parse_bool(s):
    v = str(s).strip().lower()
    if v in ('1', 'true', 'yes', 'on'):
        return True
    if v in ('0', 'false', 'no', 'off'):
        return False
    raise ValueError('expected a boolean (true/false), got %r' % (s,))


def _parse_tuple(s):
    text = str(s).strip().strip('\'"').strip('()[]')
    values = []
    for part in text.replace(',', ' ').split():
        try:
            v = float(part)
        except ValueError:
            v = None
        if v is None or not v.is_integer():     # 2.5 (was cut to 2), inf, nan, 'x'
            raise ValueError('expected whole numbers separated by commas (e.g. 30,60,80; '
                             "'' for none), got %r" % (s,))
        values.append(int(v))
    return tuple(values)


def _argtype(parse):
    """``parse`` for argparse: its ValueError's words in the error, not the
    function's name (``invalid _parse_tuple value``)."""
    def convert(text):
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc))
    return convert


def converter(field):
    """The parser for one TrainConfig field's values."""
    default = field.default
    if isinstance(default, bool):
        return _parse_bool
    if isinstance(default, int):
        return int
    if isinstance(default, float):
        return float
    if isinstance(default, tuple):
        return _parse_tuple
    return str


def _cli_converter(field):
    """:func:`converter` for argparse (ours with their own words; int and float as
    argparse says them: ``invalid int value: 'x'``)."""
    parse = converter(field)
    return _argtype(parse) if parse in (_parse_bool, _parse_tuple) else parse


def add_config_arguments(parser):
    """Add one option per TrainConfig field (defaults left as None = unset),
    each under its group of :data:`GROUPS` with its sentence of :data:`HELP`."""
    fields = {f.name: f for f in dataclasses.fields(TrainConfig) if f.name not in _SKIP}
    placed = [name for _, names in GROUPS for name in names if name in fields]
    groups = [(title, [n for n in names if n in fields]) for title, names in GROUPS]
    rest = [n for n in fields if n not in placed]     # a field no group names yet
    if rest:
        groups.append(('other training options', rest))
    choices = _choices()
    for title, names in groups:
        group = parser.add_argument_group(title)
        for name in names:
            _add_field(group, fields[name], choices.get(name))


def _add_field(group, f, choices):
    flag = '--' + f.name.replace('_', '-')
    default = _DEFAULT_HELP.get(f.name, f.default)
    if isinstance(default, tuple):
        default = ','.join(str(v) for v in default) or 'none'
    elif default == '':
        default = 'empty'
    text = HELP.get(f.name, '')
    text = '%s (default %s)' % (text, default) if text else '(default %s)' % (default,)
    if isinstance(f.default, bool):
        group.add_argument(flag, dest=f.name, nargs='?', const=True, default=None,
                           type=_argtype(_parse_bool), metavar='BOOL', help=text)
    else:
        metavar = METAVARS.get(f.name)
        if metavar is None and choices is None:
            metavar = {int: 'N', float: 'X'}.get(type(f.default), 'VALUE')
        group.add_argument(flag, dest=f.name, default=None, choices=choices,
                           type=_one_of(f.name, choices) if choices else _cli_converter(f),
                           metavar=metavar, help=text)


def _one_of(name, choices):
    """argparse type of a field with a fixed set of values: the error names the
    field as the config file and validation do (``invalid option warmup='x'``)."""
    from ..exchange import modes

    def check(text):
        if name in modes.CHOICES:   # the exchange's vocabulary: its words, as everywhere
            try:
                return modes.check_choice(name, text)
            except modes.ModeError as exc:
                raise argparse.ArgumentTypeError(str(exc))
        if text not in choices:
            raise argparse.ArgumentTypeError('invalid option %s=%r: choose from %s'
                                             % (name, text, ', '.join(choices)))
        return text
    return check


def read_config_lines(path):
    """The lines of the key=value file ``path``; ValueError if it cannot be read as
    text. A byte-order mark (some Windows editors save one) is not the first key's."""
    try:
        with open(path) as fh:
            return fh.read().lstrip('\ufeff').splitlines()
    except OSError as exc:
        raise ValueError('cannot read config file %s: %s' % (path, exc.strerror or exc))
    except UnicodeDecodeError:
        raise ValueError('config file %s is not text' % path)


def read_kv_file(path, known=None):
    """Parse a key=value file (``#`` comments); keys are lower-cased.

    Raises ValueError naming the file and line for malformed lines, and
    both lines of a key given twice (the last would otherwise win silently).
    """
    out, where = {}, {}
    lines = read_config_lines(path)
    for no, raw in enumerate(lines, 1):
        line = raw.split('#', 1)[0].strip()
        if not line:
            continue
        if '=' not in line:
            raise ValueError('%s line %d: expected KEY=VALUE, got %r' % (path, no, raw.strip()))
        key, value = (s.strip() for s in line.split('=', 1))
        if not key:
            raise ValueError('%s line %d: empty key' % (path, no))
        key = key.lower()
        if known is not None and key not in known:
            raise ValueError('%s line %d: unknown key %r (known: %s)'
                             % (path, no, key.upper(), ', '.join(sorted(k.upper() for k in known))))
        if key in where:
            raise ValueError('%s line %d: key %s given twice (line %d already set it)'
                             % (path, no, key.upper(), where[key]))
        where[key] = no
        out[key] = value.strip('"\'')
    return out


def config_from(args, file_values=None):
    """A validated TrainConfig from a key=value dict and parsed options."""
    fields = {f.name: f for f in dataclasses.fields(TrainConfig) if f.name not in _SKIP}
    values = {}
    for key, raw in (file_values or {}).items():
        if key not in fields:
            raise ValueError('unknown config key %r' % key.upper())
        try:
            values[key] = converter(fields[key])(raw)
        except ValueError as exc:
            raise ValueError('config key %s: %s' % (key.upper(), exc))
    for name in fields:
        v = getattr(args, name, None)
        if v is not None:
            values[name] = v
    return TrainConfig(**values).validate()


def config_keys():
    """Lower-case names a config file may use for training options."""
    return {f.name for f in dataclasses.fields(TrainConfig) if f.name not in _SKIP}


def build_parser(prog='theanompi-ext train'):
    """A stand-alone parser with every training option."""
    p = argparse.ArgumentParser(prog=prog)
    add_config_arguments(p)
    return p
