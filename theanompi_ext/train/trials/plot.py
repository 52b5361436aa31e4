"""``trials.png``: the runs' curves with mean +- std, and each run's error."""
from .stats import epoch_band
from ...files.atomic import write_figure


def plot_trials(path, rows):
    """``trials.png``: per-run validation curves with mean +- std, train loss, run errors."""
    from ..report import new_figure
    fig = new_figure(15, 4.8)
    ax_val, ax_loss, ax_err = fig.subplots(1, 3)
    colors = ['C%d' % i for i in range(10)]
    for j, r in enumerate(rows):
        c = colors[j % len(colors)]
        for x in r['runs']:
            style = '-' if x['status'] == 'ok' else ':'
            for ax, key in ((ax_val, 'val_top1'), (ax_loss, 'train_loss')):
                ep = [h['epoch'] for h in x['history'] if h.get(key) is not None]
                val = [h[key] for h in x['history'] if h.get(key) is not None]
                ax.plot(ep, val, style, color=c, lw=0.7, alpha=0.35)
        ok = [x['history'] for x in r['runs'] if x['status'] == 'ok']
        label = r['name'] + ('' if not r['n_diverged'] else ' (%d diverged)' % r['n_diverged'])
        for ax, key in ((ax_val, 'val_top1'), (ax_loss, 'train_loss')):
            ep, m, s = epoch_band(ok, key)
            if ep:
                ax.plot(ep, m, '-', color=c, lw=2, label=label)
                # on the log axis a band reaching 0 or below would be cut off
                # oddly; it ends at a tenth of the mean instead
                ax.fill_between(ep, [max(a - b, a / 10.0) for a, b in zip(m, s)],
                                [a + b for a, b in zip(m, s)], color=c, alpha=0.2)
        errs = [100 * x['error'] for x in r['runs'] if x['status'] == 'ok']
        ax_err.plot([j] * len(errs), errs, 'o', color=c, alpha=0.5, ms=4)
        if r['mean'] is not None:
            ax_err.errorbar([j + 0.15], [100 * r['mean']],
                            yerr=[[100 * (r['std'] or 0)], [100 * (r['std'] or 0)]],
                            fmt='s', color=c, capsize=4, ms=6)
    ax_val.set_title('validation top-1 error (runs thin, mean +- std)', fontsize=9)
    ax_val.set_ylabel('val top-1 error')
    ax_val.set_yscale('log')
    ax_loss.set_title('training loss', fontsize=9)
    ax_loss.set_ylabel('train loss')
    ax_loss.set_yscale('log')
    for ax in (ax_val, ax_loss):
        ax.set_xlabel('epoch')
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    ax_err.set_title('error of each run (median of last epochs); mean +- std', fontsize=9)
    ax_err.set_ylabel('error %')
    all_errs = [x['error'] for r in rows for x in r['runs'] if x['status'] == 'ok']
    if all_errs and min(all_errs) > 0 and max(all_errs) > 5 * min(all_errs):
        ax_err.set_yscale('log')   # one bad setting would flatten the others
    ax_err.set_xticks(range(len(rows)))
    ax_err.set_xticklabels([r['name'] for r in rows], rotation=20, fontsize=8)
    ax_err.set_xlim(-0.5, len(rows) - 0.5)
    ax_err.grid(True, alpha=0.3)
    fig.tight_layout()
    write_figure(fig, path, 'the trials plot')
    return path
