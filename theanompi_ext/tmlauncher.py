"""Alias kept for ``python -m theanompi_ext.tmlauncher``: see
:mod:`theanompi_ext.theanompi_compat.session`."""
from .theanompi_compat.session import main, parse_args, session_from_file  # noqa: F401

if __name__ == '__main__':
    import sys
    sys.exit(main())
