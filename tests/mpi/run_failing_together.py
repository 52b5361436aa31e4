"""Every rank fails inside ``train.worker.guarded`` (nothing trained), as CASE says.

usage: run_failing_together.py CASE

  alike   every rank raises the same NonFiniteLoss (an error all ranks find at once)
  differ  every rank raises a ReplicaMismatch whose text depends on rank % 2
  mixed   rank 0 raises MemoryError (it aborts the job), the others NonFiniteLoss
"""
import sys

from theanompi_ext.errors import NonFiniteLoss, ReplicaMismatch
from theanompi_ext.train.worker import guarded


def fail(case):
    from mpi4py import MPI
    rank = MPI.COMM_WORLD.rank
    if case == 'alike':
        raise NonFiniteLoss('non-finite loss (nan) at iteration 7')
    if case == 'differ':
        raise ReplicaMismatch('parameters differ; this rank holds copy %s' % 'AB'[rank % 2])
    if case == 'mixed':
        if rank == 0:
            raise MemoryError('injected on rank 0')
        raise NonFiniteLoss('non-finite loss (inf) at iteration 7')
    raise SystemExit('unknown case %r' % case)


if __name__ == '__main__':
    sys.exit(guarded(lambda: fail(sys.argv[1])))
