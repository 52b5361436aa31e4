"""Warnings for settings that are legal but almost certainly not what was meant.

Each rule is a plain function ``rule(cfg, workers, cores) -> str or None``
(``cores``: the cores this machine gives the job, None when the ranks may
run elsewhere); :func:`check` runs them all. A warning says what will
happen and how to get what the user probably wanted. They are printed once,
on rank 0 (or by the launcher), before anything is launched.
"""
import os
import sys

# The paper's schedule, for a suggestion scaled to a shorter run.
PAPER_EPOCHS, PAPER_DECAYS = 90, (30, 60, 80)


def _warmup_epochs(cfg):
    """Epochs the warm-up lasts (0 without one)."""
    if cfg.warmup == 'none':
        return 0.0
    if cfg.warmup == 'theanompi':
        return 5.0          # fixed by Theano-MPI's rule
    return float(cfg.warmup_epochs)


def warmup_lowers_rate(cfg, workers, cores=None):
    """kn < ref_batch with a gradual/constant warm-up: the rate goes *down*."""
    kn = workers * cfg.batch_per_worker
    if cfg.warmup not in ('gradual', 'constant') or not cfg.warmup_epochs \
            or kn >= cfg.ref_batch:
        return None
    target = cfg.base_lr * kn / cfg.ref_batch
    how = 'ramps it down' if cfg.warmup == 'gradual' else 'holds it, then drops it'
    return ('k x n = %d is below --ref-batch %d, so the %s warm-up starts at %g and %s to '
            '%g = %g x %d/%d after %g epochs. To train at %g with this batch, pass '
            '--ref-batch %d; to start at the scaled rate %g, pass --warmup none.'
            % (kn, cfg.ref_batch, cfg.warmup, cfg.base_lr, how, target, cfg.base_lr, kn,
               cfg.ref_batch, cfg.warmup_epochs, cfg.base_lr, kn, target))


def decay_after_end(cfg, workers=1, cores=None):
    """Decay epochs at or beyond the last epoch never take effect."""
    late = [e for e in cfg.decay_epochs if e >= cfg.epochs]
    if not late:
        return None
    text = ('decay epoch%s %s %s at or beyond the end of training (--epochs %d): the rate '
            'is never multiplied by %g there.' % (
                's' if len(late) > 1 else '', ','.join(map(str, late)),
                'are' if len(late) > 1 else 'is', cfg.epochs, cfg.decay_factor))
    if tuple(cfg.decay_epochs) == PAPER_DECAYS:
        scaled = sorted({max(1, int(round(e * cfg.epochs / float(PAPER_EPOCHS))))
                         for e in PAPER_DECAYS})
        scaled = [e for e in scaled if e < cfg.epochs]
        if scaled:
            text += (' For the paper\'s schedule scaled to %d epochs, pass --decay-epochs %s;'
                     % (cfg.epochs, ','.join(map(str, scaled))))
    return text + ' to decay within this run, give epochs below %d (or --decay-epochs \'\' ' \
        'for no decay).' % cfg.epochs


def warmup_past_decay(cfg, workers=1, cores=None):
    """A warm-up that does not end before the first decay."""
    warm = _warmup_epochs(cfg)
    first = [e for e in cfg.decay_epochs if e < cfg.epochs][:1]
    if not warm or not first or warm < first[0]:
        return None
    return ('the %s warm-up (%g epochs) does not end before the first decay (epoch %d): '
            'decays inside the warm-up wait until it ends, and the scaled rate is never '
            'used undecayed. Pass --warmup-epochs below %d or move --decay-epochs later.'
            % (cfg.warmup, warm, first[0], first[0]))


def ranks_exceed_cores(cfg, workers, cores=None):
    """More ranks than cores on one machine: the ranks time-share the cores."""
    if cores is None or workers <= cores:
        return None
    return ('%d ranks on %d cores: the ranks take turns on the cores and every step waits '
            'for the slowest. Pass --workers %d or fewer, or --hostfile to spread the ranks '
            'over several machines.' % (workers, cores, cores))


def uncorrected_momentum(cfg, workers=1, cores=None):
    """eq. 10 without momentum correction while the rate changes.

    With a constant rate eq. 9 and eq. 10 agree; every change of the rate
    (warm-up, decay) then changes the effective update of eq. 10 unless the
    momentum is rescaled by lr/lr_prev (the paper's Remark 2). Correction
    with eq. 9 needs no request: eq. 9 never needs it, and ``--momentum-form``
    only offers it with eq. 10.
    """
    if cfg.momentum_form != 'eq10-nocorrect' or not cfg.momentum:
        return None
    kn = workers * cfg.batch_per_worker
    changes = []
    if cfg.warmup in ('gradual', 'constant') and cfg.warmup_epochs and kn != cfg.ref_batch:
        changes.append('the %s warm-up' % cfg.warmup)
    if cfg.warmup == 'theanompi' and workers > 1:
        changes.append('the Theano-MPI warm-up')
    if cfg.decay_factor < 1 and any(e < cfg.epochs for e in cfg.decay_epochs):
        changes.append('the decays')
    if not changes:
        return None
    return ('--momentum-form eq10-nocorrect while the rate changes (%s): without momentum '
            'correction each change makes eq. 10 take a different step from eq. 9. Pass '
            '--momentum-form eq10 (corrected) or eq9 for the paper\'s update.'
            % ' and '.join(changes))


RULES = (warmup_lowers_rate, decay_after_end, warmup_past_decay, ranks_exceed_cores,
         uncorrected_momentum)


def machine_cores():
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def check(cfg, workers, cores=None):
    """Every warning for ``cfg`` on ``workers`` ranks (a list of sentences)."""
    return [w for w in (rule(cfg, workers, cores) for rule in RULES) if w]


def print_warnings(warnings, stream=None, prefix='theanompi-ext: warning: '):
    """Write each warning on its own line (stderr by default)."""
    stream = stream or sys.stderr
    for w in warnings:
        stream.write(prefix + w + '\n')
    stream.flush()
