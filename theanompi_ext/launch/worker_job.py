"""The one way a training run is launched: the run's config in the ranks'
environment and the mpiexec line that starts the training worker on every rank.

Used by ``theanompi-ext train``, ``check-equivalence`` and ``trials``; each
then runs the line its own way (names a rank that died, bounds the time,
copies the output to a run's log).

The config travels in the environment (:data:`CONFIG_VAR`), not in a file:
mpiexec gives its environment to every host (Open MPI: the variables it is
told to forward, ``mpiexec.forwarded_env_args``), so a rank starts on a host
that does not share the launcher's folders, and says so by name
(``train/placement.py``) instead of dying before MPI starts, where hydra
would leave the other ranks waiting.
"""
import json
import sys

from .mpiexec import mpiexec_command
from ..files.atomic import write_json

#: The program every rank runs.
WORKER_MODULE = 'theanompi_ext.train.worker'
#: The run's config (a TrainConfig's dict as JSON), read by every rank.
CONFIG_VAR = 'THEANOMPI_EXT_WORKER_CONFIG'


def worker_command(workers, hostfile=None):
    """The mpiexec line that starts ``workers`` ranks of the training worker
    (unbuffered, so the ranks' lines arrive as they are written); their config
    comes from :func:`worker_env`."""
    return mpiexec_command(workers, [sys.executable, '-u', '-m', WORKER_MODULE],
                           hostfile=hostfile)


def worker_env(config, env):
    """``env`` with the run's ``config`` (a TrainConfig's dict) for every rank."""
    return dict(env, **{CONFIG_VAR: json.dumps(config, sort_keys=True)})


def write_worker_config(config, path):
    """Write ``config`` (a TrainConfig's dict) as a JSON file (a run's record; the
    worker also reads one named on its command line)."""
    return write_json(path, config, "the workers' configuration", indent=1)
