"""One run of a setting: its folder and config, launched through mpiexec with
its output in ``run<i>/train.log``; returns the run's record."""
import json
import os
import shlex
import signal
import sys
import threading
import time

from ...errors import EXIT_SIGNAL_BASE, EXIT_TIMED_OUT
from ..restarts import STOP_STATUSES, last_message
from .stats import LAST_EPOCHS, run_error

RUN_FILES = ('summary.json', 'params.npz', 'curves.png', 'checkpoint.h5', 'train.log',
             'config.json', 'checkpoint.prev.h5', 'restarts.json')


def run_dir(out, setting, i):
    """Folder of run ``i``: ``OUT/run<i>``, or ``OUT/NAME/run<i>`` for named settings."""
    return os.path.join(out, setting.name, 'run%d' % i) if setting.name \
        else os.path.join(out, 'run%d' % i)


def run_config(setting, i, out_dir):
    """The TrainConfig of run ``i``: seeds offset by ``i``, output in ``out_dir``."""
    import dataclasses
    return dataclasses.replace(setting.cfg, seed=setting.cfg.seed + i,
                               data_seed=setting.cfg.data_seed + i, out=out_dir,
                               resume=False).validate()


def _partial_history(folder):
    """Epoch records of a run that ended early, from its last checkpoint."""
    path = os.path.join(folder, 'checkpoint.h5')
    if not os.path.exists(path):
        return []
    try:
        import h5py
        with h5py.File(path, 'r') as f:
            return json.loads(f.attrs['history'])
    except Exception:  # noqa: B902 - a torn or foreign file only loses the partial curve
        return []


class _RunOutput(object):
    """Where a run's mpiexec output goes: its log (and the terminal with ``echo``);
    both of mpiexec's streams write here, one line at a time."""

    def __init__(self, log, echo):
        self.log, self.echo = log, echo
        self._lock = threading.Lock()

    def write(self, text):
        with self._lock:
            self.log.write(text)
            if self.echo:
                sys.stdout.write(text)

    def flush(self):
        with self._lock:
            self.log.flush()
            if self.echo:
                sys.stdout.flush()


def _record_from_summary(i, cfg, summary, wall_s, last):
    hist = summary.get('history', [])
    err, used, epochs = run_error(hist, last)
    return dict(run=i, seed=cfg.seed, data_seed=cfg.data_seed, out=cfg.out, status='ok',
                exit_status=0, error=err, epochs_used=used, error_epochs=epochs,
                final_val_top1=summary.get('final_val_top1'),
                final_val_top5=summary.get('final_val_top5'),
                iterations=summary.get('iterations'), wall_s=wall_s,
                step_s_median=summary.get('step_s_median'), history=hist)


def launch_run(setting, i, out, last=LAST_EPOCHS, timeout=None, reuse=False, echo=False):
    """Train run ``i`` of ``setting`` through mpiexec; returns its record.

    The ranks' output goes to ``run<i>/train.log`` (and also to the terminal
    with ``echo``). With ``reuse``, a finished run whose ``summary.json`` holds the
    same configuration is read instead of trained again.
    """
    from ...launch.worker_job import worker_command, worker_env, write_worker_config
    folder = run_dir(out, setting, i)
    cfg = run_config(setting, i, folder)
    summary_path = os.path.join(folder, 'summary.json')
    if reuse:
        rec = _reused_record(i, cfg, setting.workers, summary_path, last)
        if rec is not None:
            return rec
    _clear_run_folder(folder)
    cfg_path = write_worker_config(cfg.to_dict(), os.path.join(folder, 'config.json'))
    log_path = os.path.join(folder, 'train.log')
    t0 = time.perf_counter()

    def attempt(cfg, extra_env):
        # a restart (train/restarts.py) resumes: its config says so, its output follows
        first = not extra_env or extra_env.get('THEANOMPI_EXT_ATTEMPT') in (None, '0')
        write_worker_config(cfg.to_dict(), cfg_path)
        start = os.path.getsize(log_path) if not first else 0
        # config.json is the run's record; the ranks read the config from the environment
        rc = _run_logged(worker_command(setting.workers, setting.hostfile), setting.workers,
                         setting.hostfile, log_path, timeout, echo,
                         worker_env(cfg.to_dict(), extra_env or {}),
                         append=not first,
                         start_timeout_s=cfg.start_timeout_s)
        with open(log_path, errors='replace') as f:
            f.seek(start)
            return rc, f.read()
    if cfg.max_restarts:
        from ..restarts import supervise
        rc = supervise(cfg, attempt)
    else:
        from ..attempt import start_watch_env
        # its start watched as train's is (a rank dead before MPI started)
        with start_watch_env(cfg.out, bool(setting.hostfile)) as watch_env:
            rc = attempt(cfg, watch_env)[0]
    wall = time.perf_counter() - t0
    if rc in STOP_STATUSES:
        # the job was stopped (the launcher, or every rank from outside it): so are
        # the trials
        if rc == EXIT_SIGNAL_BASE + signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(rc)
    if rc == 0 and os.path.exists(summary_path):
        with open(summary_path) as f:
            return _record_from_summary(i, cfg, json.load(f), wall, last)
    return _failed_record(i, cfg, rc, wall, log_path, timeout)


