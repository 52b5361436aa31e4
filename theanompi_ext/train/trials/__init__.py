"""``theanompi-ext trials``: the reporting protocol of Goyal et al. 2017.

Runs R independent training runs of one setting, or of several settings
side by side, and reports each setting the way the paper's Table 1 does:

* run *i* (0-based) uses ``seed = SEED + i`` and ``data_seed = DATA_SEED + i``
  (model initialisation and per-epoch shuffles both change), so run 0 is the
  plain ``theanompi-ext train`` with the same options;
* the **error of a run** is the median of the validation top-1 error of its
  last 5 evaluated epochs (fewer when the run has fewer; the report says so);
* a setting's result is the **mean and the sample standard deviation**
  (ddof = 1, the unbiased variance) of its runs' errors.

Every run is launched as ``theanompi-ext train`` launches one
(``launch/worker_job.py``): ``mpiexec -n K`` of the worker program with the
run's JSON config, writing ``OUT[/NAME]/run<i>/``
(``summary.json``, ``curves.png``, ``train.log``, ``config.json``).
The command writes ``OUT/trials.json`` (after every run, so a long campaign
can be watched) and ``OUT/trials.png`` at the end, and prints a table.

A run that stops because the loss became non-finite is reported as
**diverged**: it has no error, is left out of the mean and counted in its
own column. Any other failure is **failed** and makes the exit status 3.

Settings are given as repeated ``--setting NAME:'OPTIONS'`` or a
``--settings FILE`` with one ``NAME: OPTIONS`` line each; OPTIONS are any
``train`` options (``--workers`` and ``--config`` included). Precedence,
lowest first: the common ``--config`` file, the common options, the
setting's ``--config`` file, the setting's options.

Modules: ``stats`` (the protocol math in plain functions, :func:`median_of_last`,
:func:`run_error`, :func:`mean_std`, :func:`summarise_runs`, :func:`epoch_band`,
so it can be checked by hand), ``settings`` (the settings and their options),
``runs`` (one run through mpiexec), ``table`` (the printed table and
``trials.json``), ``plot`` (``trials.png``), ``command`` (the command).
"""
from .command import main, register
from .settings import (Setting, build_setting, collect_settings, parse_setting,
                       read_settings_file)
from .stats import (LAST_EPOCHS, epoch_band, mean_std, median_of_last, peak_lr, run_error,
                    summarise_runs)

# The command (``register`` for theanompi_ext/cli/commands.py), the protocol's math and its
# settings, as ``theanompi_ext.train.trials.NAME``; launching, the report and the
# plot are in the modules named so.
__all__ = ['LAST_EPOCHS', 'Setting', 'build_setting', 'collect_settings', 'epoch_band', 'main',
           'mean_std', 'median_of_last', 'parse_setting', 'peak_lr', 'read_settings_file',
           'register', 'run_error', 'summarise_runs']
