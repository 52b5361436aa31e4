"""The reporting protocol's math, in plain functions that can be checked by hand:
a run's error (median of its last evaluated epochs), mean and sample std over
runs, per-epoch bands, the peak learning rate."""
import math

LAST_EPOCHS = 5


def median_of_last(values, last=LAST_EPOCHS):
    """Median of the last ``last`` entries of ``values``; returns ``(median, used)``.

    ``used`` is how many entries went in (fewer than ``last`` when the list
    is shorter). An even count takes the mean of the two middle values.
    Returns ``(None, 0)`` for an empty list.
    """
    if last < 1:
        raise ValueError('last must be >= 1, got %r' % (last,))
    tail = sorted(float(v) for v in list(values)[-last:])
    m = len(tail)
    if not m:
        return None, 0
    mid = m // 2
    med = tail[mid] if m % 2 else 0.5 * (tail[mid - 1] + tail[mid])
    return med, m


def run_error(history, last=LAST_EPOCHS):
    """The paper's error of one run from its epoch records (``summary['history']``).

    Median validation top-1 error over the last ``last`` epochs that were
    evaluated; returns ``(error, used, epochs)`` with the epoch numbers used.
    """
    rows = [(h['epoch'], h['val_top1']) for h in history if h.get('val_top1') is not None]
    rows = rows[-last:]
    err, used = median_of_last([v for _, v in rows], last)
    return err, used, [e for e, _ in rows]


def mean_std(values):
    """``(mean, sample std)`` of ``values``; std uses ddof = 1.

    One value gives ``(value, None)`` (a spread needs two runs); none gives
    ``(None, None)``.
    """
    vals = [float(v) for v in values]
    n = len(vals)
    if not n:
        return None, None
    mean = sum(vals) / n
    if n < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1))


def summarise_runs(runs):
    """Aggregate run records (dicts with ``status`` and ``error``) of one setting.

    Only runs with status ``'ok'`` enter the mean and std; ``diverged`` and
    ``failed`` runs are counted.
    """
    errs = [r['error'] for r in runs if r['status'] == 'ok' and r.get('error') is not None]
    mean, std = mean_std(errs)
    return dict(mean=mean, std=std, n_runs=len(runs), n_ok=len(errs),
                n_diverged=sum(r['status'] == 'diverged' for r in runs),
                n_failed=sum(r['status'] == 'failed' for r in runs),
                epochs_used=min((r['epochs_used'] for r in runs if r['status'] == 'ok'),
                                default=0))


def epoch_band(histories, key='val_top1'):
    """Per-epoch mean and sample std of ``key`` over several runs' histories.

    Only epochs that every history has a value for are included, so the band
    never mixes different sets of runs. Returns ``(epochs, means, stds)``;
    stds are 0 with a single history.
    """
    per = [{h['epoch']: h[key] for h in hist if h.get(key) is not None} for hist in histories]
    if not per:
        return [], [], []
    common = sorted(set.intersection(*(set(p) for p in per)))
    means, stds = [], []
    for e in common:
        m, s = mean_std([p[e] for p in per])
        means.append(m)
        stds.append(s or 0.0)
    return common, means, stds


def peak_lr(cfg, workers):
    """The rate after warm-up and before any decay (linear scaling rule)."""
    if cfg.warmup == 'theanompi':
        return cfg.base_lr * workers
    return cfg.base_lr * workers * cfg.batch_per_worker / cfg.ref_batch
