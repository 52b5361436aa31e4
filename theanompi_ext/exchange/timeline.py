"""Per-iteration timeline of compute and communication, and its exports.

The trainer hands each finished step to :meth:`Timeline.record_step`:
the ``perf_counter`` stamps of the step's phases, the backward pass's
per-chunk stamps, and the allreduce handles of the step's buckets (whose
``t_queued``/``t_start``/``t_end`` the communicator fills in). From these
the timeline derives the *exposed communication* of a step: how long the
step still waited on communication after its last backward chunk ended,

    exposed = max(0, max(h.t_end for h in handles) - end of last chunk)

(for the serial exchanger, where nothing starts before the backward pass
ends, that is the whole exchange).

Chrome trace (``<prefix>.json``; opens in chrome://tracing and Perfetto)
-----------------------------------------------------------------------
``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}``.
Every timed event is a complete event (``"ph": "X"``) with ``ts`` and
``dur`` in microseconds from the earliest event of the trace; ``pid`` is
the rank. Two lanes per rank, integer ``tid`` (Perfetto's JSON importer
wants integers) named by ``"ph": "M"`` ``thread_name`` metadata events:

``tid 0 "compute"`` (the training thread)
    ``step <i>`` spans the whole iteration. Nested inside it, in time
    order and without overlapping each other:
    ``forward``, then ``backward:<chunk>`` for each chunk from the output
    back (chunked backward; ``args`` carries ``grad_bytes`` and ``tensors``
    of the exchanged gradients the chunk produces), or one
    ``forward_backward`` (monolithic);
    ``stats`` (the allreduce of loss/error counts);
    ``wait`` (overlapped exchanger only: waiting for the buckets);
    ``update`` (serial exchanger: the whole bucket exchange plus the
    update, which is where it happens; overlapped: the update only).
``tid 1 "comm"`` (the communication thread)
    ``bucket <b>`` from when the transfer started to when it finished,
    in the order the buckets were started (one FIFO thread, so they do
    not overlap); ``args`` carries ``bytes`` and ``queued_us`` (the time
    between the main thread starting the bucket and the transfer
    beginning). Each lies inside its step's ``step <i>`` interval.

``tid 2 "copy"`` (host-staged device exchange only)
    ``d2h bucket<b>`` (a ready bucket copied from the device gradient to
    the host buffer, between backward chunks) and ``h2d bucket<b>`` (its
    sum written back, before the update); ``args`` carries ``bytes``.
``otherData`` has per-step ``exposed_comm_us`` per rank and the median,
and ``job_exposed_comm_us`` (:func:`job_exposed_comm`: the job's wait after
the last rank's backward pass, which leaves out ranks waiting for each
other) and its median.
``clock_offset_us`` (per rank: what was added to its stamps to put them on
rank 0's clock) and ``clock_error_us`` (the bound of that estimate).
Timestamps are ``time.perf_counter()`` (CLOCK_MONOTONIC), common to the
ranks of one machine; the ranks of other machines are moved onto rank 0's
clock before the events are gathered (:mod:`.clock_sync`: 0 for rank 0's
machine, else an estimate within ``clock_error_us``, half the shortest
round trip of a bcast and an allgather).

PNG (``<prefix>.png``)
----------------------
A Gantt chart (matplotlib, Agg backend): one row per rank and lane, the
last few steps, phases, chunks and buckets coloured; the title gives the
median exposed communication.
"""
import io
import json

import numpy as np

from ..files.atomic import write_atomic, write_json
from .clock_sync import offsets_to_rank0

COMPUTE_TID, COMM_TID, COPY_TID = 0, 1, 2
LANES = {COMPUTE_TID: 'compute', COMM_TID: 'comm', COPY_TID: 'copy'}


def chunk_grad_sizes(chunk_params, layout, n_exch_params):
    """Per backward chunk label, ``{'grad_bytes', 'tensors'}`` of the *exchanged*
    gradients it produces (the ``args`` of its trace events).

    ``chunk_params``: the chunked backward's label -> flat-layout indices;
    indices below ``n_exch_params`` are exchanged (the flat order puts the
    local BN gamma/beta last).
    """
    out = {}
    for label, idx in chunk_params.items():
        exch = [i for i in idx if i < n_exch_params]
        out[label] = {'grad_bytes': sum(layout.sizes[i] * np.dtype(layout.dtypes[i]).itemsize
                                        for i in exch),
                      'tensors': len(exch)}
    return out


