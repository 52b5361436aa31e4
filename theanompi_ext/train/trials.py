"""``theanompi-ext trials``: the reporting protocol of Goyal et al. 2017.

Runs R independent training runs of one setting, or of several settings
side by side, and reports each setting the way the paper's Table 1 does:

* run *i* (0-based) uses ``seed = SEED + i`` and ``data_seed = DATA_SEED + i``
  (model initialisation and per-epoch shuffles both change), so run 0 is the
  plain ``theanompi-ext train`` with the same options;
* the **error of a run** is the median of the validation top-1 error of its
  last 5 evaluated epochs (fewer when the run has fewer; the report says so);
* a setting's result is the **mean and the sample standard deviation**
  (ddof = 1, the unbiased variance) of its runs' errors.

Every run is launched like ``theanompi-ext train``: ``mpiexec -n K`` of the
worker program with the run's JSON config, writing ``OUT[/NAME]/run<i>/``
(``summary.json``, ``curves.png``, ``train.log``, ``config.json``).
The command writes ``OUT/trials.json`` (after every run, so a long campaign
can be watched) and ``OUT/trials.png`` at the end, and prints a table.

A run that stops because the loss became non-finite is reported as
**diverged**: it has no error, is left out of the mean and counted in its
own column. Any other failure is **failed** and makes the exit status 3.

Settings are given as repeated ``--setting NAME:'OPTIONS'`` or a
``--settings FILE`` with one ``NAME: OPTIONS`` line each; OPTIONS are any
``train`` options (``--workers`` and ``--config`` included). Precedence,
lowest first: the common ``--config`` file, the common options, the
setting's ``--config`` file, the setting's options.

The protocol math lives in plain functions (:func:`median_of_last`,
:func:`run_error`, :func:`mean_std`, :func:`summarise_runs`,
:func:`epoch_band`) so it can be checked by hand.
"""
import argparse
import json
import math
import os
import re
import shlex
import subprocess
import sys
import threading
import time

from . import options

LAST_EPOCHS = 5
RUN_FILES = ('summary.json', 'params.npz', 'curves.png', 'checkpoint.h5', 'train.log',
             'config.json')
_NAME = re.compile(r'^[A-Za-z0-9][A-Za-z0-9_.+-]*$')


# --------------------------------------------------------------------------- protocol math

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


# --------------------------------------------------------------------------- settings

class Setting(object):
    """One named setting: a validated TrainConfig, its rank count and host file."""

    def __init__(self, name, cfg, workers, hostfile, argv):
        self.name, self.cfg, self.workers, self.hostfile, self.argv = \
            name, cfg, workers, hostfile, argv


class _Raise(argparse.ArgumentParser):
    """A parser that raises ValueError instead of exiting (errors name the setting)."""

    def error(self, message):
        raise ValueError(message)


def _setting_parser():
    # No defaults: only what a setting actually sets may override the common options.
    p = _Raise(prog='setting', add_help=False)
    p.add_argument('--workers', type=int, default=None)
    p.add_argument('--hostfile', default=None)
    p.add_argument('--config', default=None)
    options.add_config_arguments(p)
    return p


def parse_setting(text, comments=False):
    """``'NAME:OPTIONS'`` -> ``(name, argv)`` (OPTIONS split like a shell would;
    with ``comments``, a ``#`` outside quotes starts a comment)."""
    if ':' not in text:
        raise ValueError('setting %r: expected NAME:OPTIONS' % (text,))
    name, opts = text.split(':', 1)
    name = name.strip()
    if not _NAME.match(name):
        raise ValueError('setting name %r: use letters, digits and _ . + - '
                         '(it becomes a folder name)' % (name,))
    try:
        argv = shlex.split(opts, comments=comments)
    except ValueError as exc:
        raise ValueError('setting %s: %s' % (name, exc))
    return name, argv


def read_settings_file(path):
    """Settings from a file of ``NAME: OPTIONS`` lines (``#`` comments, blank lines)."""
    try:
        with open(path) as fh:
            lines = fh.read().splitlines()
    except OSError as exc:
        raise ValueError('cannot read settings file %s: %s' % (path, exc.strerror or exc))
    out = []
    for no, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith('#'):
            continue
        try:
            name, argv = parse_setting(line, comments=True)
        except ValueError as exc:
            raise ValueError('%s line %d: %s' % (path, no, exc))
        out.append((name, argv))
    return out


