"""The ``theanompi-ext`` command line: the top-level parser and its sub-commands
(:mod:`.commands`), ``info`` (:mod:`.info`), argparse types (:mod:`.argtypes`).

``main`` is re-exported: the console script is ``theanompi_ext.cli:main``.
"""
from .commands import main  # noqa: F401
