"""Launch a Theano-MPI session config file with this project's exchange.

usage::

    python -m theanompi_ext.tmlauncher -cfg=session.cfg     (or --cfg FILE)

Keys (case-insensitive, ``#`` comments), as Theano-MPI's ``tmlauncher``:
``RULE=BSP``, ``MODELFILE=pkg.module`` (or a ``.py`` path),
``MODELCLASS=Name``, ``DEVICES=cuda0,cuda1``; new: ``SYNC_TYPE`` (kn, avg,
cdd), ``EXCH_STRATEGY`` (ar, ar-overlap), and every exchange option of
:data:`theanompi_ext.contract.OPTION_DEFAULTS` (``WARMUP``,
``WARMUP_EPOCHS``, ``REF_BATCH``, ``BATCH_PER_WORKER``, ``WEIGHT_DECAY``,
``MOMENTUM``, ``MOMENTUM_FORM``, ``EXCHANGE_BN``, ``BUCKET_CAP_MB``,
``FIRST_BUCKET_CAP_MB``, ``MAX_STEPS``, ``OUT``). An unknown key, a missing
model file or class, or a bad value ends with a message naming it and exit
status 2; otherwise the exit status is the job's.
"""
import sys

USAGE = 'usage: python -m theanompi_ext.tmlauncher -cfg=SESSION.cfg  (or --cfg SESSION.cfg)'
REQUIRED = ('rule', 'modelfile', 'modelclass', 'devices')


def known_keys():
    """Lower-case keys a session file may use."""
    from .contract import OPTION_DEFAULTS
    return set(REQUIRED) | {'sync_type', 'exch_strategy'} | set(OPTION_DEFAULTS)


def parse_args(argv):
    """The config path from ``-cfg=F``, ``--cfg=F``, ``-cfg F`` or ``--cfg F``."""
    argv = list(argv)
    for i, a in enumerate(argv):
        for flag in ('-cfg', '--cfg'):
            if a.startswith(flag + '='):
                return a.split('=', 1)[1]
            if a == flag and i + 1 < len(argv):
                return argv[i + 1]
    raise ValueError('no session config given')


def session_from_file(path):
    """Validated session settings from a config file (ValueError naming the problem)."""
    from .train.options import read_kv_file
    from .contract import OPTION_DEFAULTS
    from .rules import SYNC_TYPES, EXCH_STRATEGIES, check_model
    values = read_kv_file(path, known=known_keys())
    missing = [k.upper() for k in REQUIRED if k not in values]
    if missing:
        raise ValueError('%s: missing key(s) %s' % (path, ', '.join(missing)))
    if values['rule'].upper() != 'BSP':
        raise ValueError('%s: RULE=%s is not supported (only BSP)' % (path, values['rule']))
    sync_type = values.get('sync_type', 'kn')
    if sync_type not in SYNC_TYPES:
        raise ValueError('%s: SYNC_TYPE=%s; choose from %s' % (path, sync_type, SYNC_TYPES))
    exch = values.get('exch_strategy', 'ar')
    if exch not in EXCH_STRATEGIES:
        raise ValueError('%s: EXCH_STRATEGY=%s; choose from %s' % (path, exch, EXCH_STRATEGIES))
    devices = [d.strip() for d in values['devices'].split(',') if d.strip()]
    if not devices:
        raise ValueError('%s: DEVICES is empty' % path)
    options = {}
    for key in OPTION_DEFAULTS:
        if key in values:
            try:
                OPTION_DEFAULTS[key][1](values[key])
            except ValueError:
                raise ValueError('%s: %s=%s is not a valid %s' % (
                    path, key.upper(), values[key], type(OPTION_DEFAULTS[key][0]).__name__))
            options[key] = values[key]
    check_model(values['modelfile'], values['modelclass'])
    return dict(devices=devices, modelfile=values['modelfile'],
                modelclass=values['modelclass'], sync_type=sync_type,
                exch_strategy=exch, options=options)


def main(argv=None):
    """Parse, validate, launch and wait; returns the exit status."""
    from .rules import BSP
    argv = sys.argv[1:] if argv is None else argv
    try:
        path = parse_args(argv)
        s = session_from_file(path)
        rule = BSP()
        rule.sync_type, rule.exch_strategy = s['sync_type'], s['exch_strategy']
        rule.init(s['devices'], s['modelfile'], s['modelclass'], **s['options'])
    except ValueError as exc:
        sys.stderr.write('tmlauncher: error: %s\n%s\n' % (exc, USAGE))
        return 2
    return rule.wait()


if __name__ == '__main__':
    sys.exit(main())
