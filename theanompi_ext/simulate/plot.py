"""Efficiency-vs-workers figure for ``theanompi-ext simulate --plot``."""
from ..files.atomic import write_figure


def plot_efficiency(rows, path, title='', baseline_k=1):
    """Write a PNG of relative efficiency vs k, overlapped and serial.

    ``rows`` is :func:`theanompi_ext.simulate.model.scaling`'s output.
    """
    # Imported here so the CLI does not pay for matplotlib unless plotting,
    # and Agg so it works without a display.
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    ks = [r['k'] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(ks, [r['overlap_rel'] for r in rows], 'o-', label='overlapped (buckets)')
    ax.plot(ks, [r['serial_rel'] for r in rows], 's--', label='serial (Theano-MPI)')
    ax.set_xscale('log', base=2)
    ax.set_xticks(ks)
    ax.set_xticklabels([str(k) for k in ks])
    ax.set_ylim(0, 1.05)
    ax.set_xlabel('GPUs (k)')
    ax.set_ylabel('scaling efficiency vs %d GPU%s' % (baseline_k, '' if baseline_k == 1 else 's'))
    ax.grid(True, alpha=0.3)
    ax.legend(loc='lower left')
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    write_figure(fig, path, 'the efficiency plot', dpi=100)
    plt.close(fig)
