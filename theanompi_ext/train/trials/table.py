"""The report of ``trials``: a setting's entry, the printed table, ``trials.json``."""
from .stats import LAST_EPOCHS, peak_lr, summarise_runs
from ...files import atomic


def percent(v):
    """``v`` (a fraction) as a percentage with 2 decimals; ``-`` for None."""
    return '-' if v is None else '%.2f' % (100 * v)


def setting_row(setting, runs, last=LAST_EPOCHS):
    """The trials.json entry of a setting: options, runs and their summary."""
    cfg = setting.cfg
    return dict(name=setting.name or 'default', argv=setting.argv, workers=setting.workers,
                batch_per_worker=cfg.batch_per_worker,
                total_batch=setting.workers * cfg.batch_per_worker,
                peak_lr=peak_lr(cfg, setting.workers), warmup=cfg.warmup,
                warmup_epochs=cfg.warmup_epochs, epochs=cfg.epochs, config=cfg.to_dict(),
                runs=runs, **summarise_runs(runs))


def format_table(rows, last=LAST_EPOCHS):
    """The printed table (one line per setting) and its notes."""
    head = ('setting', 'k x n = kn', 'peak lr', 'warm-up', 'runs', 'error % mean +- std',
            'diverged', 'per run (%)')
    lines = []
    for r in rows:
        per = ' '.join(percent(x['error']) if x['status'] == 'ok' else x['status']
                       for x in r['runs'])
        spread = percent(r['mean']) + (' +- ' + percent(r['std']) if r['std'] is not None else '')
        warm = r['warmup'] if r['warmup'] == 'none' else '%s %g ep' % (r['warmup'],
                                                                       r['warmup_epochs'])
        lines.append((r['name'], '%d x %d = %d' % (r['workers'], r['batch_per_worker'],
                                                   r['total_batch']),
                      '%g' % r['peak_lr'], warm, '%d/%d' % (r['n_ok'], r['n_runs']),
                      spread, str(r['n_diverged']), per))
    widths = [max(len(head[c]), *(len(ln[c]) for ln in lines)) for c in range(len(head))]
    fmt = '  '.join('%%-%ds' % w for w in widths)
    out = [fmt % head, fmt % tuple('-' * w for w in widths)] + [fmt % ln for ln in lines]
    out.append('error of a run: median val top-1 error of its last %d evaluated epochs; '
               'mean +- sample std (ddof=1) over the runs that finished' % last)
    for r in rows:
        if r['n_ok'] and r['epochs_used'] < last:
            out.append('note: %s has only %d evaluated epoch(s): median of %d, not %d'
                       % (r['name'], r['epochs_used'], r['epochs_used'], last))
        for x in r['runs']:
            if x['status'] != 'ok':
                out.append('note: %s run%d %s: %s' % (r['name'], x['run'], x['status'],
                                                      x.get('reason', '')))
    return '\n'.join(out)


def write_json(path, rows, args_argv, last=LAST_EPOCHS):
    """``trials.json`` (atomically: a reader never sees half a file)."""
    doc = dict(protocol=dict(
        run_error='median of val top-1 error over the last %d evaluated epochs '
                  '(fewer if the run has fewer; see epochs_used)' % last,
        spread='mean and sample standard deviation (ddof=1) over runs with status ok; '
               'diverged (non-finite loss) and failed runs are counted, not averaged',
        seeds='run i uses seed = SEED + i and data_seed = DATA_SEED + i',
        last_epochs=last), command=args_argv, settings=rows)
    atomic.write_json(path, doc, 'the trials table', indent=1, default=float)
