"""The job process of a Theano-MPI job with checkpoints: the restart supervisor
(``BSP().init(..., max_restarts=N)``), the one that passes a
``checkpoint_signal`` on, and the one that resumes (``resume=True``).

usage (started by ``BSP.init``, which ``BSP.wait`` then waits for)::

    python -m theanompi_ext.theanompi_compat.restart_job SPEC_JSON

``SPEC_JSON``: the ranks' mpiexec command, the rank count, ``out``, the
options of :data:`.rule.RESTART_OPTIONS`, ``checkpoint_signal`` and
``across_hosts``. With ``checkpoint_signal`` this process catches the
signal (``BSP.init`` starts it with the signal held back) and passes it on
to mpiexec once every rank has joined (``launch/forwarded_signal.py``), as
``train --checkpoint-signal``'s launcher does. Without restarts the job runs
once, its start watched (``train/attempt.start_watch_env``). With them it
runs under
:func:`theanompi_ext.train.restarts.supervise`, the supervisor of
``train --max-restarts``: each attempt through
:func:`~theanompi_ext.launch.postmortem.run_explained` (which names a rank
that died), a failure a restart can cure started again from
``OUT/checkpoint.h5`` (the last finished epoch, :mod:`.resume`), the log in
``OUT/restarts.json``. It runs in a process of its own because the
supervisor makes itself the reaper of whatever an attempt leaves behind and
ends all of it between attempts: in the user's process that would reach
the user's other children too. The exit status is the job's.
"""
import dataclasses
import json
import os
import sys


@dataclasses.dataclass
class RestartSettings(object):
    """The fields :func:`~theanompi_ext.train.restarts.supervise` reads."""
    out: str
    max_restarts: int
    restart_backoff_s: float = 1.0
    start_timeout_s: float = 300.0
    resume: bool = False
    overwrite: bool = False


def supervisor_command(command, size, out, restart, checkpoint_signal='', across_hosts=False):
    """The command line of this module for the ranks' ``command`` (a list)."""
    spec = dict(restart, command=list(command), size=int(size), out=os.path.abspath(out),
                checkpoint_signal=checkpoint_signal, across_hosts=bool(across_hosts))
    return [sys.executable, '-u', '-m', 'theanompi_ext.theanompi_compat.restart_job',
            json.dumps(spec)]


def run(spec):
    """Run the job of ``spec`` (a dict, see :func:`supervisor_command`); its status."""
    from ..launch.mpiexec import child_env
    from ..launch.postmortem import run_explained
    from ..train.attempt import start_file, start_watch_env, started
    from ..train.restarts import recorded_run, supervise
    from .resume import RESUME_VAR
    cfg = RestartSettings(out=spec['out'], max_restarts=int(spec['max_restarts']),
                          restart_backoff_s=float(spec['restart_backoff_s']),
                          start_timeout_s=float(spec['start_timeout_s']),
                          resume=bool(spec.get('resume')))
    os.makedirs(cfg.out, exist_ok=True)
    forward = None
    if spec.get('checkpoint_signal'):
        from ..launch.forwarded_signal import ForwardedSignal
        from ..train.checkpoint_request import number
        # held back since BSP.init started us: one sent meanwhile is caught now
        forward = ForwardedSignal(number(spec['checkpoint_signal'])).install()

    def attempt(cfg, extra_env):
        env = child_env()
        env.update(extra_env)
        env[RESUME_VAR] = '1' if cfg.resume else '0'
        mark = start_file(extra_env)
        return run_explained(
            spec['command'], env=env, size=spec['size'],
            started=(lambda: started(mark)) if mark else None,
            start_timeout_s=cfg.start_timeout_s, forward=forward)
    try:
        if not cfg.max_restarts:
            with start_watch_env(cfg.out, bool(spec.get('across_hosts'))) as watch_env:
                return attempt(cfg, watch_env)
        return supervise(cfg, lambda c, e: recorded_run(lambda: attempt(c, e)))
    finally:
        if forward is not None:
            forward.restore()


def main(argv=None):
    """Entry point (module docstring)."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.stderr.write('usage: python -m theanompi_ext.theanompi_compat.restart_job '
                         'SPEC_JSON\n')
        return 2
    return run(json.loads(argv[0]))


if __name__ == '__main__':
    sys.exit(main())
