"""Training options, validated before anything is compiled or launched."""
import dataclasses
import math
from dataclasses import dataclass, field, fields

from ..update.schedule import WARMUPS
from ..update.momentum import FORMS
from ..buckets.plan import DEFAULT_CAP_MB, DEFAULT_FIRST_CAP_MB
from ..collective.wire import WIRE_DTYPES
from ..exchange.modes import check_mode, default_strategy
from .checkpoint_request import THEN, canonical_name


@dataclass
class TrainConfig(object):
    """Every option of a training run (see ``docs/usage.md``)."""
    model: str = 'digits_cnn'
    data: str = 'digits'                 # 'digits' or a path to an HDF5 file
    crop: int = 0                        # HDF5 data: crop side (0 = stored size)
    scale_min: float = 0.08              # random-resized crop area range [scale_min, 1]
    batch_per_worker: int = 32           # n
    epochs: int = 10
    base_lr: float = 0.1                 # at ref_batch
    ref_batch: int = 256
    warmup: str = 'gradual'
    warmup_epochs: float = 5.0
    decay_epochs: tuple = (30, 60, 80)
    decay_factor: float = 0.1
    momentum: float = 0.9
    momentum_form: str = 'eq9'
    nesterov: bool = False
    weight_decay: float = 1e-4
    sync_type: str = 'kn'
    exch_strategy: str = ''              # '': ar-overlap for kn, ar for avg/cdd
    exchange_bn: bool = False
    bucket_cap_mb: float = DEFAULT_CAP_MB              # see buckets/plan.py
    first_bucket_cap_mb: float = DEFAULT_FIRST_CAP_MB
    wire_dtype: str = 'float32'          # what gradient buckets travel as (summed in float32)
    seed: int = 0                        # model init
    data_seed: int = 0                   # per-epoch shuffles
    max_steps: int = 0                   # 0: whole epochs
    eval_every: int = 1                  # epochs
    out: str = ''
    checkpoint: bool = True              # write out/checkpoint.h5 (needs out)
    checkpoint_every: int = 0            # iterations between checkpoints (0: each epoch)
    checkpoint_every_s: float = 0.0      # also a checkpoint once this many seconds passed (0: off)
    checkpoint_signal: str = ''          # USR1/USR2: a checkpoint at the next iteration ('': none)
    on_checkpoint_signal: str = 'continue'   # after it: continue, or stop (exit status 75)
    max_restarts: int = 0                # restarts from the last good checkpoint (train/restarts.py)
    restart_backoff_s: float = 1.0       # wait before each restart, seconds
    start_timeout_s: float = 300.0       # a job (attempt) not started by then is stopped
    resume: bool = False
    overwrite: bool = False              # start a new run in an --out holding another one
    timeline: str = ''
    quiet: bool = False
    progress_every: int = 0              # iterations between progress lines off a terminal (0: auto)
    collective_timeout_s: float = 30.0   # a wait inside a step this long aborts (0: never)
    stall_warn_s: float = 10.0           # ... this long logs who has not arrived (0: never)
    check_replicas_every: int = 0        # steps between replica checks (0: off)
    write_timeout_s: float = 300.0       # a checkpoint/output write this long aborts (0: never)
    device: str = 'cpu'                  # cpu, cuda0, opencl0:0, or one per rank: cuda0,cuda1
    exchange_path: str = 'auto'          # device buffers: auto, host-staged or nccl
    backend: str = 'auto'                # collective backend (collective/registry.py)
    topology: str = 'auto'               # flat, two-level or auto (collective/two_level.py)
    extra: dict = field(default_factory=dict)

    def validate(self):
        """Raise ValueError naming the first bad option; return a checked, normalised copy.

        This object is left as it is: use the returned one (see :meth:`normalised`).
        """
        cfg = self.normalised()
        cfg._check()
        return cfg

    def normalised(self):
        """A copy with the defaults that depend on other options filled in
        (``exch_strategy``), ``decay_epochs`` a tuple and ``device`` in its
        canonical spelling; nothing is checked here (:meth:`validate` does)."""
        from ..engine.devices import parse_device_list
        cfg = dataclasses.replace(self)
        if cfg.exch_strategy == '':
            # The default: overlap wherever it exists (the old rules
            # exchange parameters or momenta after the local step).
            cfg.exch_strategy = default_strategy(cfg.sync_type)
        if isinstance(cfg.decay_epochs, list):
            cfg.decay_epochs = tuple(cfg.decay_epochs)
        try:
            cfg.device = ','.join(parse_device_list(cfg.device))
        except ValueError:
            pass            # left as given: _check names it
        try:
            cfg.checkpoint_signal = canonical_name(cfg.checkpoint_signal)
        except ValueError:
            pass            # the same
        return cfg

    def _check(self):
        # One group of options per method, each readable on its own.
        self._check_types()
        self._check_schedule()
        self._check_update_and_exchange()
        self._check_run()

    def _bad(self, name, why):
        raise ValueError('invalid option %s=%r: %s' % (name, getattr(self, name), why))

    def _check_types(self):
        for f in fields(self):
            v = getattr(self, f.name)
            # NaN passes every comparison check below, and inf some of them
            if isinstance(f.default, float) and not (
                    isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)):
                self._bad(f.name, 'must be a finite number')
        for name in ('batch_per_worker', 'epochs', 'ref_batch', 'eval_every'):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                self._bad(name, 'must be a positive integer')
        for name in ('check_replicas_every', 'progress_every', 'max_restarts'):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                self._bad(name, 'must be an integer >= 0 (0: %s)'
                          % ('automatic' if name == 'progress_every' else 'off'))

    def _check_schedule(self):
        bad = self._bad
        if not (isinstance(self.base_lr, (int, float)) and self.base_lr > 0):
            bad('base_lr', 'the learning rate must be > 0')
        if self.warmup not in WARMUPS:
            bad('warmup', 'choose from %s' % (WARMUPS,))
        if self.warmup != 'none' and not 0 <= self.warmup_epochs < self.epochs:
            bad('warmup_epochs', 'warm-up must be >= 0 and shorter than training '
                '(%d epochs)' % self.epochs)
        if not 0 < self.decay_factor <= 1:
            bad('decay_factor', 'must be in (0, 1]')
        d = self.decay_epochs
        if not isinstance(d, tuple) or any(
                not isinstance(e, int) or isinstance(e, bool) or e < 1 for e in d) \
                or any(a >= b for a, b in zip(d, d[1:])):
            bad('decay_epochs', 'must be strictly increasing whole epochs >= 1, '
                'e.g. 30,60,80 (empty: no decay)')

    def _check_update_and_exchange(self):
        from ..collective.registry import backend_names, host_backends
        from ..step.device import EXCHANGE_PATHS
        bad = self._bad
        if self.momentum_form not in FORMS:
            bad('momentum_form', 'choose from %s' % (FORMS,))
        if not 0 <= self.momentum < 1:
            bad('momentum', 'must be in [0, 1)')
        if self.weight_decay < 0:
            bad('weight_decay', 'must be >= 0')
        if self.wire_dtype not in WIRE_DTYPES:
            bad('wire_dtype', 'choose from %s' % (WIRE_DTYPES,))
        check_mode(self.sync_type, self.exch_strategy, self.wire_dtype)
        if self.bucket_cap_mb <= 0 or self.first_bucket_cap_mb <= 0:
            bad('bucket_cap_mb', 'bucket caps must be > 0')
        if self.exchange_path not in EXCHANGE_PATHS:
            bad('exchange_path', 'choose from %s' % (EXCHANGE_PATHS,))
        from ..collective.two_level import TOPOLOGIES
        if self.topology not in TOPOLOGIES:
            bad('topology', 'choose from %s' % (TOPOLOGIES,))
        if self.backend not in host_backends():
            bad('backend', 'choose from %s%s' % (host_backends(), (
                ' (%s sums device arrays; the trainer exchanges host buffers, or device '
                'buckets through --exchange-path)' % self.backend)
                if self.backend in backend_names() else ''))

    def _check_run(self):
        from ..engine.devices import parse_device_list
        bad = self._bad
        if self.max_steps < 0:
            bad('max_steps', 'must be >= 0')
        if self.checkpoint_every < 0:
            bad('checkpoint_every', 'must be >= 0')
        if not 0 < self.scale_min <= 1:
            bad('scale_min', 'must be in (0, 1]')
        if self.crop < 0:
            bad('crop', 'must be >= 0')
        for name in ('collective_timeout_s', 'stall_warn_s', 'write_timeout_s',
                     'checkpoint_every_s', 'restart_backoff_s', 'start_timeout_s'):
            if getattr(self, name) < 0:
                bad(name, 'must be a number of seconds >= 0 (0: off)')
        try:
            parse_device_list(self.device)
        except ValueError as exc:
            bad('device', str(exc))
        if self.resume and not self.out:
            bad('resume', 'needs --out, the folder holding checkpoint.h5')
        if self.max_restarts and not (self.out and self.checkpoint):
            bad('max_restarts', 'a restart resumes from OUT/checkpoint.h5: needs --out and '
                'checkpoints (--checkpoint true)')
        self._check_checkpoint_signal()
        if self.resume and self.overwrite:
            bad('overwrite', '--resume continues the run in --out, --overwrite replaces it: '
                'choose one')

    def _check_checkpoint_signal(self):
        try:
            canonical_name(self.checkpoint_signal)
        except ValueError as exc:
            self._bad('checkpoint_signal', str(exc))
        if self.on_checkpoint_signal not in THEN:
            self._bad('on_checkpoint_signal', 'choose from %s' % (THEN,))
        if self.checkpoint_signal and not (self.out and self.checkpoint):
            self._bad('checkpoint_signal', 'a checkpoint is written to OUT/checkpoint.h5: '
                      'needs --out and checkpoints (--checkpoint true)')
        if self.on_checkpoint_signal == 'stop' and not self.checkpoint_signal:
            self._bad('on_checkpoint_signal', 'stop after the checkpoint of which signal? '
                      'Name it with --checkpoint-signal USR1')

    def total_iterations(self, iters_per_epoch):
        """The iterations the run trains for: every epoch's, cut at ``max_steps``."""
        total = self.epochs * iters_per_epoch
        return min(total, self.max_steps) if self.max_steps else total

    def to_dict(self):
        """Plain dict (JSON-able)."""
        d = dataclasses.asdict(self)
        d['decay_epochs'] = list(self.decay_epochs)
        return d

    @classmethod
    def from_dict(cls, d):
        """Build from a dict, refusing unknown keys by name."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError('unknown option(s): %s' % ', '.join(unknown))
        d = dict(d)
        if 'decay_epochs' in d:
            d['decay_epochs'] = tuple(d['decay_epochs'])
        return cls(**d)
