"""``theanompi-ext info``: versions, and which backends, devices and exchange paths work here.

Nothing is called usable that was not tried the way a training run uses it:
each check runs in a child process (:mod:`.checks`, started by
:mod:`.probes`), concurrently, each stopped after ``--timeout`` seconds;
:mod:`.info_rows` says what rests on which check. A line that says ``no``
gives the reason the check met (an exception's type and first line,
``timed out after N s``...). This process imports neither
Theano nor mpi4py. The exit status is 0 whatever the report says: it is a
report (a CPU-only machine has ``no`` lines), read by people and by ``grep``
(a ``--hostfile`` that cannot be read or is not a hostfile: status 2).
"""
import platform
import sys

#: Seconds each check may take. An engine check loads Theano and compiles a
#: function (about 5 s of CPU; on a device it compiles one module each time,
#: under Theano's compile lock). Measured on 2 cores, all checks together:
#: 9-10 s with a warm compile cache, 17-32 s while other jobs kept both cores
#: busy and held the lock of the shared cache, 24 s with an empty cache: twice
#: the worst seen, so a first run on a busy machine still says what it found.
DEFAULT_TIMEOUT = 60.0
#: Said with an engine check's timeout.
COMPILE_HINT = 'a first run fills the compile cache: run info again, or raise --timeout'


def gather(timeout=DEFAULT_TIMEOUT, hostfile=None):
    """A list of (label, value) lines; runs the checks (:mod:`.checks`); the network
    lines are for a job on the hosts of ``hostfile`` (none: this host)."""
    import numpy
    from ..collective.world import outside_the_job
    from ..launch.mpiexec import child_env, find_mpiexec, mpiexec_command
    from .info_rows import report_rows
    from .probes import ProbeSet
    from ..launch.same_software import this_software
    mine = this_software()
    # the digest of its sources: what the ranks of a job compare (launch/same_software.py)
    rows = [('theanompi_ext', '%s (%s)' % (mine['theanompi_ext'], mine['where'])),
            ('python', platform.python_version()),
            ('numpy', numpy.__version__)]
    try:
        mpiexec, mpiexec_error = find_mpiexec(), None
    except Exception as exc:  # noqa: B902 - RuntimeError, BadInput: the line says which
        mpiexec, mpiexec_error = None, str(exc)
    # What the launcher gives ranks (one BLAS thread, Open MPI's root switches); not
    # the variables of a job info itself may run in: each check is a job of its own
    # (an engine check too: Theano's import starts MPI, theano/tensor/io.py).
    with ProbeSet(timeout, env=outside_the_job(child_env())) as probes:
        probed = {'cpu': probes.start('engine', 'cpu', hint=COMPILE_HINT),
                  'devices': probes.start('devices'),
                  'nccl': probes.start('nccl'),
                  # two ranks, so that a sum travels; without mpiexec one, for the versions
                  'mpi': probes.start('mpi', launcher=(
                      lambda cmd: mpiexec_command(2, cmd, mpiexec=mpiexec)) if mpiexec else None)}
        listed = probed['devices'].stage('list')
        names = listed.info.get('devices', []) if listed.ok else []
        # after the listing, which opens nothing: one child per device, as one rank per device
        probed['each'] = [(d, probes.start('engine', d, hint=COMPILE_HINT)) for d in names]
        rows += report_rows(probed, mpiexec, mpiexec_error)
    from ..launch.network_choice import network_rows
    return rows + network_rows(mpiexec, hostfile)


def main(args=None):
    """Print the report; exit status 0 (module docstring)."""
    from ..errors import EXIT_BAD_INPUT, BadInput
    from ..launch.hostlists import read_hostfile
    from ..launch.network_options import use_network
    timeout = getattr(args, 'timeout', None) or DEFAULT_TIMEOUT
    hostfile = getattr(args, 'hostfile', None)
    try:
        if hostfile:
            read_hostfile(hostfile)      # before the checks' minute, not after it
    except BadInput as exc:
        sys.stderr.write('theanompi-ext info: error: %s\n' % exc)
        return EXIT_BAD_INPUT
    use_network(args)
    for label, value in gather(timeout, hostfile):
        print('%-16s %s' % (label, value))
    return 0


def register(sub):
    """Add the ``info`` sub-command."""
    from .argtypes import positive_seconds
    p = sub.add_parser('info', help='versions; which collective backends, devices and device '
                       'exchange paths work here, each tried in a child process')
    p.add_argument('--timeout', type=positive_seconds, default=DEFAULT_TIMEOUT, metavar='S',
                   help='seconds each check may run before it is stopped and reported as '
                   '"timed out" (default: %(default)g)')
    g = p.add_argument_group('network', 'what a job on the hosts of --hostfile would use: '
                             'the interface, the transport, the topology of --topology auto')
    g.add_argument('--hostfile', default=None, metavar='FILE',
                   help='MPI host file of the job to describe (default: every rank here)')
    from ..launch.network_options import add_network_arguments
    add_network_arguments(g)
    p.set_defaults(func=main)
