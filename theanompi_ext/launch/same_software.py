"""Every rank of a job runs the same software: checked once, at the start.

Across hosts each rank imports whatever its host has installed. A host left
with another version of this package (a stale venv, a local edit, a copy
that missed an update), or another numpy, Theano, mpi4py or Python, does not
fail at once: the ranks run different code against each other. Measured with
an older copy of this package on one rank: the two versions' start-ups met
in different collectives and the job ended with ``DeviceErrorOnRanks: rank 0:
True``, which names nothing of the cause; a change of the update's arithmetic
alone would train on silently until the replicas drift apart.

So the first exchange of every job, before anything else the ranks say to
each other (``train/worker.guarded``: ``train``, a Theano-MPI session's
worker, the benchmarks), is each rank's :func:`this_software` and its host.
It is bounded (:data:`FIRST_EXCHANGE_S`) and runs on a communicator of its
own, so a rank of a version older than this check, which goes on to other
collectives, ends the job with a message instead of a hang (measured: two
older versions against this one hung until killed before the bound).
A Theano-MPI model's own code, which every rank imports from its host, is
compared the same way once it is imported (:func:`check_same_model_code`).
Ranks that differ end the job before it starts (:class:`SoftwareMismatch`,
exit status 2) with a message that names what differs, on which ranks and
hosts, and where each copy of this package was loaded from. The package is
compared by a digest of its ``.py`` sources (:func:`source_digest`), not by
its version number, which a local edit or an unreleased copy keeps.

``THEANOMPI_EXT_MIXED_SOFTWARE=1`` on rank 0 turns the refusal into a warning
(a rolling upgrade, a difference known to be harmless). This exchange stays
the first of a job in every later version, so that two versions always meet
here and are told apart.
"""
import hashlib
import os
import platform
import socket
import sys

from ..errors import AllRanks, BadInput
from .env_seconds import seconds_from_env

#: Set to 1 (on rank 0) to run with ranks whose software differs, warned.
MIXED_VAR = 'THEANOMPI_EXT_MIXED_SOFTWARE'
#: The descriptor's format; a later version that changes it keeps this key.
FORMAT = 1
#: What is compared, in the order the message names them.
COMPONENTS = ('theanompi_ext', 'Python', 'numpy', 'Theano', 'mpi4py', 'MPI library')
INSTALL_HINT = ('Install the same on every host (one install on a shared filesystem, or the '
                'same wheel with constraints.txt: docs/multinode.md)')

#: Seconds every rank has to take part in the first exchange. The ranks have
#: just passed MPI's start and a communicator's Dup (collective) together; what
#: is left is a digest of some 200 files (3.5 ms here, seconds on a cold NFS).
FIRST_EXCHANGE_S = 60.0
FIRST_EXCHANGE_VAR = 'THEANOMPI_EXT_FIRST_EXCHANGE_S'

#: This package's folder (what each rank imported).
PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class SoftwareMismatch(AllRanks, BadInput):
    """The ranks do not run the same software (raised on every rank; exit status 2)."""


def _add_file(h, path, name):
    """Add one file to hash ``h`` as ``name NUL size NUL body``."""
    with open(path, 'rb') as f:
        body = f.read()
    h.update(b'%s\0%d\0' % (name.encode('utf-8', 'surrogateescape'), len(body)))
    h.update(body)


def source_digest(folder=PACKAGE):
    """SHA-256 (hex) of the ``.py`` files under ``folder`` (default: this package),
    each named by its path relative to ``folder``; ``__pycache__`` left out."""
    folder = os.path.abspath(folder)
    h = hashlib.sha256()
    for top, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d != '__pycache__')
        for name in sorted(f for f in files if f.endswith('.py')):
            path = os.path.join(top, name)
            _add_file(h, path, os.path.relpath(path, folder).replace(os.sep, '/'))
    return h.hexdigest()


def _mixed_allowed():
    return os.environ.get(MIXED_VAR, '') == '1'


def _distribution_version(name):
    from importlib import metadata
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return 'not installed'


def this_software(mpi_library=None):
    """This process's ``{component: version}`` (:data:`COMPONENTS`), plus where this
    package was loaded from (``'where'``, said, never compared) and whether this
    process allows a mixed job (``'mixed'``, rank 0's decides). Imports neither
    Theano nor mpi4py (the versions are their distributions'): ``mpi_library`` is
    given by the caller that has MPI."""
    import numpy
    from .. import __version__
    return {'format': FORMAT,
            'theanompi_ext': '%s, source %s' % (__version__, source_digest()[:12]),
            'Python': platform.python_version(),
            'numpy': numpy.__version__,
            'Theano': _distribution_version('Theano'),
            'mpi4py': _distribution_version('mpi4py'),
            'MPI library': mpi_library or 'none',
            'where': PACKAGE,
            'mixed': _mixed_allowed()}


def _ranks_text(ranks, hosts):
    """``ranks 0-1 on tmxh0`` / ``rank 3 on tmxh1`` / ``ranks 0,2 on a, b``."""
    ranks = sorted(ranks)
    if len(ranks) > 1 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        which = 'ranks %d-%d' % (ranks[0], ranks[-1])
    else:
        which = ('rank ' if len(ranks) == 1 else 'ranks ') + ','.join(map(str, ranks))
    names = []
    for r in ranks:
        if hosts[r] not in names:
            names.append(hosts[r])
    return '%s on %s' % (which, ', '.join(names))