class StepRecord(object):
    """The stamps of one iteration (seconds, ``perf_counter``)."""

    def __init__(self, iteration, t_begin, t_end, compute, phases, comm, copies=()):
        self.iteration = iteration
        self.copies = list(copies)   # [(name, t0, t1, nbytes)] device <-> host copies
        self.t_begin, self.t_end = t_begin, t_end
        self.compute = compute   # [(name, t0, t1)] forward and backward chunks
        self.phases = phases     # [(name, t0, t1)] stats / wait / update
        self.comm = comm         # [(name, t_queued, t_start, t_end, nbytes)]

    @property
    def backward_end(self):
        """When the last backward chunk ended."""
        return self.compute[-1][2]

    @property
    def exposed_comm(self):
        """Seconds the step waited on communication after its backward pass."""
        if not self.comm:
            return 0.0
        return max(0.0, max(c[3] for c in self.comm) - self.backward_end)


class Timeline(object):
    """Records steps of one rank; exports Chrome trace JSON and PNG.

    ``max_steps`` bounds memory on long runs: only the first that many
    steps are kept (the first step, which pays warm-up costs, included).
    """

    def __init__(self, rank=0, max_steps=500):
        self.rank = int(rank)
        self.max_steps = int(max_steps)
        self.steps = []
        # Backward chunk label -> args of its events (chunk_grad_sizes);
        # set by the trainer, written into the trace.
        self.chunk_grads = {}

    def record_step(self, iteration, t_begin, t_end, compute, phases, handles, copies=()):
        """Add one iteration.

        ``compute``: ``[(name, t0, t1)]`` of the forward/backward pieces;
        ``phases``: ``[(name, t0, t1)]`` of the rest of the step;
        ``handles``: the step's :class:`~theanompi_ext.collective.base.Handle`
        objects (finished); ``copies``: ``[(name, t0, t1, nbytes)]`` of the
        host-staged exchange's device/host copies.
        """
        if len(self.steps) >= self.max_steps:
            return
        comm = [(h.name or 'allreduce', h.t_queued, h.t_start if h.t_start is not None
                 else h.t_queued, h.t_end, int(getattr(h.buf, 'nbytes', 0)))
                for h in handles]
        self.steps.append(StepRecord(iteration, t_begin, t_end, list(compute),
                                     list(phases), comm, copies))

    def record_train_step(self, iteration, stamps, backward_times, handles, overlapped,
                          copies=()):
        """Add one :meth:`Trainer.step <theanompi_ext.train.trainer.Trainer.step>`.

        ``stamps`` = (begin, backward done, stats done, wait done, end);
        ``backward_times`` the backward's per-piece stamps, or None for a
        monolithic backward (one ``forward_backward`` piece).
        """
        t_begin, t_bwd, t_stats, t_wait, t_end = stamps
        compute = backward_times or [('forward_backward', t_begin, t_bwd)]
        phases = [('stats', t_bwd, t_stats)]
        if overlapped:
            phases.append(('wait', t_stats, t_wait))
        phases.append(('update', t_wait, t_end))
        self.record_step(iteration, t_begin, t_end, compute, phases, handles, copies)

    def exposed_comm(self):
        """Per-step exposed communication (seconds)."""
        return [s.exposed_comm for s in self.steps]

    def events(self):
        """Chrome trace events of this rank (``ts`` in seconds, not yet rebased)."""
        ev = []
        for s in self.steps:
            ev.append(_x('step %d' % s.iteration, self.rank, COMPUTE_TID, s.t_begin, s.t_end,
                         exposed_comm_us=1e6 * s.exposed_comm))
            for name, t0, t1 in s.compute + s.phases:
                ev.append(_x(name, self.rank, COMPUTE_TID, t0, t1,
                             **self.chunk_grads.get(name, {})))
            for name, tq, t0, t1, nbytes in s.comm:
                ev.append(_x(name, self.rank, COMM_TID, t0, t1, bytes=nbytes,
                             queued_us=1e6 * (t0 - tq), step=s.iteration))
            for name, t0, t1, nbytes in s.copies:
                ev.append(_x(name, self.rank, COPY_TID, t0, t1, bytes=nbytes, step=s.iteration))
        return ev

    def step_marks(self):
        """Per step: (iteration, end of the backward pass, end of the last transfer)."""
        return [(s.iteration, s.backward_end, max((c[3] for c in s.comm), default=None))
                for s in self.steps]

    def gather(self, comm=None):
        """The trace of every rank's steps (on rank 0; None on the others).

        With a communicator every rank must call this.
        """
        # stamps of another machine's clock moved onto rank 0's (clock_sync.py)
        offset, error = offsets_to_rank0(comm) if comm is not None else (0.0, 0.0)
        events = [dict(e, ts=e['ts'] + offset) for e in self.events()]
        marks = [(it, b + offset, None if c is None else c + offset)
                 for it, b, c in self.step_marks()]
        mine = json.dumps({'rank': self.rank, 'events': events, 'offset': offset,
                           'exposed': self.exposed_comm(), 'marks': marks})
        parts = comm.allgather(mine) if comm is not None else [mine]
        if comm is not None and comm.rank != 0:
            return None
        ranks = [json.loads(p) for p in parts]
        trace = chrome_trace([e for r in ranks for e in r['events']],
                             {r['rank']: r['exposed'] for r in ranks})
        trace['otherData']['clock_offset_us'] = {str(r['rank']): round(1e6 * r['offset'], 1)
                                                 for r in ranks}
        trace['otherData']['clock_error_us'] = round(1e6 * error, 1)
        job = job_exposed_comm([r['marks'] for r in ranks])
        trace['otherData']['job_exposed_comm_us'] = [round(1e6 * v, 1) for v in job]
        trace['otherData']['job_exposed_comm_median_us'] = \
            round(1e6 * float(np.median(job)), 1) if job else 0.0
        return trace

    def save(self, prefix, comm=None, png=True):
        """Write ``<prefix>.json`` (and ``.png``) with every rank's events.

        With a communicator every rank must call this; rank 0 gathers the
        events and writes the files. Returns the paths written (rank 0).
        """
        trace = self.gather(comm)
        return [] if trace is None else write_trace(trace, prefix, png)


