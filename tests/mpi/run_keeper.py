"""Two ranks under ``train.worker.guarded`` that wait; rank 1 prints its PID (for
tests/launch/test_rank_keeper.py to kill it)."""
import os
import sys
import time

from theanompi_ext.collective.world import world_comm
from theanompi_ext.train.worker import guarded


def work():
    if world_comm().rank == 1:
        print('rank1', os.getpid(), flush=True)
    time.sleep(60)


if __name__ == '__main__':
    sys.exit(guarded(work))
