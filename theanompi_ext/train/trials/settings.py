"""Settings of ``trials``: ``NAME:'OPTIONS'`` or a settings file, merged with the
common options into one validated TrainConfig each."""
import argparse
import re
import shlex

from .. import options

_NAME = re.compile(r'^[A-Za-z0-9][A-Za-z0-9_.+-]*$')


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
