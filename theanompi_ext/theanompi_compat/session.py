"""Launch a Theano-MPI session config file with this project's exchange.

usage::

    python -m theanompi_ext.tmlauncher -cfg=session.cfg     (console script: tmxlauncher)

The console script is ``tmxlauncher``, not ``tmlauncher``: installing
Theano-MPI installs its own bash ``tmlauncher``, and the two must not
overwrite each other.

Flags, as Theano-MPI's launcher spells them: ``-cfg=F`` / ``--config=F``
(also ``--cfg F``), ``-file=`` / ``--modelfile=``, ``-class=`` /
``--modelclass=``, ``-r=`` / ``--rule=``, ``-bsp_sync_type=``,
``-bsp_exch_strategy=``; and ``--dry-run`` (ours: build the model once
here and print the plan, the backward chunks found included, without
launching, :mod:`~theanompi_ext.theanompi_compat.dry_run`) and ``--resume``
(ours: the key ``RESUME=1``, start from ``OUT/checkpoint.h5``). Any other
flag (Theano-MPI's ``-bind``, ``-s``) is an error, not ignored. A flag and
a session key that disagree are an error.

Session file: Theano-MPI's (a bash file of ``KEY=VALUE`` lines, ``#``
comments, quoted values, ``DEVICES=("node0:cuda0" "node1:cuda0,cuda1")``
arrays over several lines). Keys (case-insensitive): ``RULE=BSP``,
``MODELFILE=pkg.module`` (or a ``.py`` path), ``MODELCLASS=Name``,
``DEVICES`` (one per rank: rank r computes on entry r, ``cudaN``,
``openclP:D``, or ``cpu``/``cpuN`` for the host backend); ``BSP_SYNC_TYPE`` / ``SYNC_TYPE`` (kn, avg, cdd; default kn),
``BSP_EXCH_STRATEGY`` / ``EXCH_STRATEGY`` (ar, ar-overlap; default ar);
and every exchange option of :data:`theanompi_ext.theanompi_compat.options.OPTION_DEFAULTS`
(``WARMUP``, ``WARMUP_EPOCHS``, ``REF_BATCH``, ``BATCH_PER_WORKER``,
``WEIGHT_DECAY``, ``MOMENTUM``, ``MOMENTUM_FORM``, ``EXCHANGE_BN``,
``BUCKET_CAP_MB``, ``FIRST_BUCKET_CAP_MB``, ``MAX_STEPS``, ``OUT``,
``CHECKPOINT_SIGNAL``, ``ON_CHECKPOINT_SIGNAL``, ``CHECKPOINT_EVERY_S``), and the job process's
``MAX_RESTARTS`` (needs ``OUT``), ``RESTART_BACKOFF_S``, ``START_TIMEOUT_S``
and ``RESUME`` (:data:`.rule.RESTART_OPTIONS`). An
unknown key or flag, a missing model file or class, or a bad value ends
with a message naming it and exit status 2; otherwise the exit status is
the job's.
"""
import re
import shlex
import sys

from ..errors import EXIT_BAD_INPUT

USAGE = ('usage: python -m theanompi_ext.tmlauncher -cfg=SESSION.cfg [-file=MODELFILE] '
         '[-class=MODELCLASS] [-r=BSP] [-bsp_sync_type=kn|avg|cdd] '
         '[-bsp_exch_strategy=ar|ar-overlap] [--dry-run] [--resume]   (console script: '
         'tmxlauncher)')
REQUIRED = ('rule', 'modelfile', 'modelclass', 'devices')
# Flag spellings -> session key (Theano-MPI's launcher's flags).
FLAGS = {'-cfg': 'cfg', '--cfg': 'cfg', '--config': 'cfg', '-file': 'modelfile',
         '--modelfile': 'modelfile', '-class': 'modelclass', '--modelclass': 'modelclass',
         '-r': 'rule', '--rule': 'rule', '-bsp_sync_type': 'sync_type',
         '-bsp_exch_strategy': 'exch_strategy'}
REFUSED_FLAGS = {'-b': 'core binding', '-bind': 'core binding',
                 '-s': 'a size (the number of ranks is the number of DEVICES)',
                 '--size': 'a size (the number of ranks is the number of DEVICES)'}
ALIASES = {'bsp_sync_type': 'sync_type', 'bsp_exch_strategy': 'exch_strategy'}
# Session defaults: Theano-MPI's BSP exchanges after the whole backward pass.
MODE_DEFAULTS = {'sync_type': 'kn', 'exch_strategy': 'ar'}


