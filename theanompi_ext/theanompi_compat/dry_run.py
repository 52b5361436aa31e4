"""``tmxlauncher --dry-run``: what a session would run, without launching it.

The model is built here, once, as rank 0 of the session's k ranks on the
host backend (nothing is compiled but the model's own constructor does),
and the plan is printed: ranks and devices, the exchange mode and why,
the backward chunks found in the model's graph (their parameters and
sizes), the batch per iteration and the iterations per epoch, and when
checkpoints are written.
"""
import os

import numpy as np


def plan_lines(session, log=print):
    """Print the plan of ``session`` (as :func:`~.session.session_from_file` returns it)."""
    from ..engine.open import open_on_every_rank
    from ..collective import create_communicator
    from .worker import import_model_class, choose_mode
    from .options import OPTION_DEFAULTS, option_env_name, resolve_options
    from .feed import ModelFeed
    from ..engine.devices import parse_devices
    # One rank per device, as the launch counts them ('cpu0,cpu1' is two).
    devices = [d for _, d in parse_devices(session['devices'])]
    k = len(devices)
    open_on_every_rank('cpu', create_communicator('local'))
    cls = import_model_class(session['modelfile'], session['modelclass'])
    model = cls({'verbose': False, 'rank': 0, 'size': k, 'mname': session['modelclass'],
                 'device': 'cpu', 'sync_type': session['sync_type'],
                 'exch_strategy': session['exch_strategy']})
    # as the ranks get them: in the environment (rule._child_env)
    opts = resolve_options(model, {option_env_name(key): str(value) for key, value
                                   in session['options'].items() if key in OPTION_DEFAULTS})
    mode, why, chunks = choose_mode(model, session['exch_strategy'])
    feed = ModelFeed(model, opts['batch_per_worker'], outputs=[getattr(model, 'error', None)])
    log('dry run: %s on %d ranks (%s), sync_type=%s; nothing launched'
        % (session['modelclass'], k, ','.join(devices), session['sync_type']))
    log('exchange mode %s: %s' % (mode, why))
    if chunks is not None:
        log('backward chunks, input side first (the backward runs them from the last; each '
            'one\'s buckets are sent while the chunks before it compute):')
        for i, (name, _, params) in enumerate(chunks):
            size = sum(int(np.prod(p.get_value(borrow=True).shape)) for p in params)
            log('  %2d. %-24s %3d parameter(s), %9d scalars: %s'
                % (i + 1, name, len(params), size, ', '.join(p.name or '?' for p in params)))
    iters = int(model.data.n_batch_train) * feed.n_subb
    log('batch %d x %d = %d per iteration (%s); %d iterations per epoch, %d epochs'
        % (k, feed.n, k * feed.n, feed.describe(), iters, int(model.n_epochs)))
    log(checkpoints_line(session['options'], opts))
    return 0


def checkpoints_line(options, opts):
    """When the session's ranks write ``OUT/checkpoint.h5`` (``options``: the
    session's, the job process's included; ``opts``: the ranks' resolved ones)."""
    from .rule import RESTART_OPTIONS
    restarts = int(options.get('max_restarts') or 0)
    resume = RESTART_OPTIONS['resume'][1](options.get('resume') or 'false')
    when = []
    if opts['checkpoint_every_s']:
        when.append('every %g s (rank 0\'s clock)' % opts['checkpoint_every_s'])
    if opts['checkpoint_signal']:
        when.append('on SIG%s, then %s' % (opts['checkpoint_signal'],
                                            'every rank stops (75)'
                                            if opts['on_checkpoint_signal'] == 'stop'
                                            else 'training goes on'))
    if not (when or restarts or resume):
        return ('checkpoints: none (options max_restarts, checkpoint_every_s, '
                'checkpoint_signal)')
    return 'checkpoints: %s, at the end of every epoch%s%s%s' % (
        os.path.join(opts['out'], 'checkpoint.h5'), ''.join(', ' + w for w in when),
        '; restarted up to %d times from it' % restarts if restarts else '',
        '; the job starts from it (resume)' if resume else '')
