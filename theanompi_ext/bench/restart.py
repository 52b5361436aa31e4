"""``theanompi-ext bench restart``: what a checkpoint costs and how long a restart takes.

Runs one ``train`` job (``--max-restarts 1``) whose rank 1 is SIGKILLed after
iteration ``--kill-at`` (the fault hook of ``train/attempt.py``), then prints,
from the job's ``summary.json`` and ``restarts.json``: the checkpoints of the
last attempt (how many, seconds each, their share of its training time, the
file's size) and the time from the failure to the next start and to training
again (the first step of the restarted job).
"""
import json
import os
import subprocess
import sys
import tempfile


def register(sub):
    """Add ``bench restart`` to the ``bench`` sub-parsers."""
    p = sub.add_parser('restart', help='checkpoint cost and the time from a failure to '
                                       'training again (starts mpiexec)',
                       description=__doc__.split('\n\n')[0])
    p.add_argument('--workers', type=int, default=2, metavar='K', help='k, the MPI ranks to start (default 2)')
    p.add_argument('--kill-at', type=int, default=40, metavar='ITER',
                   help='rank 1 is killed after this iteration (default %(default)s)')
    p.add_argument('--keep', default='', metavar='DIR',
                   help='run in DIR and keep it (default: a temporary folder)')
    p.add_argument('train_options', nargs='*', metavar='-- TRAIN OPTION',
                   help="the job's train options after --, e.g. -- --model resnet20 "
                        "--max-steps 80 --checkpoint-every 10 (default: digits_cnn, 120 "
                        "steps, a checkpoint every 10)")
    p.set_defaults(func=main)


DEFAULT_TRAIN = ['--model', 'digits_cnn', '--batch-per-worker', '8', '--epochs', '2',
                 '--max-steps', '120', '--checkpoint-every', '10', '--warmup', 'none']


def main(args):
    """Run the job, print the figures; the job's exit status."""
    from ..train.attempt import FAULTS_VAR
    out = args.keep or tempfile.mkdtemp(prefix='tmx-bench-restart-')
    cmd = [sys.executable, '-m', 'theanompi_ext', 'train', '--workers', str(args.workers),
           '--out', out, '--overwrite', '--quiet', '--max-restarts', '1',
           '--restart-backoff-s', '0'] + (args.train_options or DEFAULT_TRAIN)
    env = dict(os.environ, **{FAULTS_VAR: '0:1:%d:kill' % args.kill_at})
    rc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL).returncode
    if rc:
        sys.stderr.write('bench restart: the job failed (exit status %d)\n' % rc)
        return rc
    with open(os.path.join(out, 'summary.json')) as f:
        summary = json.load(f)
    with open(os.path.join(out, 'restarts.json')) as f:
        failure = json.load(f)['failures'][0]
    print(report(summary, failure, os.path.getsize(os.path.join(out, 'checkpoint.h5'))))
    if not args.keep:
        import shutil
        shutil.rmtree(out, ignore_errors=True)
    return 0


def report(summary, failure, size):
    """The printed lines of the figures."""
    c = summary['checkpoints']
    again = summary['first_step_unix'] - failure['unix_time']
    return '\n'.join([
        'checkpoints (restarted attempt): %d of %.1f KB, %.1f ms each (largest %.1f ms), '
        '%.1f%% of its %.2f s of training' % (
            c['count'], size / 1e3, 1e3 * (c['mean_s'] or 0), 1e3 * (c['max_s'] or 0),
            100 * (c['share'] or 0), summary['wall_s']),
        'median step %.1f ms: one checkpoint costs %.1f steps' % (
            1e3 * (summary['step_s_median'] or 0),
            (c['mean_s'] or 0) / (summary['step_s_median'] or float('inf'))),
        'failure (%s at iteration %s) -> next start: %.2f s; -> training again: %.1f s '
        '(%d iterations lost)' % (failure['cause'], failure['failed_at_iteration'],
                                  failure['seconds_to_restart'], again,
                                  failure['iterations_lost'])])