def _file_values(path):
    return options.read_kv_file(path, options.config_keys()) if path else {}


def build_setting(name, common, setting_argv=()):
    """A :class:`Setting` from the parsed common options and a setting's argv."""
    try:
        own = _setting_parser().parse_args(list(setting_argv))
    except ValueError as exc:
        raise ValueError('setting %s: %s' % (name, exc))
    fields = options.config_keys()
    own_file = _file_values(own.config)
    values = _file_values(common.config)
    values.update(own_file)
    merged = argparse.Namespace(**{k: getattr(common, k, None) for k in fields})
    for key in own_file:            # a setting's file beats the common options
        setattr(merged, key, None)
    for key in fields:
        v = getattr(own, key, None)
        if v is not None:
            setattr(merged, key, v)
    try:
        cfg = options.config_from(merged, values)
    except (TypeError, ValueError) as exc:
        raise ValueError('setting %s: %s' % (name, exc))
    workers = own.workers if own.workers is not None else common.workers
    if workers < 1:
        raise ValueError('setting %s: --workers must be >= 1, got %d' % (name, workers))
    return Setting(name, cfg, workers, own.hostfile or common.hostfile, list(setting_argv))


def collect_settings(args):
    """Every setting of a ``trials`` command line (one unnamed if none is given)."""
    named = []
    if args.settings:
        named += read_settings_file(args.settings)
    named += [parse_setting(s) for s in args.setting or ()]
    if not named:
        return [build_setting('', args)]
    seen = set()
    for name, _ in named:
        if name in seen:
            raise ValueError('setting %s given twice' % name)
        seen.add(name)
    return [build_setting(name, args, argv) for name, argv in named]


# --------------------------------------------------------------------------- running

def run_dir(out, setting, i):
    """Folder of run ``i``: ``OUT/run<i>``, or ``OUT/NAME/run<i>`` for named settings."""
    return os.path.join(out, setting.name, 'run%d' % i) if setting.name \
        else os.path.join(out, 'run%d' % i)


def run_config(setting, i, out_dir):
    """The TrainConfig of run ``i``: seeds offset by ``i``, output in ``out_dir``."""
    import dataclasses
    return dataclasses.replace(setting.cfg, seed=setting.cfg.seed + i,
                               data_seed=setting.cfg.data_seed + i, out=out_dir,
                               resume=False).validate()


def _partial_history(folder):
    """Epoch records of a run that ended early, from its last checkpoint."""
    path = os.path.join(folder, 'checkpoint.h5')
    if not os.path.exists(path):
        return []
    try:
        import h5py
        with h5py.File(path, 'r') as f:
            return json.loads(f.attrs['history'])
    except Exception:  # noqa: B902 - a torn or foreign file only loses the partial curve
        return []


def _copy_output(stream, log, echo):
    """Copy the ranks' output to the run's log (and the terminal with ``echo``)."""
    for raw in iter(stream.readline, b''):
        text = raw.decode('utf-8', 'replace')
        log.write(text)
        log.flush()
        if echo:
            sys.stdout.write(text)
            sys.stdout.flush()
    stream.close()


def _record_from_summary(i, cfg, summary, wall_s, last):
    hist = summary.get('history', [])
    err, used, epochs = run_error(hist, last)
    return dict(run=i, seed=cfg.seed, data_seed=cfg.data_seed, out=cfg.out, status='ok',
                exit_status=0, error=err, epochs_used=used, error_epochs=epochs,
                final_val_top1=summary.get('final_val_top1'),
                final_val_top5=summary.get('final_val_top5'),
                iterations=summary.get('iterations'), wall_s=wall_s,
                step_s_median=summary.get('step_s_median'), history=hist)