def write_trace(trace, prefix, png=True):
    """Write ``<prefix>.json`` and (``png``) ``<prefix>.png``; return the paths."""
    paths = [prefix + '.json']
    write_json(paths[0], trace, 'the timeline')
    if png:
        buf = io.BytesIO()
        plot_trace(trace, buf)
        if buf.getvalue():           # nothing is drawn without a whole step
            paths.append(prefix + '.png')
            write_atomic(paths[1], buf.getvalue(), 'the timeline chart')
    return paths


def job_exposed_comm(marks_by_rank):
    """Per step, the communication the *job* waits for after its backward pass.

    ``marks_by_rank``: each rank's :meth:`Timeline.step_marks`. A rank's
    own exposed communication also counts the time it waits for a slower
    rank to finish computing (the allreduce needs both), which is load
    imbalance, not communication. Across ranks (one machine, one clock):
    ``max(0, last transfer end on any rank - last backward end on any rank)``.
    Steps not recorded by every rank are skipped.
    """
    per_step = {}
    for marks in marks_by_rank:
        for it, bwd_end, comm_end in marks:
            per_step.setdefault(it, []).append((bwd_end, comm_end))
    out = []
    for it in sorted(per_step):
        rows = per_step[it]
        if len(rows) != len(marks_by_rank):
            continue
        ends = [c for _, c in rows if c is not None]
        out.append(max(0.0, max(ends) - max(b for b, _ in rows)) if ends else 0.0)
    return out


def _x(name, pid, tid, t0, t1, **args):
    """A complete event with times still in seconds."""
    return {'name': name, 'ph': 'X', 'pid': pid, 'tid': tid, 'ts': t0,
            'dur': max(0.0, t1 - t0), 'args': args}


def chrome_trace(events, exposed_by_rank):
    """The trace object: events rebased to microseconds, sorted, with lane names."""
    base = min((e['ts'] for e in events), default=0.0)
    out = []
    for pid in sorted({e['pid'] for e in events}):
        out.append({'name': 'process_name', 'ph': 'M', 'pid': pid, 'tid': COMPUTE_TID,
                    'args': {'name': 'rank %d' % pid}})
        for tid, lane in sorted(LANES.items()):
            out.append({'name': 'thread_name', 'ph': 'M', 'pid': pid, 'tid': tid,
                        'args': {'name': lane}})
    timed = []
    for e in events:
        e = dict(e)
        e['ts'] = round(1e6 * (e['ts'] - base), 3)
        e['dur'] = round(1e6 * e['dur'], 3)
        timed.append(e)
    # Parents before children at equal start: longer first.
    timed.sort(key=lambda e: (e['pid'], e['tid'], e['ts'], -e['dur']))
    all_exposed = [v for r in exposed_by_rank.values() for v in r]
    other = {'exposed_comm_us': {str(r): [round(1e6 * v, 1) for v in vals]
                                 for r, vals in exposed_by_rank.items()},
             'exposed_comm_median_us': round(1e6 * float(np.median(all_exposed)), 1)
             if all_exposed else 0.0}
    return {'traceEvents': out + timed, 'displayTimeUnit': 'ms', 'otherData': other}


