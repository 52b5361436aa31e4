"""``theanompi-ext bench``: one sub-command per measurement.

:data:`BENCHES` maps a sub-command name to the module implementing it. A
module plugs in by defining ``register(subparsers)``, which adds its parser
to the ``bench`` sub-parsers and sets ``func`` (called with the parsed
arguments; its return value is the exit status), exactly like the
top-level commands of :mod:`theanompi_ext.cli`. Modules are imported only
when ``bench`` is parsed, and must not import Theano at module level.
"""
from ..cli import register_modules
from ..errors import EXIT_BAD_INPUT

BENCHES = {
    'overlap': 'theanompi_ext.bench.overlap',
    'allreduce': 'theanompi_ext.bench.allreduce',
    'compare': 'theanompi_ext.bench.compare',
    'validate': 'theanompi_ext.bench.validate',
    'casts': 'theanompi_ext.bench.casts',
}


def register(sub):
    """Add the ``bench`` sub-command and every available benchmark under it."""
    parser = sub.add_parser('bench', help='measure: overlap of communication with backprop, ...')
    benches = parser.add_subparsers(dest='bench', metavar='BENCH')
    register_modules(benches, BENCHES.values())

    def no_bench(args):
        parser.print_help()
        return EXIT_BAD_INPUT
    parser.set_defaults(func=no_bench)
