"""Build and run ``mpiexec`` command lines (MPICH, Open MPI, or a site MPI).

The ``mpiexec`` next to the running Python (the ``mpich`` wheel puts it in
the venv's ``bin/``) is preferred over one on ``PATH``, so the launcher and
mpi4py use the same MPI; ``THEANOMPI_EXT_MPIEXEC`` overrides both.
"""
import functools
import os
import shutil
import signal
import subprocess
import sys

from ..collective.world import in_mpi_job  # noqa: F401  (re-exported for the launchers)
from ..errors import EXIT_SIGNAL_BASE, EXIT_TIMED_OUT, BadInput
from .awake import wait_awake
# IFACE_VAR, TRANSPORT_VAR: re-exported (train --iface, --transport set them)
from .network_default import IFACE_VAR, TRANSPORT_VAR  # noqa: F401

#: The environment variable that names the mpiexec to use.
MPIEXEC_VAR = 'THEANOMPI_EXT_MPIEXEC'

#: What every mpiexec the project starts gets in its environment unless the
#: user set it. Open MPI's mpiexec refuses to run as root without these (a
#: container's user often is root); MPICH ignores them.
MPI_ENV_DEFAULTS = {'OMPI_ALLOW_RUN_AS_ROOT': '1', 'OMPI_ALLOW_RUN_AS_ROOT_CONFIRM': '1'}

#: The variables of the launcher's environment that its ranks need (the
#: project's THEANOMPI_EXT_*, Theano's flags, threads, the Python path).
#: Hydra passes the whole environment to the ranks of every host; Open MPI
#: to the ranks of this host only, and to other hosts just the names given
#: with ``-x`` (:func:`forwarded_env_args`).
FORWARDED_PREFIXES = ('THEANOMPI_EXT_', 'THEANO_', 'THEANORC', 'OMP_', 'OPENBLAS_', 'MKL_',
                      'POCL_', 'PYTHONPATH')


def find_mpiexec():
    """Path of the mpiexec to use, or raise with what to install."""
    override = os.environ.get(MPIEXEC_VAR)
    if override:
        # a path, or a name looked up on PATH; checked here, before a launch
        # turns it into a traceback
        found = shutil.which(override)
        if found is None:
            why = 'not executable' if os.path.exists(override) else 'no such file'
            raise BadInput('%s=%s: %s (unset it to use the mpiexec beside this Python '
                           'or on PATH)' % (MPIEXEC_VAR, override, why))
        return found
    here = os.path.join(os.path.dirname(sys.executable), 'mpiexec')
    if os.path.exists(here):
        return here
    found = shutil.which('mpiexec') or shutil.which('mpirun')
    if not found:
        raise RuntimeError('no mpiexec found: install the project (pip install mpich, '
                           'see README) or load your MPI module')
    return found


@functools.lru_cache(maxsize=None)
def is_openmpi(mpiexec):
    """Whether ``mpiexec`` is Open MPI's (asked once per path: ``--version``)."""
    try:
        out = subprocess.run([mpiexec, '--version'], capture_output=True, text=True,
                             timeout=10).stdout
    except Exception:
        return False
    return 'Open MPI' in out or 'OpenRTE' in out


def network_choices(mpiexec, hosts=(), environ=None):
    """The interface and transport :class:`~.network_default.Choice` s of a job on
    ``hosts`` (names, in hostfile order; none: this host) started by ``mpiexec``."""
    from .host_routes import routes
    from .network_default import choose_interface, choose_transport
    env = os.environ if environ is None else environ
    openmpi = is_openmpi(mpiexec)
    iface = choose_interface(env, routes(hosts) if hosts else [])
    return iface, choose_transport(env, openmpi)


def network_args(mpiexec, hosts=(), environ=None):
    """mpiexec arguments for the interface and transport of a job on ``hosts``
    (``launch/network_default.py``: the user's, else the route to the first
    other host; ``[]`` on one host with nothing asked for)."""
    from .network_default import network_args as args_of
    return args_of(*network_choices(mpiexec, hosts, environ), openmpi=is_openmpi(mpiexec))


def hostfile_names(hostfile):
    """The host names of ``hostfile`` (none when it is not given or not there)."""
    from .hostlists import hostfile_hosts
    return hostfile_hosts(hostfile) if hostfile and os.path.exists(hostfile) else []


