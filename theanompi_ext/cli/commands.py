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

from .. import output_faults
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
#: Commands whose product is on disk: a line that cannot be written (a full
#: disk) is dropped after one warning and they go on (the others end with 3).
TRAINS = ('train', 'trials', 'convert')


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
    ended first), 3 when a command other than ``train``, ``trials`` or
    ``convert`` could not write it (:mod:`theanompi_ext.output_faults`).
    """
    output_faults.reopen_missing()     # before anything opens a file or writes
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit:
        output_faults.flush_or_drop()    # --help into a closed or full output: argparse's 0
        raise
    if not getattr(args, 'func', None):
        parser.print_help()
        output_faults.flush_or_drop()    # as argparse's own help: usage, whatever the output
        return EXIT_BAD_INPUT
    return output_faults.run_command(
        lambda: int(args.func(args) or 0), 'theanompi-ext ' + args.command,
        trains=args.command in TRAINS and not getattr(args, 'dry_run', False),
        prints_only=args.command in PRINT_ONLY)


if __name__ == '__main__':
    sys.exit(main())
