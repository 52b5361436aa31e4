"""What the benchmarks share: their common options, running a job, each rank's entry point."""
import argparse
import json
import os
import sys
import tempfile

from ..cli.argtypes import output_path
from ..files.atomic import write_json
from ..errors import EXIT_TIMED_OUT


def add_common_options(p, network_example, timeout_s, json_help='write the results to FILE',
                       timeout_what='a setting'):
    """Add ``--network``, ``--json`` and ``--timeout`` to benchmark parser ``p``."""
    p.add_argument('--network', action='append', default=None, metavar='NET',
                   help="network between the ranks: 'shm' (shared memory, default) or "
                        "'tbf:RATE', TCP in a network namespace shaped to RATE, e.g. tbf:%s, or "
                        "'hosts:HxR:RATE[:QUEUE][:loss=P][:per-frame]', H emulated hosts of R "
                        "ranks, shared memory within a host and RATE between hosts, e.g. "
                        "hosts:2x2:200mbit (QUEUE: how long a packet may wait at a link, default "
                        "1s, lossless; 50ms drops; loss=1%%%%: each packet lost with that "
                        "chance, each way; per-frame: a packet per frame, as on a wire) "
                        "(tbf and hosts need root); repeat to measure several" % network_example)
    p.add_argument('--json', default='', metavar='FILE', type=output_path, help=json_help)
    p.add_argument('--timeout', type=float, default=timeout_s, metavar='S',
                   help='%s still running after this many seconds is stopped (default '
                        '%%(default)s)' % timeout_what)


def add_mpi_env_option(p):
    """Add ``--mpi-env KEY=VALUE`` (repeatable; ``args.mpi_env``: a list of pairs)."""
    p.add_argument('--mpi-env', action='append', default=[], metavar='KEY=VALUE',
                   type=env_item, help='extra environment variable for the ranks of our '
                   'jobs (e.g. an MPICH CVAR); repeat for several')


def env_item(text):
    """``'KEY=VALUE'`` -> ``(KEY, VALUE)`` (argparse's error for anything else)."""
    key, sep, value = text.partition('=')
    if not sep or not key or not key.replace('_', 'A').isalnum():
        raise argparse.ArgumentTypeError('expected KEY=VALUE with KEY a variable name, '
                                         'got %r' % text)
    return key, value


def rank_main(spec_path, measure):
    """Entry point of each rank of a benchmark job.

    Reads the job's spec (JSON) from ``spec_path``, runs ``measure(spec)``
    on every rank, and rank 0 writes its result to ``spec['out']``.
    Returns the exit status; an error on any rank ends the job
    (:func:`theanompi_ext.train.worker.guarded`).
    """
    from ..train.worker import guarded
    with open(spec_path) as f:
        spec = json.load(f)

    def run():
        res = measure(spec)
        from ..collective.world import world_comm
        if world_comm().Get_rank() == 0:
            write_json(spec['out'], res, 'the rank results')
    return guarded(run)


def run_job(module, spec, net, ranks, timeout, env_extra=None, python=None):
    """Run ``python -m module SPEC.json`` on ``ranks`` MPI ranks in network ``net``
    (``python``: the interpreter's path; None: this one).

    ``net`` is a parsed network (see
    :func:`theanompi_ext.launch.emulated_network.parse_network`; on
    ``hosts:HxR:RATE[:QUEUE]`` the job gets fresh emulated hosts, H x R ranks);
    ``env_extra`` overrides variables of the ranks' environment. The spec
    gets ``out`` (where rank 0 writes its result as JSON, see
    :func:`rank_main`) and ``network``; that result is returned. Raises
    RuntimeError when the ranks fail or outlast ``timeout`` seconds,
    NetworkSetupError when the emulated network cannot be made.
    """
    from ..launch import mpiexec_command
    from ..launch.emulated_network import format_network, run_on_network
    from ..launch.mpiexec import child_env
    env = child_env()
    env.update(env_extra or {})
    with tempfile.TemporaryDirectory(prefix='bench-') as tmp:
        spec = dict(spec, out=os.path.join(tmp, 'result.json'), network=format_network(net))
        path = os.path.join(tmp, 'spec.json')
        write_json(path, spec, 'the job spec')
        argv = [python or sys.executable, '-u', '-m', module, path]
        if net[0] == 'hosts':
            from ..launch.emulated_hosts import run_on_hosts
            status = run_on_hosts(argv, net, env, timeout)
        else:
            status = run_on_network(mpiexec_command(ranks, argv), net, env, timeout)
        if status == EXIT_TIMED_OUT:
            raise RuntimeError('stopped after --timeout %g s' % timeout)
        if status != 0:
            raise RuntimeError('the ranks failed (exit status %d)' % status)
        with open(spec['out']) as f:
            return json.load(f)
