"""What mpiexec printed about a rank that ended badly: MPICH's hydra or Open MPI.

Read line by line from the job's output by ``launch/postmortem.py``, which
turns it into the project's own message and exit status.

MPICH's hydra (on standard output) names the PID and host, not the rank::

    =   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES
    =   PID 17436 RUNNING AT node7
    =   EXIT CODE: 9
    YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Killed (signal 9)

Open MPI (``prterun``, or ``mpirun`` in 4.x; on standard error, wrapped at
about 72 columns wherever the names fall) names the rank::

    prterun noticed that process rank 1 with PID 12109 on node vm exited on
    signal 9 (Killed).

and, for a rank that ended without ``MPI_Finalize`` (``os._exit(0)`` in
some library, which hydra mostly reports as success)::

    prterun has exited due to process rank 1 with PID 13736 on node vm exiting
    improperly. There are three reasons this could occur: ...

A rank killed on another host may instead be seen first by a rank that lost
its connection to it, which then aborts (measured, Open MPI 5.0.11 across
emulated hosts; prterun then names only the aborting rank)::

    An MPI communication peer process has unexpectedly disconnected. ...
      Local host: tmxh0
      Local PID:  13105
      Peer host:  tmxh1

Or only the rank's own MPI error, the text above missing (measured, 1 run in 3
of a Theano-MPI session across 2 emulated hosts)::

    [tmxh0:00000] *** An error occurred in Socket closed

:attr:`LauncherReport.peer_lost` keeps ``(peer host, local host)``, the peer
host None when only that line was seen.

A rank that called ``MPI_Abort`` (the watchdog's status 4, a failed rank's 3)::

    MPI_ABORT was invoked on rank 0 in communicator MPI_COMM_WORLD
      Proc: [[44865,1],0]
      Errorcode: 4
    ...
    prterun has exited due to process rank 0 with PID 0 on node tmxh0 calling
    "abort". ...

:attr:`LauncherReport.aborted` keeps ``(rank, host, code)``; prterun may still
be waiting for a host it cannot reach (``launch/postmortem.py`` ends it).
MPICH's library says it in the rank's own output, without the host (``node``
is the rank in MPI_COMM_WORLD)::

    Abort(4) on node 0 (rank 0 in comm 0): application called MPI_Abort(MPI_COMM_WORLD, 4) - process 0

A rank that could not reach another (a firewall between the hosts, an
interface they do not share). Open MPI says whom (5.0.11, measured on 2
emulated hosts with a prohibit route between them)::

    [tmxh1][[63893,1],1][.../btl_tcp_endpoint.c:854:mca_btl_tcp_endpoint_start_connect]
        peer: tmxh0 Unable to connect to the peer 10.77.0.1 on port 1024: Permission denied

(one line), kept in :attr:`LauncherReport.unreachable_peer`; MPICH (5.0.2) only
that MPI_Init failed, the cause on the last line of its error stack::

    Abort(678577423) on node 1: Fatal error in internal_Init_thread: Other MPI error, ...
    internal_Init_thread(71)....: MPI_Init_thread(...) failed
    ...
    MPIDI_OFI_send_lightweight(108)....: OFI call tinjectdata failed (default nic=eth0: Permission denied)

kept in :attr:`LauncherReport.init_failed` as ``(rank, cause)``.

Open MPI's own exit status for a rank killed by signal N is 128 + N where
hydra's is N; :attr:`LauncherReport.signal` lets the launcher give the same
status under both (``theanompi_ext/errors.py``).
"""
import re

_HYDRA_PID = re.compile(rb'=\s+PID (\d+) RUNNING AT (\S+)')
_HYDRA_CODE = re.compile(rb'=\s+EXIT CODE: (\d+)')
_HYDRA_STRING = re.compile(rb'TERMINATED WITH THE EXIT STRING: (.*)')
_HYDRA_SIGNAL = re.compile(r'\(signal (\d+)\)')

_OMPI_PROCESS = rb'process rank (\d+) with PID (\d+) on node (\S+) '
_OMPI_SIGNAL = re.compile(_OMPI_PROCESS + rb'exited on signal (\d+) \(([^)]*)\)')
_OMPI_IMPROPER = re.compile(_OMPI_PROCESS + rb'exiting improperly')
_OMPI_ABORT = re.compile(_OMPI_PROCESS + rb'calling "abort"')
_MPICH_ABORT = re.compile(rb'^Abort\((-?\d+)\) on node (\d+) \(rank \d+ in comm \d+\): '
                          rb'application called MPI_Abort')
_OMPI_ERRORCODE = re.compile(rb'^\s*Errorcode:\s+(-?\d+)')
_OMPI_DISCONNECTED = re.compile(rb'peer process has unexpectedly disconnected')
_OMPI_LOCAL_HOST = re.compile(rb'^\s*Local host:\s+(\S+)')
_OMPI_PEER_HOST = re.compile(rb'^\s*Peer host:\s+(\S+)')
_OMPI_SOCKET_CLOSED = re.compile(rb'^\s*\[([^\]\s:]+):\d+\] \*\*\* '
                                 rb'An error occurred in Socket closed')
_OMPI_CONNECT = re.compile(rb'^\s*\[([^\]\s]+)\]\[\[\d+,\d+\],(\d+)\]\[[^\]]*\] peer: (\S+) '
                           rb'Unable to connect to the peer (\S+) on port (\d+): (.*\S)')
_MPICH_INIT_FAILED = re.compile(rb'^Abort\(-?\d+\) on node (\d+)(?: \(rank \d+ in comm \d+\))?: '
                                rb'Fatal error in \w*Init\w*:')
