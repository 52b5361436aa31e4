"""The ranks a backend runs on: MPI's world, or one process without MPI.

The GPU backends use MPI only to hand rank 0's NCCL unique id to the other
ranks and for small cross-rank checks. One process on one GPU (a
workstation, the device check in ``scripts/``) needs neither, and a stock
GPU image often has mpi4py but no MPI library, so ``from mpi4py import
MPI`` raises there. :func:`world_comm` then returns a :class:`OneRankWorld`
instead, unless an MPI launcher started the process: several ranks each
carrying on alone would train as many separate models, so that is an error.
"""
import contextlib
import os
import sys

# Variables set by the launchers of MPICH (hydra), Open MPI, Slurm and PMIx.
LAUNCHER_VARS = ('PMI_RANK', 'PMI_SIZE', 'OMPI_COMM_WORLD_SIZE', 'PMIX_RANK',
                 'MPI_LOCALRANKID')

# What launchers export as the rank's index on its host (Open MPI, MPICH's
# hydra, MVAPICH, Slurm): the local rank when no communicator is at hand.
LOCAL_RANK_VARS = ('OMPI_COMM_WORLD_LOCAL_RANK', 'MPI_LOCALRANKID', 'MV2_COMM_WORLD_LOCAL_RANK',
                   'SLURM_LOCALID')

MPI_HINT = ('install an MPI for mpi4py (pip install mpich) or build mpi4py against '
            "the site's MPI (README, \"Pinned stack\")")

#: MCA settings for a process that starts MPI alone, outside any launcher (MPI's
#: singleton: ``theanompi-ext info``, ``train --workers 1``, a test): Open MPI
#: 5.0.11 leaves a 16 MB shared-memory segment in /dev/shm behind each such
#: process (measured), which it only creates to talk to peers it does not have.
#: MPICH ignores them; a value the user set wins.
SINGLETON_ENV = {'OMPI_MCA_btl': 'self'}


def in_mpi_job(environ=None):
    """True when an MPI launcher started this process (its variables are set)."""
    environ = os.environ if environ is None else environ
    return any(v in environ for v in LAUNCHER_VARS)


# Where a launcher tells a process it is a rank: these and LAUNCHER_VARS, LOCAL_RANK_VARS
# (MPICH's hydra: PMI_FD, PMI_PORT, HYDI_CONTROL_FD; Open MPI/PMIx: PMIX_*, OMPI_COMM_WORLD_*).
RANK_VAR_PREFIXES = ('PMI_', 'PMIX_', 'HYDI_', 'OMPI_COMM_WORLD_', 'MPI_LOCALNRANKS')


def outside_the_job(environ=None):
    """A copy of the environment without the variables that make a process a rank
    of the MPI job that started this one: for a process this one starts that must
    be a job of its own (``theanompi-ext info``'s checks; a child that inherited
    them would try to join this rank's job: MPICH's ``PMI_Init`` fails on the
    inherited ``PMI_FD``)."""
    env = os.environ if environ is None else environ
    rank_vars = set(LAUNCHER_VARS) | set(LOCAL_RANK_VARS)
    return {k: v for k, v in env.items()
            if k not in rank_vars and not k.startswith(RANK_VAR_PREFIXES)}


def launcher_rank_size(environ=None):
    """``(rank, size)`` of this process in an MPI job, from the launcher's
    variables and without starting MPI; ``(0, None)`` outside one."""
    env = os.environ if environ is None else environ
    rank = next((int(env[v]) for v in ('PMI_RANK', 'OMPI_COMM_WORLD_RANK', 'PMIX_RANK')
                 if v in env), 0)
    size = next((int(env[v]) for v in ('PMI_SIZE', 'OMPI_COMM_WORLD_SIZE') if v in env), None)
    return rank, size


def local_rank(comm=None, environ=None):
    """This process's index among the ranks on its host (which GPU it takes), or None.

    With an mpi4py communicator ``comm``: MPI's answer, whatever launcher
    started the job (the ranks sharing memory share a host:
    ``Split_type(COMM_TYPE_SHARED)``); collective, so every rank of ``comm``
    must call it at the same point. Otherwise (no ``comm``, a
    :class:`OneRankWorld`, a test's fake, or a split that failed): the
    launcher's variables (:data:`LOCAL_RANK_VARS`). Never imports mpi4py: the
    engine asks at import time, before MPI need start.
    """
    MPI = sys.modules.get('mpi4py.MPI')
    if comm is not None and MPI is not None and isinstance(comm, MPI.Comm):
        try:
            node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
            try:
                return node.Get_rank()
            finally:
                node.Free()
        except Exception:
            pass
    env = os.environ if environ is None else environ
    for var in LOCAL_RANK_VARS:
        value = env.get(var, '')
        if value.isdigit():
            return int(value)
    return None


class OneRankWorld(object):
    """mpi4py's small-object API for a world of one process, with no MPI library.

    Rank 0 of 1: ``allgather`` returns ``[obj]``, ``bcast`` returns ``obj``,
    ``Barrier`` does nothing, ``Abort`` ends the process with ``code``.
    """

    def Get_rank(self):
        return 0

    def Get_size(self):
        return 1

    def allgather(self, obj):
        return [obj]

    def bcast(self, obj, root=0):
        if root != 0:
            raise ValueError('bcast root %r in a world of one rank' % (root,))
        return obj

    def Barrier(self):
        pass

    def Abort(self, code=1):
        os._exit(code)

    def __repr__(self):
        return 'OneRankWorld()'


@contextlib.contextmanager
def starting_mpi():
    """Around whatever may start MPI: ``from mpi4py import MPI``, and importing
    Theano (``theano/tensor/io.py`` imports it).

    Outside an MPI job, MPI starts with :data:`SINGLETON_ENV`, taken out of
    the environment again once MPI has read it, so that no launcher this
    process starts hands it to its ranks.
    """
    added = [] if in_mpi_job() or 'mpi4py.MPI' in sys.modules else \
        [k for k in SINGLETON_ENV if k not in os.environ]
    for key in added:
        os.environ[key] = SINGLETON_ENV[key]
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


def import_mpi():
    """mpi4py's ``MPI`` module, MPI started (:func:`starting_mpi`); the package's
    one import of it."""
    with starting_mpi():
        from mpi4py import MPI
    return MPI


def world_comm():
    """``MPI.COMM_WORLD``, or a :class:`OneRankWorld` when MPI cannot load.

    Raises ``RuntimeError`` naming mpi4py's error when MPI cannot load but
    an MPI launcher started this process.
    """
    try:
        return import_mpi().COMM_WORLD
    except Exception as exc:   # ImportError, or mpi4py's "cannot load MPI library"
        if in_mpi_job():
            raise RuntimeError('started by an MPI launcher, but mpi4py cannot load MPI '
                               '(%s: %s); %s' % (type(exc).__name__,
                                                 str(exc).splitlines()[0] if str(exc) else '',
                                                 MPI_HINT)) from exc
        return OneRankWorld()
