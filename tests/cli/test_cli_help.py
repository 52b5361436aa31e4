"""Every option of every command explains itself (issue 19): the parsers are read,
not the docs."""
import argparse
import re

import pytest

from theanompi_ext.cli.commands import build_parser
from theanompi_ext.train import cli as train_cli

DEFAULT = re.compile(r'\((default|e\.g\.)[^()]*(\([^()]*\)[^()]*)*\)')


def all_parsers():
    """``[(command path, parser)]`` for the top level and every (nested) sub-command."""
    out, todo = [], [('theanompi-ext', build_parser())]
    while todo:
        name, p = todo.pop()
        out.append((name, p))
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                todo += [('%s %s' % (name, sub), sp) for sub, sp in a.choices.items()]
    return out


PARSERS = dict(all_parsers())
OPTIONS = [(name, a) for name, p in PARSERS.items() for a in p._actions
           if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]


def test_every_command_is_read():
    # the commands of cli.COMMANDS and bench's BENCHES, nothing left out
    for cmd in ('train', 'trials', 'check-equivalence', 'convert', 'simulate', 'info',
                'bench', 'bench overlap', 'bench allreduce', 'bench compare'):
        assert 'theanompi-ext ' + cmd in PARSERS
    assert len(OPTIONS) > 80


@pytest.mark.parametrize('name,action', OPTIONS,
                         ids=['%s %s' % (n, a.option_strings[0] if a.option_strings else a.dest)
                              for n, a in OPTIONS])
def test_option_has_a_sentence_and_is_named_in_the_help(name, action):
    text = PARSERS[name]._get_formatter()._expand_help(action) if action.help else ''
    words = DEFAULT.sub('', text).split()
    assert len(words) >= 4, '%s %s: help %r is not a sentence' % (
        name, '/'.join(action.option_strings) or action.dest, action.help)
    shown = PARSERS[name].format_help()
    for flag in action.option_strings or [action.metavar or action.dest]:
        assert flag in shown


@pytest.mark.parametrize('flag,values', [
    ('--warmup', ['gradual', 'constant', 'none', 'theanompi']),
    ('--momentum-form', ['eq9', 'eq10', 'eq10-nocorrect']),
    ('--sync-type', ['kn', 'avg', 'cdd']),
    ('--exch-strategy', ['ar', 'ar-overlap']),
    ('--model', ['digits_cnn', 'mlp', 'resnet20', 'resnet50', 'vgg16'])])
def test_fixed_sets_are_choices_listed_in_the_help(flag, values, capsys):
    for cmd in ('train', 'trials'):
        p = PARSERS['theanompi-ext ' + cmd]
        action = next(a for a in p._actions if flag in a.option_strings)
        assert all(v in action.choices for v in values)
        assert 'bogus' not in action.choices
        help_text = re.sub(r'\s+', ' ', p.format_help())
        assert ', '.join(sorted(values)[:1]) in help_text
        for v in values:
            assert v in help_text
    # a value outside the set is refused by argparse, naming the option
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(['train', flag, 'bogus'])
    assert e.value.code == 2
    assert flag in capsys.readouterr().err


def test_train_help_groups_options_and_ends_with_examples():
    text = PARSERS['theanompi-ext train'].format_help()
    titles = ['launch:', 'model and data:', "the paper's recipe", 'exchange:',
              'checkpoints and faults:', 'output:']
    at = [text.index(t) for t in titles]
    assert at == sorted(at)
    tail = text[text.index('examples:'):].strip().splitlines()
    assert tail[0] == 'examples:'
    lines = ' '.join(l.strip().rstrip('\\') for l in tail[1:] if not l.strip().startswith('#'))
    cmds = [c.split() for c in lines.split('theanompi-ext ')[1:]]
    assert len(cmds) == 2
    for argv in cmds:       # both examples are valid command lines
        args = build_parser().parse_args(argv)
        assert args.func is train_cli.main


def test_config_options_name_their_group():
    # a training option nobody placed in a group would land in 'other training options'
    text = PARSERS['theanompi-ext train'].format_help()
    assert 'other training options' not in text


def test_reading_the_options_does_not_import_theano():
    # the zoo's names are read only when shown or checked (theanompi-ext info stays fast)
    import subprocess
    import sys
    code = ('import sys; from theanompi_ext.cli.commands import build_parser; '
            "build_parser().parse_args(['train', '--epochs', '3']); "
            "print('theano' in sys.modules)")
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                       timeout=120)
    assert r.stdout.strip() == 'False', r.stderr
