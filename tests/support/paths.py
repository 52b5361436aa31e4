"""Where things are: the checkout, the tests, the rank scripts."""
import os

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(TESTS)
MPI_DIR = os.path.join(TESTS, 'mpi')        # rank scripts, run under mpiexec (or alone)
