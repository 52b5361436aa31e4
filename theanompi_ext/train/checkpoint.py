"""Checkpoints in HDF5 (no pickle), sealed with a checksum, written atomically by rank 0.

Layout of ``checkpoint.h5``::

    user block (512 bytes): SHA-256 and length of the rest (sealed.seal)
    attrs: format_version, model, iteration, workers, sync_type, n_exch,
           names, shapes (JSON), config, history, partial (JSON)
    shared/values          exchanged parameters (identical on every rank)
    shared/velocity        kn rule: their momentum (identical on every rank)
    rank<r>/values_tail    rank r's locally updated parameters (BN gamma/beta)
    rank<r>/velocity       rank r's momentum (kn: only the local tail, since
                           the exchanged part is identical; avg/cdd: all of it)
    rank<r>/lr_prev        the rate of the last step (momentum correction)
    rank<r>/stats/<name>   rank r's BN running statistics

Writing: the file is built in memory, sealed, and written by
:func:`theanompi_ext.files.atomic.write_atomic` (free space checked, one write,
fsync, ``os.replace``); the version it replaces becomes
``checkpoint.prev.h5`` (a hard link), so the last two good checkpoints are
on disk. A state with a NaN or infinity on any rank is never written
(:class:`DivergedState`, exit status 3): the newest checkpoint is finite.

Reading (``--resume``): the checksum is verified before HDF5 reads a byte
(flipped bytes, a truncated file: refused, exit status 2, with the command
that resumes from the previous checkpoint when that one is good), then the
model, the rank count and every option that changes the trajectory must
match (:data:`RESUME_MAY_CHANGE` lists the ones that may differ).
"""
import io
import json
import os

import numpy as np

from ..files import atomic, sealed
from ..errors import CheckpointError, CorruptFile, DivergedState

FORMAT_VERSION = 2
FILENAME = 'checkpoint.h5'
#: The previous good checkpoint, kept beside the newest.
PREV_FILENAME = 'checkpoint.prev.h5'
#: Options that may differ on --resume: they change what is run or reported,
#: not the trajectory (epochs and max_steps move the end of training; the
#: schedule depends only on warm-up and decay epochs). Every other option
#: must match the checkpoint's.
RESUME_MAY_CHANGE = frozenset((
    'epochs', 'max_steps', 'eval_every', 'out', 'checkpoint', 'checkpoint_every', 'resume',
    'overwrite', 'timeline', 'quiet', 'progress_every', 'collective_timeout_s', 'stall_warn_s',
    'write_timeout_s', 'check_replicas_every', 'bucket_cap_mb', 'first_bucket_cap_mb',
    'backend', 'checkpoint_every_s', 'checkpoint_signal', 'on_checkpoint_signal',
    'max_restarts', 'restart_backoff_s', 'start_timeout_s'))


def rank_state(trainer):
    """This rank's part of the state that differs between ranks."""
    rule_state = trainer.rule.state()
    vel = rule_state['velocity']
    if trainer.rule.sync_type == 'kn':
        vel = vel[trainer.n_exch:]
    st = {'values_tail': trainer.params.values[trainer.n_exch:].copy(),
          'velocity': np.asarray(vel, np.float32).copy(),
          'lr_prev': float(rule_state['lr_prev']),
          'stats': {s.name: s.get_value().copy() for s in trainer.net.stats}}
    # The exchanged part is identical on every rank, so each checks it too.
    parts = [('parameters', trainer.params.values), ('momentum', rule_state['velocity']),
             ('lr_prev', [st['lr_prev']])] + [('BN statistic ' + k, v)
                                              for k, v in st['stats'].items()]
    st['not_finite'] = [name for name, v in parts if not np.all(np.isfinite(v))]
    return st


def check_finite(states, iteration, path):
    """Raise :class:`DivergedState` (on every rank alike) if any rank's state is not finite."""
    bad = ['rank %d: %s' % (r, ', '.join(st['not_finite']))
           for r, st in enumerate(states) if st['not_finite']]
    if bad:
        kept = ('%s still holds the last good checkpoint' % path if os.path.exists(path)
                else 'no checkpoint was written')
        raise DivergedState('the state after iteration %d is not finite (%s); it was not '
                            'saved: %s' % (iteration, '; '.join(bad), kept))


