"""The ``theanompi-ext`` console command.

Each sub-command lives in the module that owns the feature and exposes
``register(subparsers)``, which adds its parser and sets ``func`` (called
with the parsed arguments; its return value is the exit status). Modules
are imported only when listed here, and must not import Theano at module
level unless the command needs it, so ``theanompi-ext info`` stays fast.
"""
import argparse
import importlib
import sys

from .. import closed_output
from ..errors import EXIT_BAD_INPUT

COMMANDS = [
    'theanompi_ext.cli.info',
    'theanompi_ext.train.check_equivalence',
    'theanompi_ext.train.cli',
    'theanompi_ext.train.trials',
    'theanompi_ext.data.convert',
    'theanompi_ext.simulate.cli',
    'theanompi_ext.bench.cli',
    'theanompi_ext.launch.hostlists',
]

#: Commands whose work is what they print: a closed output ends them silently,
#: as it ends ``ls | head``; the others say on stderr why they stopped.
PRINT_ONLY = ('info', 'simulate', 'hostfile')


def build_parser():
    """The top-level parser with every sub-command registered."""
    parser = argparse.ArgumentParser(
        prog='theanompi-ext',
        description='Large-minibatch synchronous SGD for Theano-MPI models.')
    sub = parser.add_subparsers(dest='command', metavar='COMMAND')
    register_modules(sub, COMMANDS)
    return parser


def register_modules(sub, modnames):
    """Call ``register(sub)`` of each module in ``modnames`` that this build has."""
    for modname in modnames:
        try:
            mod = importlib.import_module(modname)
        except ImportError as exc:
            if exc.name and modname.startswith(exc.name):
                continue  # feature not present in this build
            raise
        mod.register(sub)


def main(argv=None):
    """Entry point of the console script.

    Its status is the command's; 141 when its output was closed (``| head``
    ended first: :mod:`theanompi_ext.closed_output`).
    """
    args = None
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if not getattr(args, 'func', None):
            parser.print_help()
            return EXIT_BAD_INPUT
        return int(args.func(args) or 0)
    except BrokenPipeError as exc:
        if not closed_output.is_closed(exc):
            raise
        command = getattr(args, 'command', None)
        return closed_output.end(
            None if command in PRINT_ONLY or args is None else
            'theanompi-ext %s: stopped %s (exit status %d)'
            % (command, closed_output.WHY, closed_output.STATUS))


if __name__ == '__main__':
    sys.exit(main())