def _reused_record(i, cfg, workers, summary_path, last):
    """The record of a finished run with the same configuration, or None."""
    if not os.path.exists(summary_path):
        return None
    with open(summary_path) as f:
        summary = json.load(f)
    if summary.get('config') != cfg.to_dict() or summary.get('workers') != workers:
        return None
    rec = _record_from_summary(i, cfg, summary, summary.get('wall_s'), last)
    rec['reused'] = True
    return rec


def _clear_run_folder(folder):
    """Make ``folder`` and remove a previous run's results, so that a failed run
    is never read as finished."""
    os.makedirs(folder, exist_ok=True)
    for name in RUN_FILES:
        p = os.path.join(folder, name)
        if os.path.exists(p):
            os.unlink(p)


def _run_logged(cmd, workers, hostfile, log_path, timeout, echo, extra_env=None,
                append=False, start_timeout_s=0):
    """Run ``cmd`` (``workers`` ranks, on the hosts of ``hostfile``) with its output
    in ``log_path`` (after what it holds with ``append``), ``extra_env`` added to
    its environment, as ``train`` runs it (:func:`~theanompi_ext.launch.postmortem.
    run_explained`: hydra's teardown held back, the launcher's explanation last);
    its exit status (:data:`~theanompi_ext.errors.EXIT_TIMED_OUT` when stopped after
    ``timeout`` s; status 4 when not started within ``start_timeout_s``)."""
    from ...launch.mpiexec import child_env
    from ...launch.postmortem import run_explained
    from ..attempt import start_file, started
    mark = start_file(extra_env or {})
    env = child_env()
    env.update(extra_env or {})
    with open(log_path, 'a' if append else 'w') as log:
        log.write('$ %s\n' % ' '.join(shlex.quote(c) for c in cmd))
        log.flush()
        # The log is always written (a diverged run is recognised from it).
        output = _RunOutput(log, echo)
        return run_explained(cmd, env, size=workers, hostfile=hostfile,
                             started=(lambda: started(mark)) if mark else None,
                             start_timeout_s=start_timeout_s, timeout=timeout,
                             out=output, err=output)


def _failed_record(i, cfg, rc, wall, log_path, timeout):
    """The record of a run that did not finish: diverged (non-finite loss) or failed."""
    with open(log_path, errors='replace') as f:
        text = f.read()
    diverged = 'NonFiniteLoss' in text
    # the launcher's explanation (a rank that died, by rank and host) or a rank's error
    reason = last_message(text)
    return dict(run=i, seed=cfg.seed, data_seed=cfg.data_seed, out=cfg.out,
                status='diverged' if diverged else 'failed', exit_status=rc,
                error=None, epochs_used=0, error_epochs=[], wall_s=wall,
                reason=(reason if reason else
                        'timed out after %ss' % timeout if rc == EXIT_TIMED_OUT else
                        'exit status %d (see %s)' % (rc, log_path)),
                history=_partial_history(cfg.out))