def build(trainer, states, partial=None):
    """The sealed file (a buffer) of a checkpoint of ``trainer`` with every rank's ``states``."""
    import h5py
    buf = io.BytesIO()
    with h5py.File(buf, 'w', userblock_size=sealed.USERBLOCK) as f:
        lay = trainer.layout
        f.attrs.update(dict(
            format_version=FORMAT_VERSION, model=trainer.cfg.model,
            iteration=trainer.iteration, workers=trainer.comm.size,
            sync_type=trainer.cfg.sync_type, n_exch=trainer.n_exch,
            names=json.dumps(lay.names), shapes=json.dumps(lay.shapes),
            config=json.dumps(trainer.cfg.to_dict()),
            history=json.dumps(trainer.history), partial=json.dumps(partial or {})))
        f['shared/values'] = trainer.params.values[:trainer.n_exch]
        if trainer.rule.sync_type == 'kn':
            f['shared/velocity'] = trainer.rule.state()['velocity'][:trainer.n_exch]
        for r, st in enumerate(states):
            g = f.create_group('rank%d' % r)
            g['values_tail'] = st['values_tail']
            g['velocity'] = st['velocity']
            g['lr_prev'] = st['lr_prev']
            for name, val in st['stats'].items():
                g['stats/' + name] = val
    return sealed.seal(buf.getbuffer())      # in place: one copy of the state in memory


def save(trainer, path, partial=None, in_write=None):
    """Gather every rank's state and write ``path`` atomically from rank 0.

    Every rank raises :class:`DivergedState` if any state is not finite
    (nothing is written); rank 0 raises :class:`~theanompi_ext.errors.WriteError`
    when the disk refuses (the previous checkpoint stays). ``in_write(path,
    data)``: the fault-injection hook of the tests (``train/attempt.py``).
    """
    states = trainer.comm.allgather(rank_state(trainer))
    check_finite(states, trainer.iteration, path)
    if trainer.comm.rank != 0:
        if in_write:
            in_write(path)
        return
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    data = build(trainer, states, partial)
    if in_write:
        in_write(path, data)
    atomic.write_atomic(path, data, 'the checkpoint',
                        keep_previous=os.path.join(folder, PREV_FILENAME))


def read(path):
    """The open (in-memory) HDF5 file of the verified checkpoint ``path``.

    Raises :class:`CheckpointError`: missing, unreadable, or corrupt (the
    message then says how to resume from the previous checkpoint if it is good).
    """
    import h5py
    if not os.path.exists(path):
        raise CheckpointError('%s: no checkpoint to resume from' % path)
    try:
        data = sealed.read_sealed(path)
    except CorruptFile as exc:
        raise CheckpointError('%s; %s' % (exc, _fallback(path)))
    except OSError as exc:
        raise CheckpointError('%s: cannot read the checkpoint: %s' % (path, exc.strerror or exc))
    try:
        return h5py.File(io.BytesIO(data), 'r')
    except OSError as exc:
        raise CheckpointError('%s: not a readable checkpoint (%s)' % (path, exc))


def _fallback(path):
    """What to do about a corrupt ``path``: the previous checkpoint, if it is good."""
    prev = os.path.join(os.path.dirname(os.path.abspath(path)), PREV_FILENAME)
    if os.path.basename(path) == PREV_FILENAME or not os.path.exists(prev):
        return 'no previous checkpoint to fall back on: start again with --overwrite'
    try:
        import h5py
        with h5py.File(io.BytesIO(sealed.read_sealed(prev)), 'r') as f:
            it = int(f.attrs['iteration'])
    except (OSError, ValueError, KeyError) as exc:
        return 'the previous checkpoint %s is not good either (%s): start again with ' \
               '--overwrite' % (prev, exc)
    return ('the previous checkpoint %s (iteration %d) is good: to resume from it, run '
            '`mv %s %s` and repeat the command with --resume' % (prev, it, prev, path))


