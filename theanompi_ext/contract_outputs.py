"""What a Theano-MPI user finds after a contract-model run, in ``OUT`` (rank 0).

* ``OUT/record.json``: the per-epoch record Theano-MPI's recorder keeps
  (train loss and error, validation loss and error, learning rate,
  iterations, and the seconds per recorder mode: ``calc``/``wait`` as the
  model's own ``train_iter`` times them, ``calc+comm`` for our step, and
  the epoch's wall time), as JSON (not pickle), rewritten whole after each
  epoch;
* ``OUT/record.png``: its plot (loss, error, learning rate per epoch);
* ``OUT/snapshots/params_epochNNN.h5``: the parameters every
  ``SNAPSHOT_FREQ`` epochs (and after the last), one dataset per parameter
  in ``model.params`` order, named ``NNN_name``, attributes ``epoch`` and
  ``iterations``.

Every file is written to a temporary name, fsynced and renamed, so a file
that exists is whole.
"""
import json
import os

RECORD = 'record.json'
PLOT = 'record.png'
SNAPSHOTS = 'snapshots'


def _replace_synced(tmp, path):
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def write_record(out, history, title=None):
    """Write ``record.json`` and its plot ``record.png`` for the epochs so far."""
    from .train.report import plot_curves, write_plot_safely
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, RECORD)
    tmp = '%s.tmp-%d' % (path, os.getpid())
    with open(tmp, 'w') as f:
        json.dump({'format': 'theanompi_ext contract record', 'epochs': history}, f,
                  indent=1, default=float)
        f.flush()
    _replace_synced(tmp, path)
    plotted = [dict(h, val_top1=h.get('val_err')) for h in history]
    write_plot_safely(plot_curves, os.path.join(out, PLOT), plotted, None, title)
    return path


def read_record(out):
    """The epoch records of ``OUT/record.json`` (ValueError naming a broken file)."""
    path = os.path.join(out, RECORD)
    try:
        with open(path) as f:
            return json.load(f)['epochs']
    except (OSError, ValueError, KeyError) as exc:
        raise ValueError('%s is not a readable run record: %s' % (path, exc))


def snapshot_due(epoch, n_epochs, freq):
    """True after epoch ``epoch`` (1-based) when a snapshot is due."""
    return freq > 0 and (epoch % freq == 0 or epoch == n_epochs)


def save_snapshot(out, epoch, iterations, names, values):
    """Write ``snapshots/params_epochNNN.h5`` (``names``/``values`` in model.params order)."""
    import h5py
    folder = os.path.join(out, SNAPSHOTS)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, 'params_epoch%03d.h5' % epoch)
    tmp = '%s.tmp-%d' % (path, os.getpid())
    try:
        with h5py.File(tmp, 'w') as f:
            f.attrs['epoch'] = epoch
            f.attrs['iterations'] = iterations
            for i, (name, value) in enumerate(zip(names, values)):
                f['%03d_%s' % (i, name or 'param')] = value
        _replace_synced(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path