def _answer(answer):
    """``(host, descriptor)`` of one rank's answer; the descriptor None where the answer
    is not this exchange's of this format (another version's start-up sent it)."""
    if isinstance(answer, (tuple, list)) and len(answer) == 2 and isinstance(answer[0], str):
        host, mine = answer
        return host, (mine if isinstance(mine, dict) and mine.get('format') == FORMAT
                      else None)
    return 'a host not said', None


def differences(every, components=COMPONENTS):
    """The message's parts for ``every`` (``[(host, software)]`` in rank order), one
    per component of ``components`` that differs (the first said with where each
    copy was loaded from); ``[]`` when every rank runs the same. A rank whose
    answer is not a descriptor of this format runs another start-up altogether."""
    every = [_answer(a) for a in every]
    hosts = [h for h, _ in every]
    strangers = [r for r, (_, s) in enumerate(every) if s is None]
    if strangers:
        return ['%s answered the start-up\'s first exchange with something else: another '
                'theanompi_ext runs there (a version without this check, or a later '
                'format)' % _ranks_text(strangers, hosts)]
    parts = []
    for comp in components:
        groups = {}
        for r, (_, s) in enumerate(every):
            groups.setdefault(s.get(comp), []).append(r)
        if len(groups) < 2:
            continue
        shown = []
        for value, ranks in sorted(groups.items(), key=lambda g: (-len(g[1]), g[1][0])):
            where = ' from %s' % every[ranks[0]][1]['where'] if comp == components[0] else ''
            shown.append('%s (%s%s)' % (value, _ranks_text(ranks, hosts), where))
        parts.append('%s %s' % (comp, ' vs '.join(shown)))
    return parts


def check_same_software(comm, mpi_library=None, warn=None):
    """Collective: every rank of ``comm`` (``rank``, ``size``, ``allgather``) calls it
    first thing. Raises :class:`SoftwareMismatch` on every rank when their software
    differs, unless rank 0 has ``THEANOMPI_EXT_MIXED_SOFTWARE=1``: then rank 0 calls
    ``warn(text)`` (default: standard error) and the job goes on. Returns the parts
    that differ (``[]``: none)."""
    if comm.size == 1:
        return []
    return _check(comm, this_software(mpi_library), COMPONENTS, warn, INSTALL_HINT)


def code_digest(path):
    """:func:`source_digest` of a folder; of a single ``.py`` file, the same record
    of that file alone."""
    if os.path.isdir(path):
        return source_digest(path)
    h = hashlib.sha256()
    _add_file(h, path, os.path.basename(path))
    return h.hexdigest()


def model_code(cls):
    """``(name, path)`` of the code a model class comes from: its top-level package's
    folder when its module is in a package, else its module's file (None: no file,
    a class made at run time)."""
    name = cls.__module__
    top = sys.modules.get(name.split('.')[0])
    if top is not None and getattr(top, '__path__', None):
        return top.__name__, os.path.abspath(list(top.__path__)[0])
    path = getattr(sys.modules.get(name), '__file__', None)
    return (name, os.path.abspath(path)) if path else None


def check_same_model_code(comm, cls, warn=None):
    """As :func:`check_same_software` for the user's model code (a Theano-MPI model
    file and its package, :func:`model_code`): a host whose copy differs would
    train another graph, its gradients summed with the others' without a word."""
    if comm.size == 1:
        return []
    code = model_code(cls)
    mine = {'format': FORMAT, 'mixed': _mixed_allowed(),
            'model': code and '%s, source %s' % (code[0], code_digest(code[1])[:12]),
            'where': code and code[1]}
    return _check(comm, mine, ('model',), warn, 'Give every host the same model files (one '
                  'copy on a shared filesystem, or the same copy on each)')


def first_exchange_s(environ=None):
    """:data:`FIRST_EXCHANGE_S`, or ``$THEANOMPI_EXT_FIRST_EXCHANGE_S`` (seconds > 0)."""
    return seconds_from_env(FIRST_EXCHANGE_VAR, FIRST_EXCHANGE_S, environ)


def _check(comm, mine, components, warn, hint):
    from ..errors import CollectiveTimeout
    limit = first_exchange_s()
    try:
        every = comm.allgather_bounded((socket.gethostname(), mine), limit,
                                       label='which software each rank runs')
    except CollectiveTimeout:
        raise CollectiveTimeout(
            'rank %d of %d: not every rank took part in the job\'s first exchange (which '
            'software each rank runs) within %g s: a rank runs another theanompi_ext (one '
            'older than this check, which starts otherwise), or has not got this far '
            '(stopped, or stuck in its start). Install the same on every host; %s sets the '
            'limit' % (comm.rank, comm.size, limit, FIRST_EXCHANGE_VAR))
    parts = differences(every, components)
    if not parts:
        return []
    text = ('the ranks do not all run the same software: %s' % '; '.join(parts))
    first = _answer(every[0])[1]
    if first is not None and first.get('mixed'):
        if comm.rank == 0:
            (warn or (lambda t: sys.stderr.write(t + '\n')))(
                'theanompi-ext: warning: %s (going on: %s=1)' % (text, MIXED_VAR))
        return parts
    raise SoftwareMismatch('%s. %s, or set %s=1 to run anyway' % (text, hint, MIXED_VAR))