#: A line of MPICH's error stack: ``FUNCTION(LINE)......: words`` (words may be empty).
_MPICH_STACK = re.compile(rb'^[A-Za-z_]\w*\(\d+\)\.*:\s*(.*?)\s*$')
#: Lines of Open MPI's text joined before matching: its sentences wrap.
_OMPI_WINDOW = 3


def _text(raw):
    return raw.decode('utf-8', 'replace').strip()


class LauncherReport(object):
    """What the launcher said about the first process that ended badly.

    ``pid``, ``host``: the process (hydra and Open MPI); ``rank``: its rank
    where the launcher names it (Open MPI; PID 0 there means unknown);
    ``code``, ``exit_string``: how it ended, in hydra's words (``Killed
    (signal 9)``, Open MPI's turned into them); ``signal``: the signal that
    killed it, if one did; ``unfinished``: it ended without finalizing MPI
    (Open MPI's "exiting improperly"); ``peer_lost``: ``(host, seen from host)`` of
    a rank whose connection closed under another (Open MPI), or None;
    ``aborted``: ``(rank, host, code)`` of a rank that called ``MPI_Abort``
    (Open MPI; ``code`` None if its ``Errorcode`` line was not seen; MPICH:
    ``host`` None), or None; ``unreachable_peer``: ``(rank, host, peer host,
    address, port, why)`` of the first rank that could not connect to another
    (Open MPI), or None; ``init_failed``: ``(rank, cause)`` of the first rank whose
    MPI_Init failed (MPICH), or None.
    """

    def __init__(self):
        self.pid = self.host = self.rank = self.code = self.exit_string = None
        self.signal = None
        self.unfinished = False
        self.peer_lost = self.aborted = None
        self.unreachable_peer = self.init_failed = None
        self._in_init_stack = False
        self._abort_code = None
        self._disconnected, self._local_host = False, None
        self._window = []

    def feed(self, line):
        """Look at one line (bytes) of the job's output, standard output or error."""
        self._feed(line)
        lost, aborted = self.peer_lost, self.aborted
        if lost and lost[0] is None and aborted and aborted[1] not in (None, lost[1]):
            # a lone "Socket closed" on another host than the rank that aborted: that
            # abort was the rank's own (a watchdog, an error), the socket closed after it
            self.peer_lost = None

    def _feed(self, line):
        self._feed_unreachable(line)
        self._feed_hydra(line)
        self._feed_disconnect(line)
        self._window = (self._window + [line.strip()])[-_OMPI_WINDOW:]
        m = _OMPI_ERRORCODE.search(line)
        if m and self._abort_code is None:
            self._abort_code = int(m.group(1))
        if self.aborted is not None and self.pid is not None:
            return
        text = b' '.join(self._window)
        if self.aborted is None:
            m = _OMPI_ABORT.search(text)
            if m:
                self.aborted = (int(m.group(1)), _text(m.group(3)), self._abort_code)
            m = _MPICH_ABORT.search(line.strip())
            if m:
                self.aborted = (int(m.group(2)), None, int(m.group(1)))
        if self.pid is None:
            self._feed_openmpi(text)

    def _feed_hydra(self, line):
        m = _HYDRA_PID.search(line)
        if m and self.pid is None:
            self.pid, self.host = int(m.group(1)), _text(m.group(2))
        m = _HYDRA_CODE.search(line)
        if m and self.code is None:
            self.code = int(m.group(1))
        m = _HYDRA_STRING.search(line)
        if m and self.exit_string is None:
            self.exit_string = _text(m.group(1))
            sig = _HYDRA_SIGNAL.search(self.exit_string)
            self.signal = int(sig.group(1)) if sig else None

    def _feed_unreachable(self, line):
        m = _OMPI_CONNECT.search(line)
        if m and self.unreachable_peer is None:
            self.unreachable_peer = (int(m.group(2)), _text(m.group(1)), _text(m.group(3)),
                                     _text(m.group(4)), int(m.group(5)), _text(m.group(6)))
        stripped = line.strip()
        m = _MPICH_INIT_FAILED.search(stripped)
        if m:
            # the first rank's stack is the one kept
            self._in_init_stack = self.init_failed is None
            if self.init_failed is None:
                self.init_failed = (int(m.group(1)), None)
            return
        if not self._in_init_stack:
            return
        m = _MPICH_STACK.search(stripped)
        if not m:
            self._in_init_stack = False        # the stack has ended
        elif m.group(1):
            # the deepest words are the cause; 'MPI_Init_thread(...) failed' the least
            self.init_failed = (self.init_failed[0], _text(m.group(1)))

    def _feed_disconnect(self, line):
        if _OMPI_DISCONNECTED.search(line):
            self._disconnected = True
        m = _OMPI_SOCKET_CLOSED.search(line)
        if m and self.peer_lost is None:
            self.peer_lost = (None, _text(m.group(1)))
        if not self._disconnected or (self.peer_lost and self.peer_lost[0]):
            return
        m = _OMPI_LOCAL_HOST.search(line)
        if m:
            self._local_host = _text(m.group(1))
        m = _OMPI_PEER_HOST.search(line)
        if m:
            self.peer_lost = (_text(m.group(1)), self._local_host or 'another host')

    def _feed_openmpi(self, text):
        m = _OMPI_SIGNAL.search(text) or _OMPI_IMPROPER.search(text)
        if not m:
            return
        self.rank, self.pid, self.host = int(m.group(1)), int(m.group(2)), _text(m.group(3))
        if m.re is _OMPI_SIGNAL:
            self.signal = self.code = int(m.group(4))
            self.exit_string = '%s (signal %d)' % (_text(m.group(5)), self.signal)
        else:
            self.unfinished = True
