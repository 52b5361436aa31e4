"""Command-line and key=value-file options mapped onto :class:`TrainConfig`.

Every TrainConfig field is an option (``batch_per_worker`` is
``--batch-per-worker``); a ``--config FILE`` in the key=value style of
Theano-MPI's session files sets the same fields (keys case-insensitive),
and command-line options override the file.
"""
import argparse
import dataclasses

from .config import TrainConfig

_SKIP = {'extra'}
# Defaults that depend on other options, described instead of shown.
_DEFAULT_HELP = {'exch_strategy': 'ar-overlap with sync_type kn, ar with avg/cdd'}


def _parse_bool(s):
    v = str(s).strip().lower()
    if v in ('1', 'true', 'yes', 'on'):
        return True
    if v in ('0', 'false', 'no', 'off'):
        return False
    raise ValueError('expected a boolean (true/false), got %r' % (s,))


def _parse_tuple(s):
    s = str(s).strip().strip('()[]')
    try:
        return tuple(int(float(p)) for p in s.replace(',', ' ').split()) if s else ()
    except OverflowError:    # int(float('1e400'))
        raise ValueError('expected whole numbers, got %r' % (s,))


def converter(field):
    """The parser for one TrainConfig field's values."""
    default = field.default
    if isinstance(default, bool):
        return _parse_bool
    if isinstance(default, int):
        return int
    if isinstance(default, float):
        return float
    if isinstance(default, tuple):
        return _parse_tuple
    return str


def add_config_arguments(parser):
    """Add one option per TrainConfig field (defaults left as None = unset)."""
    for f in dataclasses.fields(TrainConfig):
        if f.name in _SKIP:
            continue
        flag = '--' + f.name.replace('_', '-')
        if isinstance(f.default, bool):
            parser.add_argument(flag, dest=f.name, nargs='?', const=True, default=None,
                                type=_parse_bool, help='(default %s)' % f.default)
        else:
            parser.add_argument(flag, dest=f.name, type=converter(f), default=None,
                                help='(default %s)' % (_DEFAULT_HELP.get(f.name, f.default),))


def read_kv_file(path, known=None):
    """Parse a key=value file (``#`` comments); keys are lower-cased.

    Raises ValueError naming the file and line for malformed lines.
    """
    out = {}
    try:
        with open(path) as fh:
            lines = fh.read().splitlines()
    except OSError as exc:
        raise ValueError('cannot read config file %s: %s' % (path, exc.strerror or exc))
    except UnicodeDecodeError:
        raise ValueError('config file %s is not text' % path)
    for no, raw in enumerate(lines, 1):
        line = raw.split('#', 1)[0].strip()
        if not line:
            continue
        if '=' not in line:
            raise ValueError('%s line %d: expected KEY=VALUE, got %r' % (path, no, raw.strip()))
        key, value = (s.strip() for s in line.split('=', 1))
        if not key:
            raise ValueError('%s line %d: empty key' % (path, no))
        key = key.lower()
        if known is not None and key not in known:
            raise ValueError('%s line %d: unknown key %r (known: %s)'
                             % (path, no, key.upper(), ', '.join(sorted(k.upper() for k in known))))
        out[key] = value.strip('"\'')
    return out


def config_from(args, file_values=None):
    """A validated TrainConfig from a key=value dict and parsed options."""
    fields = {f.name: f for f in dataclasses.fields(TrainConfig) if f.name not in _SKIP}
    values = {}
    for key, raw in (file_values or {}).items():
        if key not in fields:
            raise ValueError('unknown config key %r' % key.upper())
        try:
            values[key] = converter(fields[key])(raw)
        except ValueError as exc:
            raise ValueError('config key %s: %s' % (key.upper(), exc))
    for name in fields:
        v = getattr(args, name, None)
        if v is not None:
            values[name] = v
    return TrainConfig(**values).validate()


def config_keys():
    """Lower-case names a config file may use for training options."""
    return {f.name for f in dataclasses.fields(TrainConfig) if f.name not in _SKIP}


def build_parser(prog='theanompi-ext train'):
    """A stand-alone parser with every training option."""
    p = argparse.ArgumentParser(prog=prog)
    add_config_arguments(p)
    return p
