"""Another install of the package, as a host with its own copy would have it."""
import os
import shutil

from support.paths import ROOT

PACKAGE = os.path.join(ROOT, 'theanompi_ext')


def another_install(tmp_path):
    """``(the checkout's package folder, a copy of it under tmp_path/other_install with
    one comment line added to one module)``: a stale or locally edited install."""
    copy = os.path.join(str(tmp_path), 'other_install', 'theanompi_ext')
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns('__pycache__'))
    with open(os.path.join(copy, 'rules.py'), 'a') as f:
        f.write('# a local edit on one host\n')
    return PACKAGE, copy