def check_trace(trace, slack_us=1.0):
    """Raise ValueError unless ``trace`` is ordered and nested as documented.

    Per rank and lane, complete events are sorted by start; on the compute
    lane every event lies inside one ``step`` event and the events inside a
    step do not overlap; on the comm lane buckets do not overlap and each
    lies inside a step of the same rank. Returns the number of steps.
    """
    events = trace['traceEvents']
    xs = [e for e in events if e.get('ph') == 'X']
    for e in xs:
        for k in ('name', 'pid', 'tid', 'ts', 'dur'):
            if k not in e:
                raise ValueError('event without %r: %r' % (k, e))
        if e['dur'] < 0:
            raise ValueError('negative duration: %r' % (e,))
    n_steps = 0
    for pid in sorted({e['pid'] for e in xs}):
        lanes = {t: [e for e in xs if e['pid'] == pid and e['tid'] == t] for t in LANES}
        for t, evs in lanes.items():
            if [e['ts'] for e in evs] != sorted(e['ts'] for e in evs):
                raise ValueError('rank %d lane %s: events not sorted by start' % (pid, LANES[t]))
        steps = [e for e in lanes[COMPUTE_TID] if e['name'].startswith('step ')]
        n_steps += len(steps)
        inner = [e for e in lanes[COMPUTE_TID] if not e['name'].startswith('step ')]
        for i, s in enumerate(steps):
            if i and s['ts'] < steps[i - 1]['ts'] + steps[i - 1]['dur'] - slack_us:
                raise ValueError('rank %d: %s overlaps the previous step' % (pid, s['name']))
        for lane, evs in ((COMPUTE_TID, inner), (COMM_TID, lanes[COMM_TID])):
            prev_end = None
            for e in evs:
                if not any(s['ts'] - slack_us <= e['ts'] and
                           e['ts'] + e['dur'] <= s['ts'] + s['dur'] + slack_us for s in steps):
                    raise ValueError('rank %d lane %s: %s at %.1f us is outside every step'
                                     % (pid, LANES[lane], e['name'], e['ts']))
                if prev_end is not None and e['ts'] < prev_end - slack_us:
                    raise ValueError('rank %d lane %s: %s overlaps the event before it'
                                     % (pid, LANES[lane], e['name']))
                prev_end = e['ts'] + e['dur']
    return n_steps


def plot_trace(trace, path, last_steps=3):
    """Gantt-like PNG of the last ``last_steps`` steps of every rank, saved to
    ``path`` (a file name or a binary file: the writers render it into memory)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    xs = [e for e in trace['traceEvents'] if e.get('ph') == 'X']
    pids = sorted({e['pid'] for e in xs})
    steps = sorted({e['name'] for e in xs if e['name'].startswith('step ')},
                   key=lambda n: int(n.split()[1]))[-last_steps:]
    keep = [e for e in xs if e['name'] in steps]
    if not keep:
        return
    t_lo = min(e['ts'] for e in keep)
    t_hi = max(e['ts'] + e['dur'] for e in keep)
    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.9 * len(pids)))
    colours = {'forward': '#4c72b0', 'stats': '#999999', 'wait': '#c44e52',
               'update': '#55a868', 'forward_backward': '#8172b2'}
    rows, labels = 0, []
    for pid in pids:
        for tid in (COMPUTE_TID, COMM_TID):
            y = rows
            for e in xs:
                if e['pid'] != pid or e['tid'] != tid or e['name'].startswith('step '):
                    continue
                if e['ts'] < t_lo or e['ts'] > t_hi:
                    continue
                if tid == COMM_TID:
                    colour = '#dd8452'
                elif e['name'].startswith('backward:'):
                    colour = '#64b5cd'
                else:
                    colour = colours.get(e['name'], '#cccccc')
                ax.broken_barh([((e['ts'] - t_lo) / 1e3, max(e['dur'], 1.0) / 1e3)],
                               (y - 0.4, 0.8), facecolors=colour, edgecolor='white',
                               linewidth=0.3)
            labels.append('rank %d %s' % (pid, LANES[tid]))
            rows += 1
    ax.set_yticks(range(rows))
    ax.set_yticklabels(labels)
    ax.invert_yaxis()
    ax.set_xlabel('ms')
    med = trace.get('otherData', {}).get('exposed_comm_median_us', 0.0)
    ax.set_title('last %d steps; exposed communication median %.1f ms '
                 '(forward blue, backward chunks cyan, buckets orange, wait red)'
                 % (len(steps), med / 1e3), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, format='png', dpi=110)
    plt.close(fig)
