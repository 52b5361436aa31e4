"""What the tests share: fakes, paths, processes and mpiexec jobs, configs.

Importable as ``support`` because pytest (prepend import mode) puts the
folder of tests/conftest.py on ``sys.path``; rank scripts run outside
pytest put tests/ there themselves.
"""
