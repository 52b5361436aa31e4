"""What the benchmarks share: their common options and each rank's entry point."""
import json

from ..cli.argtypes import output_path
from ..files.atomic import write_json


def add_common_options(p, network_example, timeout_s, json_help='write the results to FILE',
                       timeout_what='a setting'):
    """Add ``--network``, ``--json`` and ``--timeout`` to benchmark parser ``p``."""
    p.add_argument('--network', action='append', default=None, metavar='NET',
                   help="network between the ranks: 'shm' (shared memory, default) or "
                        "'tbf:RATE', TCP in a network namespace shaped to RATE, e.g. tbf:%s (needs root); repeat to "
                        "measure several" % network_example)
    p.add_argument('--json', default='', metavar='FILE', type=output_path, help=json_help)
    p.add_argument('--timeout', type=float, default=timeout_s, metavar='S',
                   help='%s still running after this many seconds is stopped (default '
                        '%%(default)s)' % timeout_what)


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
