"""``theanompi-ext hostfile``: a batch scheduler's host list as an MPI hostfile.

SLURM gives a compressed node list (``$SLURM_JOB_NODELIST``, expanded by
``scontrol show hostnames``) and the tasks per node
(``$SLURM_TASKS_PER_NODE``, e.g. ``2(x3),1``); LSF gives ``$LSB_MCPU_HOSTS``
(``hostA 2 hostB 2``) or ``$LSB_HOSTS`` (one word per slot); PBS (Torque,
OpenPBS, PBS Pro) a file named by ``$PBS_NODEFILE``, a host per line once per
slot; Grid Engine (SGE, UGE, OGS) a file named by ``$PE_HOSTFILE``, a line
``host slots queue processors`` per host. Each becomes ``[(host, slots),
...]`` in the scheduler's order, written (atomically, with ``--out``) as
MPICH's (``host:slots``) or Open MPI's (``host slots=N``) hostfile.
"""
import os
import re
import subprocess
import sys

from ..errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, BadInput, WriteError
from ..files.atomic import write_atomic


def slurm_tasks_per_node(text):
    """``'2(x3),1'`` -> ``[2, 2, 2, 1]`` (SLURM's ``SLURM_TASKS_PER_NODE``)."""
    counts = []
    for part in text.strip().split(','):
        m = re.fullmatch(r'(\d+)(?:\(x(\d+)\))?', part.strip())
        if not m:
            raise BadInput('SLURM_TASKS_PER_NODE=%r: expected e.g. 2(x3),1' % text)
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def from_slurm(environ=None, hostnames=None):
    """``[(host, slots)]`` of the SLURM job: the nodes from ``hostnames`` (a list;
    default ``scontrol show hostnames $SLURM_JOB_NODELIST``), the slots from
    ``SLURM_TASKS_PER_NODE`` (1 each when unset)."""
    env = os.environ if environ is None else environ
    nodelist = env.get('SLURM_JOB_NODELIST') or env.get('SLURM_NODELIST')
    if hostnames is None:
        if not nodelist:
            raise BadInput('SLURM_JOB_NODELIST is not set: run inside a SLURM allocation '
                           '(salloc, sbatch)')
        hostnames = _scontrol_hostnames(nodelist)
    if not hostnames:
        raise BadInput('SLURM gave no hosts (SLURM_JOB_NODELIST=%r)' % nodelist)
    tasks = env.get('SLURM_TASKS_PER_NODE')
    slots = slurm_tasks_per_node(tasks) if tasks else [1] * len(hostnames)
    if len(slots) != len(hostnames):
        raise BadInput('SLURM_TASKS_PER_NODE=%r gives %d nodes, the node list %d'
                       % (tasks, len(slots), len(hostnames)))
    return list(zip(hostnames, slots))