def launch_run(setting, i, out, last=LAST_EPOCHS, timeout=None, reuse=False, echo=False):
    """Train run ``i`` of ``setting`` through mpiexec; returns its record.

    The ranks' output goes to ``run<i>/train.log`` (and also to the terminal
    with ``echo``). With ``reuse``, a finished run whose ``summary.json`` holds the
    same configuration is read instead of trained again.
    """
    from ..launch import mpiexec_command
    from ..launch.mpiexec import child_env, popen_job, stop_group
    folder = run_dir(out, setting, i)
    cfg = run_config(setting, i, folder)
    summary_path = os.path.join(folder, 'summary.json')
    if reuse and os.path.exists(summary_path):
        with open(summary_path) as f:
            summary = json.load(f)
        if summary.get('config') == cfg.to_dict() and summary.get('workers') == setting.workers:
            rec = _record_from_summary(i, cfg, summary, summary.get('wall_s'), last)
            rec['reused'] = True
            return rec
    os.makedirs(folder, exist_ok=True)
    # Remove a previous run's results so a failed run is never read as finished.
    for name in RUN_FILES:
        p = os.path.join(folder, name)
        if os.path.exists(p):
            os.unlink(p)
    cfg_path = os.path.join(folder, 'config.json')
    with open(cfg_path, 'w') as f:
        json.dump(cfg.to_dict(), f, indent=1)
    cmd = mpiexec_command(setting.workers, [sys.executable, '-u', '-m',
                                            'theanompi_ext.train.worker', cfg_path],
                          hostfile=setting.hostfile)
    log_path = os.path.join(folder, 'train.log')
    t0 = time.perf_counter()
    with open(log_path, 'w') as log:
        log.write('$ %s\n' % ' '.join(shlex.quote(c) for c in cmd))
        log.flush()
        # killed with this launcher, whatever the signal (launch/mpiexec.popen_job)
        proc = popen_job(cmd, child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        # The log is always written (a diverged run is recognised from it);
        # a thread copies it so that the timeout below still applies.
        pump = threading.Thread(target=_copy_output, args=(proc.stdout, log, echo),
                                daemon=True)
        pump.start()
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_group(proc)
            rc = 124
        except KeyboardInterrupt:
            stop_group(proc)
            raise
        finally:
            pump.join(timeout=10)
    wall = time.perf_counter() - t0
    if rc == 0 and os.path.exists(summary_path):
        with open(summary_path) as f:
            return _record_from_summary(i, cfg, json.load(f), wall, last)
    with open(log_path, errors='replace') as f:
        text = f.read()
    diverged = 'NonFiniteLoss' in text
    reason = [ln for ln in text.splitlines() if 'failed:' in ln]
    return dict(run=i, seed=cfg.seed, data_seed=cfg.data_seed, out=folder,
                status='diverged' if diverged else 'failed', exit_status=rc,
                error=None, epochs_used=0, error_epochs=[], wall_s=wall,
                reason=(reason[0].strip() if reason else
                        'timed out after %ss' % timeout if rc == 124 else
                        'exit status %d (see %s)' % (rc, log_path)),
                history=_partial_history(folder))


# --------------------------------------------------------------------------- report

def _pct(v):
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
        per = ' '.join(_pct(x['error']) if x['status'] == 'ok' else x['status']
                       for x in r['runs'])
        spread = _pct(r['mean']) + (' +- ' + _pct(r['std']) if r['std'] is not None else '')
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
    tmp = path + '.tmp'
    with open(tmp, 'w') as f:
        json.dump(doc, f, indent=1, default=float)
    os.replace(tmp, path)


def plot_trials(path, rows):
    """``trials.png``: per-run validation curves with mean +- std, train loss, run errors."""
    from .report import new_figure
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
    fig.savefig(path)
    return path


# --------------------------------------------------------------------------- command

def register(sub):
    """Add the ``trials`` sub-command."""
    p = sub.add_parser(
        'trials', help='R independent runs per setting; median of last 5 epochs, mean +- std',
        description='The reporting protocol of Goyal et al. 2017: R runs with seed and '
                    'data-seed SEED+i, error = median val top-1 error of the last 5 epochs, '
                    'mean +- sample std over runs. Training options after the trials '
                    'options apply to every setting; --out is the trials folder.')
    p.add_argument('--runs', type=int, default=5,
                   help='independent runs per setting, seeds SEED+i (default 5)')
    p.add_argument('--setting', action='append', metavar="NAME:'OPTIONS'",
                   help='a named setting: train options that override the common ones '
                        '(repeat for a side-by-side table)')
    p.add_argument('--settings', metavar='FILE',
                   help='file of settings, one "NAME: OPTIONS" a line (# comments)')
    p.add_argument('--last', type=int, default=LAST_EPOCHS,
                   help='last evaluated epochs whose median val top-1 error is a run\'s '
                        'error, epochs (default %d)' % LAST_EPOCHS)
    p.add_argument('--run-timeout', type=float, default=None,
                   help='a run still going after this many seconds is stopped and counted '
                        'as failed (default: no limit)')
    p.add_argument('--reuse', action='store_true',
                   help='keep finished runs whose summary.json has the same configuration '
                        'instead of training them again')
    p.add_argument('--verbose', action='store_true',
                   help='also show the ranks\' output here, not only in run<i>/train.log')
    p.add_argument('--workers', type=int, default=1, metavar='K',
                   help='k, ranks per run unless a setting gives its own (default 1)')
    p.add_argument('--hostfile', default=None, metavar='FILE',
                   help='MPI host file, to place the ranks on several machines (default: '
                        'all on this one)')
    p.add_argument('--config', default=None, metavar='FILE',
                   help='key=value file of training options for every setting')
    p.add_argument('--dry-run', action='store_true',
                   help='print the plan and warnings of every setting, launch nothing')
    options.add_config_arguments(p)
    p.set_defaults(func=main)


def main(args):
    """Run every setting's runs in turn, then print and write the report."""
    from ..launch import in_mpi_job
    try:
        if args.runs < 1:
            raise ValueError('--runs must be >= 1, got %d' % args.runs)
        if args.last < 1:
            raise ValueError('--last must be >= 1, got %d' % args.last)
        if not args.out:
            raise ValueError('--out DIR is required (runs go to DIR/[NAME/]run<i>)')
        if args.resume:
            raise ValueError('--resume is not supported: each run starts fresh (see --reuse)')
        if in_mpi_job():
            raise ValueError('trials starts its own mpiexec for every run; '
                             'run it outside mpiexec')
        settings = collect_settings(args)
        from .cli import before_launch
        for s in settings:
            if args.dry_run:
                print('setting %s, run0 of %d:' % (s.name or 'default', args.runs))
                sys.stdout.flush()
            before_launch(run_config(s, 0, run_dir(args.out, s, 0)), s.workers, s.hostfile,
                          args.dry_run, label=s.name)
        if args.dry_run:
            return 0
    except ValueError as exc:
        sys.stderr.write('theanompi-ext trials: error: %s\n' % exc)
        return 2
    out = args.out
    os.makedirs(out, exist_ok=True)
    argv = sys.argv[1:]
    json_path = os.path.join(out, 'trials.json')
    total = len(settings) * args.runs
    print('trials: %d setting(s) x %d runs -> %s' % (len(settings), args.runs, out))
    rows, done = [], 0
    for s in settings:
        runs = []
        for i in range(args.runs):
            try:
                rec = launch_run(s, i, out, args.last, args.run_timeout, args.reuse,
                                 args.verbose)
            except KeyboardInterrupt:
                # the run's ranks are stopped; what finished is already in trials.json
                sys.stderr.write('theanompi-ext trials: interrupted during %s run%d; finished '
                                 'runs are in %s\n' % (s.name or 'default', i, json_path))
                return 130
            runs.append(rec)
            done += 1
            what = ('error %s%% (median of %d epochs)' % (_pct(rec['error']), rec['epochs_used'])
                    if rec['status'] == 'ok' else '%s: %s' % (rec['status'], rec['reason']))
            print('[%d/%d] %s run%d seed %d data-seed %d: %s, %.0fs%s'
                  % (done, total, s.name or 'default', i, rec['seed'], rec['data_seed'], what,
                     rec['wall_s'] or 0, ' (reused)' if rec.get('reused') else ''))
            sys.stdout.flush()
            write_json(json_path, rows + [setting_row(s, runs, args.last)], argv, args.last)
        rows.append(setting_row(s, runs, args.last))
    write_json(json_path, rows, argv, args.last)
    from .report import write_plot_safely
    png = write_plot_safely(plot_trials, os.path.join(out, 'trials.png'), rows)
    print()
    print(format_table(rows, args.last))
    print('wrote %s%s' % (json_path, ' and ' + png if png else ''))
    return 3 if any(r['n_failed'] for r in rows) else 0
