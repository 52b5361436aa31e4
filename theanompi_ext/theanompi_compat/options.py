"""Options of a Theano-MPI model run: defaults, environment names, resolution.

Values come from, in increasing priority: :data:`OPTION_DEFAULTS`, the
model's attributes, a ``tmx_options`` dict on the model, and the
environment ``THEANOMPI_EXT_<NAME>`` (which ``BSP.init`` and the session
launcher set).
"""
import os

from ..buckets.plan import DEFAULT_CAP_MB, DEFAULT_FIRST_CAP_MB
from ..collective.two_level import check_topology
from ..train.checkpoint_request import THEN, canonical_name


def _seconds(text):
    value = float(text)
    if not value >= 0:
        raise ValueError('must be >= 0 seconds')
    return value


def _then(text):
    text = str(text).strip().lower()
    if text not in THEN:
        raise ValueError('choose from %s' % ', '.join(THEN))
    return text

# Options of a contract-model run: name -> (default, parser). Values come
# from, in increasing priority: these defaults, the model's attributes
# (see :func:`resolve_options`), a ``tmx_options`` dict on the model, the
# environment ``THEANOMPI_EXT_<NAME>`` (which BSP.init and tmlauncher set).
OPTION_DEFAULTS = {
    'batch_per_worker': (0, int),      # 0: model.batch_size
    'ref_batch': (0, int),             # 0: batch_per_worker (base_lr tuned for one worker)
    'warmup': ('gradual', str),
    'warmup_epochs': (-1.0, float),    # -1: min(5, n_epochs / 2)
    'momentum_form': ('eq9', str),
    'weight_decay': (-1.0, float),     # -1: model.eta
    'momentum': (-1.0, float),         # -1: model.mu
    'exchange_bn': (False, lambda s: str(s).strip().lower() in ('1', 'true', 'yes', 'on')),
    'bucket_cap_mb': (DEFAULT_CAP_MB, float),
    'first_bucket_cap_mb': (DEFAULT_FIRST_CAP_MB, float),
    'wire_dtype': ('float32', str),    # float16/bfloat16: 16-bit wire, float32 sums
    'max_steps': (0, int),             # 0: whole epochs (tests use a few steps)
    'out': ('', str),                  # rank 0 writes params.npz, summary.json, record, snapshots
    'snapshot_freq': (5, int),         # epochs between HDF5 snapshots in OUT/snapshots (0: none)
    # As the trainer's (train --collective-timeout-s ...): a wait inside a step this
    # long aborts every rank, this long logs who has not arrived (0: never).
    'collective_timeout_s': (30.0, float),
    'stall_warn_s': (10.0, float),
    # Under max_restarts: rank 0's checkpoint write this long aborts the job (0: never).
    'write_timeout_s': (300.0, float),
    'timeline': ('', str),             # PREFIX: rank 0 writes PREFIX.json/.png (per-step lanes)
    # How an allreduce spans hosts (collective/two_level.py), as `train --topology`.
    # Read from the environment only: the communicator exists before the model loads.
    'topology': ('auto', lambda s: check_topology(str(s).strip())),
    # As `train --checkpoint-signal USR1 --on-checkpoint-signal stop` (needs out):
    # the signal makes every rank write OUT/checkpoint.h5 after the same next
    # iteration; then the run goes on, or every rank stops with 75 (resume=True).
    # Caught as each rank starts: chosen before the model loads.
    'checkpoint_signal': ('', canonical_name),
    'on_checkpoint_signal': ('continue', _then),
    # As `train --checkpoint-every-s` (needs out): also a checkpoint once this many
    # seconds have passed since the last, after an iteration rank 0 chooses (0: off).
    'checkpoint_every_s': (0.0, _seconds),
}
#: Options fixed before the model file is imported, or checked before any rank starts:
#: a model's tmx_options cannot set them.
BEFORE_MODEL = ('topology', 'checkpoint_signal', 'on_checkpoint_signal', 'checkpoint_every_s')
ENV_PREFIX = 'THEANOMPI_EXT_'


def option_env_name(name):
    """The environment variable carrying option ``name`` to the ranks."""
    return ENV_PREFIX + name.upper()


def early_option(name, environ=None):
    """Option ``name`` of :data:`BEFORE_MODEL` from the environment (or its default),
    parsed; a bad value is a ValueError naming the variable."""
    environ = os.environ if environ is None else environ
    default, parse = OPTION_DEFAULTS[name]
    raw = environ.get(option_env_name(name))
    if raw in (None, ''):
        return default
    try:
        return parse(raw)
    except ValueError as exc:
        raise ValueError('option %s=%r: %s' % (option_env_name(name), raw, exc))


def resolve_options(model, environ=None):
    """The run's options as a dict (see :data:`OPTION_DEFAULTS`), filled in from the model."""
    environ = os.environ if environ is None else environ
    opts = {k: v[0] for k, v in OPTION_DEFAULTS.items()}
    model_opts = getattr(model, 'tmx_options', None) or {}
    for key in BEFORE_MODEL:
        if key in model_opts:
            raise ValueError('tmx_options[%r]: chosen before the model loads; set it as the '
                             "rule's option or %s instead" % (key, option_env_name(key)))
    opts.update(model_opts)
    for key, (_, parse) in OPTION_DEFAULTS.items():
        raw = environ.get(option_env_name(key))
        if raw not in (None, ''):
            try:
                opts[key] = parse(raw)
            except ValueError:
                raise ValueError('option %s=%r: expected %s' % (option_env_name(key), raw,
                                                                 OPTION_DEFAULTS[key][0].__class__.__name__))
    if opts['batch_per_worker'] <= 0:
        n = getattr(model, 'batch_size', None)
        if not n:
            raise ValueError('cannot tell the per-worker batch size: the model has no '
                             'batch_size attribute; set %s' % option_env_name('batch_per_worker'))
        opts['batch_per_worker'] = int(n)
    if opts['ref_batch'] <= 0:
        opts['ref_batch'] = opts['batch_per_worker']
    n_epochs = int(model.n_epochs)
    if opts['warmup_epochs'] < 0:
        opts['warmup_epochs'] = min(5.0, n_epochs / 2.0)
    if opts['weight_decay'] < 0:
        opts['weight_decay'] = float(getattr(model, 'eta', 0.0) or 0.0)
    if opts['momentum'] < 0:
        opts['momentum'] = float(getattr(model, 'mu', 0.0) or 0.0)
    opts['nesterov'] = bool(getattr(model, 'use_nesterov_momentum', False))
    opts['base_lr'] = float(model.base_lr)
    return opts
