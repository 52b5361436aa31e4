"""Plots of a training run's curves (``OUT/curves.png``).

Written by rank 0 at the end of ``theanompi-ext train`` when ``--out`` is
set: training loss, training error with validation top-1/top-5 error, and
the learning rate, all against epochs. Uses matplotlib's Agg canvas
directly (no ``pyplot``), so nothing depends on a display or on a global
backend choice made elsewhere in the process.
"""
import os
import sys

FILENAME = 'curves.png'


def new_figure(width, height):
    """A matplotlib ``Figure`` on an Agg canvas (no pyplot state)."""
    from matplotlib.figure import Figure
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def series(history, key):
    """``(epochs, values)`` of the epoch records in ``history`` that have ``key``."""
    rows = [(h['epoch'], h[key]) for h in history if h.get(key) is not None]
    return [r[0] for r in rows], [r[1] for r in rows]


def lr_curve(schedule, iterations):
    """Per-iteration learning rate as ``(epoch positions, lrs)``.

    Iteration ``i`` is drawn at epoch ``(i + 1) / iters_per_epoch`` so that
    the curve lines up with the per-epoch records (epoch e ends at x = e).
    A long run is subsampled to at most about 2000 points.
    """
    its = max(int(iterations), 0)
    stride = max(1, its // 2000)
    idx = list(range(0, its, stride))
    if its and idx[-1] != its - 1:
        idx.append(its - 1)
    ipe = float(schedule.iters_per_epoch)
    return [(i + 1) / ipe for i in idx], [schedule.lr(i) for i in idx]


def plot_curves(path, history, lr_iter=None, title=None):
    """Write a 2x2 PNG of the curves in ``history`` (the summary's epoch records).

    Panels: training loss; training error and validation top-1/top-5 error;
    learning rate per epoch (with the per-iteration rate ``lr_iter`` =
    ``(x, lr)`` drawn under it when given, which shows the gradual warm-up);
    validation error on a log scale (small errors are otherwise flat).
    Returns ``path``.
    """
    fig = new_figure(11, 7.5)
    axes = fig.subplots(2, 2)
    if title:
        fig.suptitle(title, fontsize=10)
    ax = axes[0, 0]
    ax.plot(*series(history, 'train_loss'), 'o-', ms=3, label='train loss')
    ax.plot(*series(history, 'val_loss'), 's--', ms=3, label='val loss')
    ax.set_ylabel('loss')
    ax = axes[0, 1]
    ax.plot(*series(history, 'train_err'), 'o-', ms=3, label='train error (top-1)')
    ax.plot(*series(history, 'val_top1'), 's-', ms=3, label='val top-1 error')
    ax.plot(*series(history, 'val_top5'), '^-', ms=3, label='val top-5 error')
    ax.set_ylabel('error')
    ax = axes[1, 0]
    if lr_iter is not None and len(lr_iter[0]):
        ax.plot(lr_iter[0], lr_iter[1], '-', lw=1, color='0.6', label='lr per iteration')
    ax.plot(*series(history, 'lr'), 'o', ms=3, label='lr at end of epoch')
    ax.set_ylabel('learning rate')
    ax = axes[1, 1]
    ep, top1 = series(history, 'val_top1')
    ax.plot(ep, top1, 's-', ms=3, label='val top-1 error')
    ep5, top5 = series(history, 'val_top5')
    ax.plot(ep5, top5, '^-', ms=3, label='val top-5 error')
    # a zero error cannot go on a log axis; only switch when every value can
    if top1 and all(v > 0 for v in top1 + top5):
        ax.set_yscale('log')
    ax.set_ylabel('val error')
    for ax in axes.flat:
        ax.set_xlabel('epoch')
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    if not history:
        axes[0, 0].text(0.5, 0.5, 'no complete epoch', ha='center', va='center',
                        transform=axes[0, 0].transAxes)
    fig.tight_layout()
    fig.savefig(path)
    return path


def write_plot_safely(plot, path, *args):
    """Call ``plot(path, *args)``; on failure print a warning and return None.

    A plotting failure (matplotlib missing, a full disk) only warns: by then
    training is over and the JSON results are written, and losing those to a
    figure would be the worse outcome.
    """
    try:
        return plot(path, *args)
    except Exception as exc:  # noqa: B902 - see docstring
        sys.stderr.write('theanompi-ext: warning: could not write %s: %s: %s\n'
                         % (path, type(exc).__name__, exc))
        return None


def render_png(plot, path, *args):
    """``plot(file, *args)`` into memory: the PNG's bytes, or None after a warning
    naming ``path`` (where it was to be written; see :func:`write_plot_safely`)."""
    import io
    buf = io.BytesIO()
    def draw(_, *a):
        plot(buf, *a)
        return path
    if write_plot_safely(draw, path, *args) is None:
        return None
    return buf.getvalue() or None


def curves_png(cfg, summary, trainer=None):
    """The PNG bytes of ``cfg.out/curves.png`` for a finished run, or None."""
    lr_iter = lr_curve(trainer.schedule, trainer.iteration) if trainer is not None else None
    title = '%s, %d workers x %d = %d, base lr %g (ref %d), warm-up %s' % (
        cfg.model, summary.get('workers', 0), cfg.batch_per_worker,
        summary.get('total_batch', 0), cfg.base_lr, cfg.ref_batch, cfg.warmup)
    return render_png(plot_curves, os.path.join(cfg.out, FILENAME),
                      summary.get('history', []), lr_iter, title)
