"""The one way a training run is launched: a config file and the mpiexec line
that starts the training worker on every rank.

Used by ``theanompi-ext train``, ``check-equivalence`` and ``trials``; each
then runs the line its own way (names a rank that died, bounds the time,
copies the output to a run's log).
"""
import contextlib
import os
import sys
import tempfile

from .mpiexec import mpiexec_command
from ..files.atomic import write_json

#: The program every rank runs, with the path of the run's JSON config.
WORKER_MODULE = 'theanompi_ext.train.worker'


def worker_command(workers, config_path, hostfile=None):
    """The mpiexec line that starts ``workers`` ranks of the training worker on
    ``config_path`` (unbuffered, so the ranks' lines arrive as they are written)."""
    return mpiexec_command(workers, [sys.executable, '-u', '-m', WORKER_MODULE, config_path],
                           hostfile=hostfile)


def write_worker_config(config, path):
    """Write ``config`` (a TrainConfig's dict) as the JSON file the worker reads."""
    return write_json(path, config, "the workers' configuration", indent=1)


@contextlib.contextmanager
def temporary_worker_config(config, folder=None):
    """The path of a temporary JSON file holding ``config`` (in ``folder``, default
    $TMPDIR: across hosts every rank reads it, so a folder they all see), removed
    afterwards."""
    with tempfile.NamedTemporaryFile('w', suffix='.json', prefix='.theanompi-ext-config-',
                                     dir=folder, delete=False) as fh:
        path = fh.name
    try:
        yield write_worker_config(config, path)
    finally:
        os.unlink(path)