def mpiexec_command(nprocs, argv, hostfile=None, mpiexec=None, extra=(), hosts=None):
    """The command line that starts ``nprocs`` copies of ``argv``, on the interface
    and transport of :func:`network_args` for the hosts of ``hostfile`` (or the
    names ``hosts``, placed by ``extra``)."""
    if int(nprocs) < 1:
        raise ValueError('workers must be >= 1, got %r' % (nprocs,))
    mpiexec = mpiexec or find_mpiexec()
    names = list(hosts) if hosts else hostfile_names(hostfile)
    cmd = [mpiexec, '-n', str(int(nprocs))] + network_args(mpiexec, names)
    if is_openmpi(mpiexec) and '--map-by' not in extra:
        # By slot: ranks fill each host in order, as hydra places them, and
        # OMPI_COMM_WORLD_LOCAL_RANK follows the rank order (Open MPI's default
        # mapping gave ranks 0-3 local ranks 0,2,1,3 here). OVERSUBSCRIBE: more
        # ranks than cores, which Open MPI refuses by default (hydra does not).
        # (A caller's own mapping, devices.host_args's, is kept.)
        cmd += ['--map-by', 'slot:OVERSUBSCRIBE']
        if hostfile:
            cmd += ['--hostfile', hostfile]
    elif hostfile:
        cmd += ['-f', hostfile]
    cmd += list(extra)
    return cmd + list(argv)


def forwarded_env_args(mpiexec, env):
    """``-x NAME`` for each variable of ``env`` that ranks on other hosts need
    (:data:`FORWARDED_PREFIXES`), where ``mpiexec`` is Open MPI's; else ``[]``."""
    if not is_openmpi(mpiexec):
        return []
    args = []
    for name in sorted(env):
        if name.startswith(FORWARDED_PREFIXES):
            args += ['-x', name]
    return args


def child_env(threads_per_rank=1):
    """Environment for ranks: one BLAS thread each unless the user set it."""
    env = dict(os.environ)
    for var in ('OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS', 'MKL_NUM_THREADS'):
        env.setdefault(var, str(threads_per_rank))
    for var, value in MPI_ENV_DEFAULTS.items():
        env.setdefault(var, value)
    return env


_PR_SET_PDEATHSIG = 1


def set_parent_death_signal(sig=signal.SIGKILL):
    """Ask Linux to send ``sig`` to this process when its parent exits.

    Returns False where that is not possible (not Linux). Checks for the race
    where the parent is already gone (the process was re-parented).
    """
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        parent = os.getppid()
        if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent:      # the parent died before the request took effect
        os.kill(os.getpid(), sig)
    return True


def _die_with_launcher():
    # preexec_fn of mpiexec: it lives in a session of its own, so nothing
    # else would stop it when the launcher is SIGKILLed; hydra then ends its
    # proxies and ranks (measured: 1.3 s).
    set_parent_death_signal(signal.SIGKILL)


def _end_with_launcher():
    # The same for Open MPI's mpiexec, with SIGTERM: it then ends its ranks
    # and removes its session folder in /tmp and the ranks' shared-memory
    # segments in /dev/shm; SIGKILLed it leaves all of them (measured, 5.0.11).
    set_parent_death_signal(signal.SIGTERM)


def popen_job(cmd, env=None, **kw):
    """Start ``cmd`` (an mpiexec line) in a session of its own, ended if we die.

    The ranks get ``env`` on every host (Open MPI: ``-x`` for what they need).
    """
    env = env or child_env()
    openmpi = is_openmpi(cmd[0])
    cmd = [cmd[0]] + forwarded_env_args(cmd[0], env) + list(cmd[1:])
    return subprocess.Popen(cmd, env=env, start_new_session=True,
                            preexec_fn=_end_with_launcher if openmpi else _die_with_launcher,
                            **kw)


def run_mpiexec(cmd, env=None, timeout=None):
    """Run ``cmd`` in its own process group; Ctrl-C or a timeout stops every rank.

    Returns the exit status (non-zero if any rank failed).
    """
    try:
        return wait_job(popen_job(cmd, env), timeout)
    except KeyboardInterrupt:
        return EXIT_SIGNAL_BASE + signal.SIGINT


def wait_job(proc, timeout=None):
    """Wait for ``proc`` (from :func:`popen_job`); returns its exit status.

    After ``timeout`` seconds every rank is stopped and the status is
    :data:`~theanompi_ext.errors.EXIT_TIMED_OUT`; any exception while waiting
    (Ctrl-C, SIGTERM turned into SystemExit) stops every rank before it
    propagates. Whatever MPI's killed processes left on this host is then
    removed (:mod:`.mpi_leftovers`).
    """
    from .mpi_leftovers import sweep_after_job
    try:
        return wait_awake(proc, timeout)
    except subprocess.TimeoutExpired:
        stop_group(proc)
        return EXIT_TIMED_OUT
    except BaseException:
        stop_group(proc)
        raise
    finally:
        sweep_after_job([])


def stop_group(proc, grace=5.0):
    """SIGTERM the launcher's process group, then SIGKILL after ``grace`` s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
