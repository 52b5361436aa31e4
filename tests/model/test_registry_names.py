"""The zoo's names known without Theano are the names it registers."""
import os
import subprocess
import sys


def test_builtin_names_are_the_registered_ones():
    from theanompi_ext import model
    from theanompi_ext.model.registry import BUILTIN_NAMES
    model._load_zoo()
    assert sorted(BUILTIN_NAMES) == sorted(model.MODELS)


def test_checking_a_model_name_does_not_import_theano():
    # a rank of the user's own mpiexec parses --model before it opens --device
    code = ('import sys\n'
            'from theanompi_ext.train.options import ModelNames\n'
            'assert "resnet20" in ModelNames() and "nope" not in ModelNames()\n'
            'print("theano" in sys.modules)\n')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    # "nope" loads the zoo to list what is there; a known name must not
    code_known = code.replace(' and "nope" not in ModelNames()', '')
    out = subprocess.run([sys.executable, '-c', code_known], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == 'False'
