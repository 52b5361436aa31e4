"""The ``trials`` command: options, then every setting's runs in turn, then the report."""
import os
import signal
import sys

from ...errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, EXIT_SIGNAL_BASE, BadInput
from ...launch.reach import check_hostfile
from .. import options
from ..cli import add_launch_arguments, before_launch, use_network
from .runs import launch_run, run_config, run_dir
from .settings import collect_settings
from .stats import LAST_EPOCHS
from .table import format_table, percent, setting_row, write_json
from .plot import plot_trials


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
    add_launch_arguments(
        p, workers='k, ranks per run unless a setting gives its own (default 1)',
        config='key=value file of training options for every setting',
        dry_run='print the plan and warnings of every setting, launch nothing')
    options.add_config_arguments(p)
    p.set_defaults(func=main)


def main(args):
    """Run every setting's runs in turn, then print and write the report."""
    try:
        settings = _checked_settings(args)
        if args.dry_run:
            return EXIT_OK
    except ValueError as exc:
        sys.stderr.write('theanompi-ext trials: error: %s\n' % exc)
        return EXIT_BAD_INPUT
    use_network(args)
    try:
        for hostfile in sorted({s.hostfile for s in settings if s.hostfile}):
            check_hostfile(hostfile)
    except BadInput as exc:        # a host unreachable (reach.Unreachable), a bad hostfile
        sys.stderr.write('theanompi-ext: %s\n' % exc)
        return EXIT_BAD_INPUT
    os.makedirs(args.out, exist_ok=True)
    json_path = os.path.join(args.out, 'trials.json')
    print('trials: %d setting(s) x %d runs -> %s' % (len(settings), args.runs, args.out))
    try:
        rows = _run_settings(args, settings, json_path)
    except KeyboardInterrupt:
        return EXIT_SIGNAL_BASE + signal.SIGINT
    write_json(json_path, rows, sys.argv[1:], args.last)
    from ..report import write_plot_safely
    png = write_plot_safely(plot_trials, os.path.join(args.out, 'trials.png'), rows)
    print()
    print(format_table(rows, args.last))
    print('wrote %s%s' % (json_path, ' and ' + png if png else ''))
    return EXIT_FAILED if any(r['n_failed'] for r in rows) else EXIT_OK


def _checked_settings(args):
    """The settings of ``args``, their warnings (and plans with ``--dry-run``)
    printed; ValueError naming what is wrong."""
    from ...launch import in_mpi_job
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
    for s in settings:
        if args.dry_run:
            print('setting %s, run0 of %d:' % (s.name or 'default', args.runs))
            sys.stdout.flush()
        before_launch(run_config(s, 0, run_dir(args.out, s, 0)), s.workers, s.hostfile,
                      args.dry_run, label=s.name)
    return settings


def _run_settings(args, settings, json_path):
    """Every run of every setting, ``trials.json`` rewritten after each; the rows."""
    rows, done, total = [], 0, len(settings) * args.runs
    for s in settings:
        runs = []
        for i in range(args.runs):
            try:
                rec = launch_run(s, i, args.out, args.last, args.run_timeout, args.reuse,
                                 args.verbose)
            except KeyboardInterrupt:
                # the run's ranks are stopped; what finished is already in trials.json
                sys.stderr.write('theanompi-ext trials: interrupted during %s run%d; finished '
                                 'runs are in %s\n' % (s.name or 'default', i, json_path))
                raise
            runs.append(rec)
            done += 1
            print('[%d/%d] %s' % (done, total, _run_line(s, i, rec)))
            sys.stdout.flush()
            write_json(json_path, rows + [setting_row(s, runs, args.last)], sys.argv[1:],
                       args.last)
        rows.append(setting_row(s, runs, args.last))
    return rows


def _run_line(setting, i, rec):
    """The progress line of run ``i``: its seeds, its error or why it has none, its time."""
    what = ('error %s%% (median of %d epochs)' % (percent(rec['error']), rec['epochs_used'])
            if rec['status'] == 'ok' else '%s: %s' % (rec['status'], rec['reason']))
    return ('%s run%d seed %d data-seed %d: %s, %.0fs%s'
            % (setting.name or 'default', i, rec['seed'], rec['data_seed'], what,
               rec['wall_s'] or 0, ' (reused)' if rec.get('reused') else ''))