def known_keys():
    """Lower-case keys a session file may use."""
    from .options import OPTION_DEFAULTS
    from .rule import RESTART_OPTIONS
    return set(REQUIRED) | set(MODE_DEFAULTS) | set(ALIASES) | set(OPTION_DEFAULTS) | \
        set(RESTART_OPTIONS)


def parse_args(argv):
    """``{key: value}`` from the flags (ValueError naming an unknown or refused flag)."""
    argv, out, i = list(argv), {}, 0
    while i < len(argv):
        arg = argv[i]
        if arg == '--dry-run':
            out['dry_run'], i = True, i + 1
            continue
        if arg == '--resume':      # as the session key RESUME=1
            out['resume'], i = '1', i + 1
            continue
        flag, eq, value = arg.partition('=')
        if flag in REFUSED_FLAGS:
            raise ValueError('flag %s (%s) is not supported by theanompi_ext\'s launcher'
                             % (flag, REFUSED_FLAGS[flag]))
        if flag not in FLAGS:
            raise ValueError('unknown flag %r' % arg)
        if not eq:
            if i + 1 >= len(argv):
                raise ValueError('flag %s needs a value' % flag)
            i += 1
            value = argv[i]
        out[FLAGS[flag]] = value
        i += 1
    if 'cfg' not in out and not all(k in out for k in ('modelfile', 'modelclass')):
        raise ValueError('no session config given')
    return out


def read_session_file(path, known):
    """Theano-MPI's session file (a sourced bash file) as ``{key: str or [str]}``.

    ``KEY=VALUE`` with shell quoting and ``#`` comments; ``KEY=( ... )``
    arrays may span lines. ValueError names the file and line.
    """
    from ..train.options import read_config_lines
    lines = read_config_lines(path)
    out, no = {}, 0
    while no < len(lines):
        start, text = no + 1, lines[no]
        no += 1
        try:
            key, eq, rest = text.strip().partition('=')
            if eq and rest.lstrip().startswith('(') and '#' not in key:
                value, piece = [], rest.lstrip()[1:]
                while True:
                    value += shlex.split(piece, comments=True)
                    if value and value[-1].endswith(')'):
                        value[-1] = value[-1][:-1]
                        value = [v for v in value if v]
                        break
                    if no >= len(lines):
                        raise ValueError('array %s=( is not closed with ")"' % key.strip())
                    piece, no = lines[no], no + 1
            else:
                words = shlex.split(text, comments=True)
                if not words:
                    continue
                if len(words) != 1 or '=' not in words[0]:
                    raise ValueError('expected KEY=VALUE, got %r%s' % (text.strip(), (
                        '; quote a value with spaces, as bash needs: %s="%s"'
                        % (key.strip(), rest.split('#')[0].strip())) if '=' in words[0] else ''))
                key, _, value = words[0].partition('=')
        except ValueError as exc:
            raise ValueError('%s line %d: %s' % (path, start, exc))
        key = key.strip().lower()
        if not key:
            raise ValueError('%s line %d: empty key' % (path, start))
        if key not in known:
            raise ValueError('%s line %d: unknown key %r (known: %s)'
                             % (path, start, key.upper(), ', '.join(sorted(k.upper() for k in known))))
        name = ALIASES.get(key, key)
        if name in out and out[name] != value:
            raise ValueError('%s line %d: %s=%s contradicts an earlier %s=%s'
                             % (path, start, key.upper(), value, name.upper(), out[name]))
        out[name] = value
    return out


def _merge(flags, values, path):
    for key, value in flags.items():
        if key == 'cfg':
            continue
        if key in values and values[key] != value:
            raise ValueError('%s=%s on the command line but %s=%s in %s: give one'
                             % (key.upper(), value, key.upper(), values[key], path))
        values[key] = value
    return values


def _exchange_mode(values, options, path):
    """(sync_type, exch_strategy) of the session, refused as every entry point
    refuses them (:func:`theanompi_ext.exchange.modes.check_mode`), the
    session's key named in the message."""
    from ..exchange.modes import ModeError
    from .rule import check_exchange_options
    mode = [values.get(key, default) for key, default in MODE_DEFAULTS.items()]
    try:
        check_exchange_options(*mode, wire=options.get('wire_dtype', 'float32'))
    except ModeError as exc:
        raise ValueError('%s: %s' % (path, exc.named(exc.option.upper())))
    except ValueError as exc:
        raise ValueError('%s: %s' % (path, exc))
    return mode