def check_options(path, saved, cfg):
    """Refuse to resume with an option that changes the trajectory (named in the message).

    ``saved``: the checkpoint's config dict; ``cfg``: this run's TrainConfig.
    """
    from .config import TrainConfig
    # compared as validated (derived defaults such as exch_strategy filled in)
    saved, now = _validated(saved), _validated(cfg.to_dict())
    default = TrainConfig().validate().to_dict()
    diffs = []
    for key in sorted(set(saved) | set(now)):
        if key in RESUME_MAY_CHANGE:
            continue
        a, b = saved.get(key, default.get(key)), now.get(key, default.get(key))
        if a != b:
            diffs.append('--%s %s (the checkpoint has %s)' % (key.replace('_', '-'),
                                                              _show(b), _show(a)))
    if diffs:
        raise CheckpointError(
            '%s: resuming with options that change the training trajectory: %s; resume with '
            'the checkpoint\'s values, or start again with --overwrite (only %s may change '
            'on --resume)' % (path, '; '.join(diffs),
                              ', '.join(sorted(k.replace('_', '-') for k in RESUME_MAY_CHANGE
                                               if k not in ('resume', 'overwrite')))))


def _validated(d):
    from .config import TrainConfig
    try:
        return TrainConfig.from_dict(d).validate().to_dict()
    except (TypeError, ValueError):    # keys of another version: compare as they are
        return d


def _show(v):
    return json.dumps(v) if isinstance(v, (dict, list)) else str(v)


def describe(path):
    """``{'iteration', 'model', 'workers', 'config'}`` of a verified checkpoint (CheckpointError)."""
    with read(path) as f:
        try:
            a = f.attrs
            return {'iteration': int(a['iteration']), 'model': str(a['model']),
                    'workers': int(a['workers']), 'config': json.loads(a['config'])}
        except (KeyError, ValueError) as exc:
            raise CheckpointError('%s: missing or bad field %s (not a checkpoint)' % (path, exc))


def load(trainer, path):
    """Restore ``trainer`` (this rank's part) from ``path``; returns the partial-epoch record."""
    with read(path) as f:
        try:
            a = dict(f.attrs)
            if int(a['format_version']) != FORMAT_VERSION:
                raise CheckpointError('%s: format version %s, expected %d'
                                      % (path, a['format_version'], FORMAT_VERSION))
            names, shapes = json.loads(a['names']), [tuple(s) for s in json.loads(a['shapes'])]
            lay = trainer.layout
            if names != lay.names or shapes != [tuple(s) for s in lay.shapes]:
                diff = next(((n, s, m, t) for n, s, m, t in
                             zip(names, shapes, lay.names, lay.shapes) if (n, s) != (m, tuple(t))),
                            None)
                raise CheckpointError(
                    '%s: checkpoint of another model (%s, %d parameters) does not fit %s '
                    '(%d parameters)%s' % (path, a['model'], len(names), trainer.cfg.model,
                                           len(lay.names),
                                           '; first difference: %s %s vs %s %s' % diff
                                           if diff else ''))
            if int(a['workers']) != trainer.comm.size:
                raise CheckpointError(
                    '%s: written by %d ranks; resuming with %d is not supported (BN state and '
                    'data shards belong to ranks, and the schedule depends on kn): resume with '
                    '%d workers' % (path, a['workers'], trainer.comm.size, a['workers']))
            if a['sync_type'] != trainer.cfg.sync_type:
                raise CheckpointError('%s: written with sync_type=%s, this run uses %s'
                                      % (path, a['sync_type'], trainer.cfg.sync_type))
            check_options(path, json.loads(a['config']), trainer.cfg)
            g = f['rank%d' % trainer.comm.rank]
            vals = trainer.params.values
            vals[:trainer.n_exch] = f['shared/values'][...]
            vals[trainer.n_exch:] = g['values_tail'][...]
            vel = g['velocity'][...]
            state = trainer.rule.state()
            full = state['velocity']
            if trainer.rule.sync_type == 'kn':
                # the exchanged part of the momentum is identical on every rank
                full[:trainer.n_exch] = f['shared/velocity'][...]
                full[trainer.n_exch:] = vel
            else:
                full[...] = vel
            trainer.rule.load_state({'velocity': full, 'lr_prev': float(g['lr_prev'][()])})
            for s in trainer.net.stats:
                s.set_value(g['stats/' + s.name][...])
            trainer.iteration = int(a['iteration'])
            trainer.history = json.loads(a['history'])
            partial = json.loads(a['partial'])
        except KeyError as exc:
            raise CheckpointError('%s: missing field %s (truncated or not a checkpoint)'
                                  % (path, exc))
    trainer.params.push()
    return partial