def _scontrol_hostnames(nodelist):
    try:
        res = subprocess.run(['scontrol', 'show', 'hostnames', nodelist],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BadInput('scontrol show hostnames %s: %s' % (nodelist, exc))
    if res.returncode != 0:
        raise BadInput('scontrol show hostnames %s failed: %s' % (nodelist, res.stderr.strip()))
    return res.stdout.split()


def from_lsf(environ=None):
    """``[(host, slots)]`` of the LSF job from ``LSB_MCPU_HOSTS`` (``host n ...``),
    else ``LSB_HOSTS`` (a host once per slot), in LSF's order."""
    env = os.environ if environ is None else environ
    mcpu = env.get('LSB_MCPU_HOSTS', '').split()
    if mcpu:
        if len(mcpu) % 2 or not all(n.isdigit() for n in mcpu[1::2]):
            raise BadInput('LSB_MCPU_HOSTS=%r: expected "host slots host slots ..."'
                           % env['LSB_MCPU_HOSTS'])
        return _merged(zip(mcpu[0::2], (int(n) for n in mcpu[1::2])))
    words = env.get('LSB_HOSTS', '').split()
    if not words:
        raise BadInput('neither LSB_MCPU_HOSTS nor LSB_HOSTS is set: run inside an LSF job')
    return _merged((w, 1) for w in words)


def _job_file(env, var, scheduler):
    """The text of the file a scheduler names in ``env[var]``; BadInput saying why not."""
    path = env.get(var)
    if not path:
        raise BadInput('%s is not set: run inside a %s job' % (var, scheduler))
    try:
        with open(path) as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput('%s=%s: cannot read it (%s)'
                       % (var, path, getattr(exc, 'strerror', None) or exc))


def from_pbs(environ=None):
    """``[(host, slots)]`` of the PBS job (Torque, OpenPBS, PBS Pro): the file
    ``$PBS_NODEFILE`` names a host once per slot, a line each; a run of the same
    host is one entry, in the file's order (as ``LSB_HOSTS``)."""
    env = os.environ if environ is None else environ
    words = _job_file(env, 'PBS_NODEFILE', 'PBS').split()
    if not words:
        raise BadInput('PBS_NODEFILE=%s names no host' % env['PBS_NODEFILE'])
    return _merged((w, 1) for w in words)


def from_sge(environ=None):
    """``[(host, slots)]`` of the Grid Engine job (SGE, UGE, OGS): each line of the
    file ``$PE_HOSTFILE`` is ``host slots queue processors``; the slots of a host
    named on several lines (several queues) add up, in the file's order."""
    env = os.environ if environ is None else environ
    path = env.get('PE_HOSTFILE')
    pairs = []
    for number, line in enumerate(_job_file(env, 'PE_HOSTFILE', 'Grid Engine parallel')
                                  .splitlines(), 1):
        words = line.split()
        if not words:
            continue
        if len(words) < 2 or not (words[1].isdigit() and int(words[1]) >= 1):
            raise BadInput('PE_HOSTFILE=%s, line %d: %r: expected "host slots queue '
                           'processors", slots a whole number >= 1' % (path, number, line))
        pairs.append((words[0], int(words[1])))
    if not pairs:
        raise BadInput('PE_HOSTFILE=%s names no host' % path)
    merged = {}
    for host, n in pairs:
        merged[host] = merged.get(host, 0) + n
    return list(merged.items())


#: ``hostfile``'s sources: option -> (reader, what it reads), for the help and main.
SOURCES = {
    'from_slurm': (from_slurm, 'read SLURM_JOB_NODELIST (through scontrol) and '
                               'SLURM_TASKS_PER_NODE'),
    'from_lsf': (from_lsf, 'read LSB_MCPU_HOSTS, or LSB_HOSTS when that is unset'),
    'from_pbs': (from_pbs, 'read the file $PBS_NODEFILE (Torque, OpenPBS, PBS Pro: a '
                           'host per slot)'),
    'from_sge': (from_sge, 'read the file $PE_HOSTFILE (Grid Engine: "host slots queue '
                           'processors" per line)'),
}


#: The variables that tell each scheduler's job (``hostfile`` without a ``--from-``).
JOB_MARKS = {'from_slurm': ('SLURM_JOB_NODELIST', 'SLURM_NODELIST'),
             'from_lsf': ('LSB_MCPU_HOSTS', 'LSB_HOSTS'),
             'from_pbs': ('PBS_NODEFILE',),
             'from_sge': ('PE_HOSTFILE',)}


def job_source(environ=None):
    """The ``--from-`` option (``SOURCES``' key) of the one batch job this process
    runs in, told by its variables (``JOB_MARKS``); BadInput when it runs in none,
    or the variables of several are set."""
    env = os.environ if environ is None else environ
    found = [dest for dest, names in JOB_MARKS.items() if any(env.get(n) for n in names)]
    if len(found) == 1:
        return found[0]
    if not found:
        raise BadInput('not inside a batch job: none of %s is set (or give --from-slurm, '
                       '--from-lsf, --from-pbs or --from-sge)'
                       % ', '.join(n for names in JOB_MARKS.values() for n in names))
    raise BadInput('the variables of several schedulers are set (%s): choose with %s'
                   % ('; '.join(', '.join(n for n in JOB_MARKS[d] if env.get(n)) for d in found),
                      ' or '.join('--' + d.replace('_', '-') for d in found)))


def _merged(pairs):
    hosts = []
    for host, n in pairs:
        if hosts and hosts[-1][0] == host:
            hosts[-1] = (host, hosts[-1][1] + n)
        else:
            hosts.append((host, n))
    return hosts


#: Open MPI's hostfile keys whose value is a count of slots (a whole number >= 1);
#: ``slots`` (or MPICH's ``host:N``) is the host's slots, ``max_slots`` only a limit.
COUNT_KEYS = ('slots', 'max_slots', 'max-slots')


class HostfileError(BadInput):
    """A hostfile that cannot be read or says no host, or a line of it that is
    neither ``host:N`` (MPICH) nor ``host slots=N`` (Open MPI): status 2."""


def hostfile_hosts(path):
    """The host names of a hostfile, MPICH's (``host:n``) or Open MPI's
    (``host slots=n``), in order, once each; comments and blank lines skipped."""
    return [h for h, _ in read_hostfile(path)]


def _hostfile_text(path):
    try:
        with open(path, newline='') as fh:      # '\r' kept: check_line_ends
            return fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise HostfileError('--hostfile %s: cannot read it (%s)'
                            % (path, getattr(exc, 'strerror', None) or exc))


def check_line_ends(path):
    """:class:`HostfileError` for a hostfile with Windows line ends (CR LF), which
    Open MPI's mpiexec cannot parse ("parse error ... on token 1", status 250);
    hydra reads them."""
    text = _hostfile_text(path)
    if '\r' in text:
        line = text[:text.index('\r')].count('\n') + 1
        raise HostfileError(
            "--hostfile %s, line %d: ends in a carriage return (Windows line ends), which "
            "Open MPI's mpiexec cannot parse: convert the file (dos2unix %s, or sed -i "
            "'s/\\r$//' %s)" % (path, line, path, path))


def read_hostfile(path):
    """``[(host, slots)]`` of an MPICH (``host:n``) or Open MPI (``host slots=n``)
    hostfile, each host once in order of first mention with its slots summed (1
    where none is given); comments and blank lines skipped. Other ``KEY=VALUE``
    words (hydra's, Open MPI's) are left to MPI. :class:`HostfileError` naming the
    file and line for a file that cannot be read, names no host, has a slot count
    that is not a whole number >= 1, or a word that is not ``KEY=VALUE``."""
    text = _hostfile_text(path)
    if text.startswith('\ufeff'):
        raise HostfileError('--hostfile %s, line 1: starts with a byte-order mark (U+FEFF, '
                            'as some Windows editors save a file), which mpiexec takes for '
                            'part of the first host name: save the file without it' % path)
    lines = text.splitlines()
    slots = {}
    for number, line in enumerate(lines, 1):
        words = line.split('#', 1)[0].split()
        if words:
            name, n = _host_line(words, '--hostfile %s, line %d' % (path, number))
            slots[name] = slots.get(name, 0) + n
    if not slots:
        raise HostfileError('--hostfile %s names no host (one per line: host:N for MPICH, '
                            'host slots=N for Open MPI)' % path)
    return list(slots.items())


def _host_line(words, where):
    """(host, slots) of one hostfile line's ``words``; HostfileError saying ``where``."""
    name, colon, n = words[0].partition(':')
    counts = {'slots': n} if colon else {}
    for word in words[1:]:
        key, eq, value = word.partition('=')
        if not eq or not key:
            raise HostfileError('%s: %r is not KEY=VALUE (one host per line: host:N or '
                                'host slots=N)' % (where, word))
        if key in COUNT_KEYS:
            counts.setdefault(key, value)
    bad = [c for c in counts.values() if not (c.isdigit() and int(c) >= 1)]
    if not name or bad:
        raise HostfileError('%s: %r: %s' % (
            where, ' '.join(words), 'no host name' if not name else
            'a slot count must be a whole number >= 1, not %r' % bad[0]))
    return name, int(counts.get('slots', 1))


def slot_warnings(slots, workers):
    """What a user may not mean by ``workers`` ranks on the hostfile's ``[(host,
    slots)]``: more ranks than slots (MPI gives hosts more ranks than their slots),
    or fewer, leaving the last hosts without a rank (ranks fill the hosts in order)."""
    total = sum(n for _, n in slots)
    if workers > total:
        return ['--workers %d on a hostfile of %d slot%s (%s): MPI places the other %d '
                'rank%s on the same hosts again, more ranks than slots'
                % (workers, total, '' if total == 1 else 's',
                   ', '.join('%s:%d' % hn for hn in slots), workers - total,
                   '' if workers - total == 1 else 's')]
    filled, idle = 0, []
    for host, n in slots:
        if filled >= workers:
            idle.append(host)
        filled += n
    if idle:
        return ['--workers %d fills the first %d slot%s of the hostfile: %s get%s no rank '
                '(ranks fill each host\'s slots in order; lower a host\'s slots to spread '
                'them)' % (workers, workers, '' if workers == 1 else 's',
                           'host ' + idle[0] if len(idle) == 1 else 'hosts ' + ', '.join(idle),
                           's' if len(idle) == 1 else '')]
    return []


def format_hostfile(hosts, flavour='mpich'):
    """The hostfile text of ``[(host, slots)]``: ``host:n`` (MPICH's hydra) or
    ``host slots=n`` (Open MPI)."""
    form = '%s slots=%d\n' if flavour == 'openmpi' else '%s:%d\n'
    return ''.join(form % (h, n) for h, n in hosts)


def register(sub):
    """Add the ``hostfile`` sub-command."""
    p = sub.add_parser('hostfile', help="a batch scheduler's hosts as an MPI hostfile",
                       description="Write the hosts of the current SLURM, LSF, PBS or Grid "
                                   "Engine job as a hostfile for train --hostfile "
                                   "(docs/multinode.md). Without a --from- option, the "
                                   "scheduler is the one whose variables are set.")
    # none given: the scheduler whose job this is (job_source)
    src = p.add_mutually_exclusive_group()
    for dest, (_, text) in SOURCES.items():
        src.add_argument('--' + dest.replace('_', '-'), dest=dest, action='store_true',
                         help=text)
    p.add_argument('--format', choices=('mpich', 'openmpi'), default='mpich',
                   help="the launcher's syntax: host:N (mpich) or host slots=N (openmpi) "
                        "(default mpich)")
    p.add_argument('--out', default=None, metavar='FILE',
                   help='write the hostfile here (whole or not at all) instead of '
                        'standard output')
    p.set_defaults(func=main)


def main(args):
    """Print or write the hostfile; status 2 with the reason when the job's hosts
    cannot be read, 3 when ``--out`` cannot be written (an older file there is
    then left as it was)."""
    try:
        dest = next((d for d in SOURCES if getattr(args, d)), None) or job_source()
        text = format_hostfile(SOURCES[dest][0](), args.format)
        if args.out:
            write_atomic(args.out, text.encode(), 'the hostfile')
    except (BadInput, WriteError) as exc:
        sys.stderr.write('theanompi-ext hostfile: error: %s\n' % exc)
        return EXIT_FAILED if isinstance(exc, WriteError) else EXIT_BAD_INPUT
    if not args.out:
        sys.stdout.write(text)
    return EXIT_OK
