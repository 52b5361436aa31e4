"""``theanompi-ext bench``: one sub-command per measurement.

:data:`BENCHES` maps a sub-command name to the module implementing it. A
module plugs in by defining ``register(subparsers)``, which adds its parser
to the ``bench`` sub-parsers and sets ``func`` (called with the parsed
arguments; its return value is the exit status), exactly like the
top-level commands of :mod:`theanompi_ext.cli`. Modules are imported only
when ``bench`` is parsed, and must not import Theano at module level.

While a benchmark runs, SIGTERM and SIGHUP end it through ``SystemExit``
(status 128 + the signal), as Ctrl-C does through ``KeyboardInterrupt``:
the ranks it started are stopped and a network namespace it made is
deleted on the way out (``launch/mpiexec.wait_job``,
``launch/emulated_network.run_on_network``).
"""
import signal
import sys

from .. import stop_signals
from ..cli.commands import register_modules
from ..errors import EXIT_BAD_INPUT, EXIT_SIGNAL_BASE

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)

BENCHES = {
    'overlap': 'theanompi_ext.bench.overlap',
    'allreduce': 'theanompi_ext.bench.allreduce',
    'compare': 'theanompi_ext.bench.compare',
    'validate': 'theanompi_ext.bench.validate',
    'casts': 'theanompi_ext.bench.casts',
    'hosts': 'theanompi_ext.bench.hosts',
    'restart': 'theanompi_ext.bench.restart',
}


def register(sub):
    """Add the ``bench`` sub-command and every available benchmark under it."""
    parser = sub.add_parser('bench', help='measure: overlap of communication with backprop, ...')
    benches = parser.add_subparsers(dest='bench', metavar='BENCH')
    register_modules(benches, BENCHES.values())
    for bench in benches.choices.values():
        bench.set_defaults(func=exit_on_stop_signals(bench.get_default('func')))

    def no_bench(args):
        parser.print_help()
        return EXIT_BAD_INPUT
    parser.set_defaults(func=no_bench)


def exit_on_stop_signals(func):
    """``func(args)`` with SIGTERM and SIGHUP raising ``SystemExit(128 + signal)``
    (the handlers before it are put back afterwards; one ignored when the
    benchmark started stays ignored: :mod:`theanompi_ext.stop_signals`)."""
    def run(args):
        def stop(signum, frame):
            sys.exit(EXIT_SIGNAL_BASE + signum)
        old = stop_signals.catch({sig: stop for sig in STOP_SIGNALS})
        try:
            return func(args)
        finally:
            stop_signals.restore(old)
    run.__doc__ = func.__doc__
    return run
