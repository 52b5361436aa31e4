"""Where things are: the checkout, the tests, the rank scripts."""
import os

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(TESTS)
MPI_DIR = os.path.join(TESTS, 'mpi')        # rank scripts, run under mpiexec (or alone)


def root_on_path(env=None, **extra):
    """A copy of ``env`` (default ``os.environ``) with the checkout first on
    PYTHONPATH (a child started outside it, e.g. in a test's folder, imports this
    tree) and ``extra`` set."""
    env = dict(os.environ if env is None else env, **extra)
    rest = [p for p in env.get('PYTHONPATH', '').split(os.pathsep) if p]
    env['PYTHONPATH'] = os.pathsep.join([ROOT] + rest)
    return env
