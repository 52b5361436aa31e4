"""Checkpoints in HDF5 (no pickle), written atomically by rank 0.

Layout of ``checkpoint.h5``::

    attrs: format_version, model, iteration, workers, sync_type, n_exch,
           names, shapes (JSON), config, history, partial (JSON)
    shared/values          exchanged parameters (identical on every rank)
    shared/velocity        kn rule: their momentum (identical on every rank)
    rank<r>/values_tail    rank r's locally updated parameters (BN gamma/beta)
    rank<r>/velocity       rank r's momentum (kn: only the local tail, since
                           the exchanged part is identical; avg/cdd: all of it)
    rank<r>/lr_prev        the rate of the last step (momentum correction)
    rank<r>/stats/<name>   rank r's BN running statistics

Writing: a temporary file in the same folder, flushed and fsynced, then
``os.replace`` over the previous checkpoint and an fsync of the folder, so a
crash at any moment leaves either the old or the new checkpoint, whole.

Resuming with a different number of ranks is refused: BN state and the
per-epoch shards belong to ranks, and the schedule depends on kn.
"""
import json
import os

import numpy as np

FORMAT_VERSION = 1
FILENAME = 'checkpoint.h5'


class CheckpointError(ValueError):
    """A checkpoint that cannot be used, with the file and the reason."""
    all_ranks = True


def rank_state(trainer):
    """This rank's part of the state that differs between ranks."""
    rule_state = trainer.rule.state()
    vel = rule_state['velocity']
    if trainer.rule.sync_type == 'kn':
        vel = vel[trainer.n_exch:]
    return {'values_tail': trainer.params.values[trainer.n_exch:].copy(),
            'velocity': np.asarray(vel, np.float32).copy(),
            'lr_prev': float(rule_state['lr_prev']),
            'stats': {s.name: s.get_value().copy() for s in trainer.net.stats}}


def save(trainer, path, partial=None):
    """Gather every rank's state and write ``path`` atomically from rank 0."""
    states = trainer.comm.allgather(rank_state(trainer))
    if trainer.comm.rank != 0:
        return
    import h5py
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = '%s.tmp-%d' % (path, os.getpid())
    try:
        with h5py.File(tmp, 'w') as f:
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
            f.flush()
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _read(path):
    import h5py
    if not os.path.exists(path):
        raise CheckpointError('%s: no checkpoint to resume from' % path)
    try:
        return h5py.File(path, 'r')
    except OSError as exc:
        raise CheckpointError('%s: not a readable checkpoint (%s)' % (path, exc))


def load(trainer, path):
    """Restore ``trainer`` (this rank's part) from ``path``; returns the partial-epoch record."""
    with _read(path) as f:
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