def _as_keys(message):
    """A message of :func:`.rule.restart_settings` in a session file's words."""
    message = re.sub(r'\b(?:the )?option (\w+)',
                     lambda m: ('the key ' if m.group(0).startswith('the') else '') +
                     m.group(1).upper(), message)
    return message.replace('resume=True', 'RESUME=1')


def session_from_file(path, flags=None):
    """Validated session settings from a config file and flags (ValueError naming the problem)."""
    from .options import OPTION_DEFAULTS
    from .rule import check_model
    from ..engine.devices import parse_devices
    values = read_session_file(path, known_keys()) if path else {}
    path = path or 'the command line'
    values = _merge(flags or {}, values, path)
    values.setdefault('rule', 'BSP')
    missing = [k.upper() for k in REQUIRED if k not in values]
    if missing:
        raise ValueError('%s: missing key(s) %s' % (path, ', '.join(missing)))
    for key, value in values.items():
        if key != 'devices' and not isinstance(value, str):
            raise ValueError('%s: %s is an array; only DEVICES may be one' % (path, key.upper()))
    if values['rule'].upper() != 'BSP':
        raise ValueError('%s: RULE=%s is not supported (only BSP)' % (path, values['rule']))
    try:
        parse_devices(values['devices'])
    except ValueError as exc:
        raise ValueError('%s: %s' % (path, exc))
    options = {}
    for key in OPTION_DEFAULTS:
        if key in values:
            try:
                OPTION_DEFAULTS[key][1](values[key])
            except ValueError:
                raise ValueError('%s: %s=%s is not a valid %s' % (
                    path, key.upper(), values[key], type(OPTION_DEFAULTS[key][0]).__name__))
            options[key] = values[key]
    from .rule import RESTART_OPTIONS, restart_settings
    restart = {key: values[key] for key in RESTART_OPTIONS if key in values}
    try:
        restart_settings(dict(restart, **{k: options[k] for k in (
            'out', 'checkpoint_signal', 'on_checkpoint_signal', 'checkpoint_every_s')
            if k in options}))
    except ValueError as exc:
        raise ValueError('%s: %s' % (path, _as_keys(str(exc))))
    options.update(restart)
    sync_type, exch = _exchange_mode(values, options, path)
    check_model(values['modelfile'], values['modelclass'])
    devices = values['devices']
    return dict(devices=[devices] if isinstance(devices, str) else list(devices),
                modelfile=values['modelfile'], modelclass=values['modelclass'],
                sync_type=sync_type, exch_strategy=exch, options=options)


def main(argv=None):
    """Parse, validate, launch and wait; returns the exit status (141 when its
    output was closed, as ``theanompi-ext``'s: :mod:`theanompi_ext.output_faults`)."""
    from .. import output_faults
    output_faults.reopen_missing()     # before anything opens a file or writes
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ('-h', '--help', '-help') for a in argv):
        return output_faults.run_command(lambda: sys.stdout.write(USAGE + '\n') and 0,
                                         'tmxlauncher', trains=False, prints_only=True)
    return output_faults.run_command(lambda: _main(argv), 'tmxlauncher',
                                     trains='--dry-run' not in argv)


def _main(argv):
    from .rule import BSP
    from ..engine.flags import CacheUnusable
    from ..launch.reach import Unreachable
    try:
        flags = parse_args(argv)
        dry_run = flags.pop('dry_run', False)
        s = session_from_file(flags.get('cfg'), flags)
        if dry_run:
            from .dry_run import plan_lines
            return plan_lines(s)
        rule = BSP()
        rule._ends_process = True           # a stop is this process's end
        rule.sync_type, rule.exch_strategy = s['sync_type'], s['exch_strategy']
        rule.init(s['devices'], s['modelfile'], s['modelclass'], **s['options'])
    except (Unreachable, CacheUnusable) as exc:  # not usage errors: a host down, a cache
        sys.stderr.write('tmxlauncher: error: %s\n' % exc)
        return EXIT_BAD_INPUT
    except ValueError as exc:
        sys.stderr.write('tmxlauncher: error: %s\n%s\n' % (exc, USAGE))
        return EXIT_BAD_INPUT
    return rule.wait()


if __name__ == '__main__':
    sys.exit(main())
