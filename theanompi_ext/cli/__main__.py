"""``python -m theanompi_ext.cli``: the same as ``theanompi-ext``."""
import sys

from .commands import main

sys.exit(main())
