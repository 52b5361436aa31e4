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

Every file goes through :mod:`theanompi_ext.files.atomic` (built in memory, free
space checked, written to a temporary name, fsynced and renamed), so a file
that exists is whole; snapshots are sealed with their checksum like the
checkpoints (``sealed.read_sealed`` verifies one before it is read).
"""
import io
import json
import os

from ..files import atomic, sealed

RECORD = 'record.json'
PLOT = 'record.png'
SNAPSHOTS = 'snapshots'


def write_record(out, history, title=None):
    """Write ``record.json`` and its plot ``record.png`` for the epochs so far."""
    from ..train.report import plot_curves, render_png
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, RECORD)
    files = {path: json.dumps({'format': 'theanompi_ext contract record', 'epochs': history},
                              indent=1, default=float).encode()}
    plotted = [dict(h, val_top1=h.get('val_err')) for h in history]
    png = render_png(plot_curves, os.path.join(out, PLOT), plotted, None, title)
    if png is not None:
        files[os.path.join(out, PLOT)] = png
    atomic.write_all(files, 'the run record')
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
    buf = io.BytesIO()
    with h5py.File(buf, 'w', userblock_size=sealed.USERBLOCK) as f:
        f.attrs['epoch'] = epoch
        f.attrs['iterations'] = iterations
        for i, (name, value) in enumerate(zip(names, values)):
            f['%03d_%s' % (i, name or 'param')] = value
    return atomic.write_atomic(path, sealed.seal(buf.getbuffer()), 'the parameter snapshot')
