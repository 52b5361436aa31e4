"""A measured workload from a training timeline (``train --timeline PREFIX``).

The timeline's Chrome trace (:mod:`theanompi_ext.exchange.timeline`) holds,
per step and rank, the ``forward`` piece and each ``backward:<chunk>`` of
the chunked backward with the gradient bytes and tensors the chunk
produces. That is the simulator's layers format at chunk granularity, the
granularity at which the overlapped exchanger can start buckets: one
"layer" per chunk, in backward order, with the median of its times.

The first step is left out when there are others (it pays compilation
and first-touch costs). One rank is read (default: the lowest), or, with
``rank='slowest'``, in every step the rank whose compute ended last: a
synchronous step goes at the pace of its slowest rank, and on a loaded
machine which rank that is changes from step to step (bench validate reads
the traces so). ``gaps=True`` counts the time between a chunk and the one
before it (the hand-off of a bucket to the communication thread) in the
chunk.
"""
import numpy as np

SLOWEST = 'slowest'


def is_trace(doc):
    """True for a Chrome trace object (what the timeline writes)."""
    return isinstance(doc, dict) and 'traceEvents' in doc


def _timed(trace, source):
    events = trace.get('traceEvents')
    if not isinstance(events, list):
        raise ValueError('%s: traceEvents must be a list' % (source,))
    timed = [e for e in events if isinstance(e, dict) and e.get('ph') == 'X'
             and isinstance(e.get('name'), str) and isinstance(e.get('pid'), int)
             and isinstance(e.get('dur'), (int, float)) and isinstance(e.get('ts'), (int, float))]
    if not timed:
        raise ValueError('%s: no timed events' % (source,))
    return timed


def _is_compute(name):
    return name in ('forward', 'forward_backward') or name.startswith('backward:')


def rank_steps(trace, source='trace', rank=None):
    """Per step (the first left out when there are others), the chosen rank's events.

    Returns ``(rank label, [[events of tid 0 inside the step, in time order], ...])``;
    ``rank`` an integer, None (the lowest) or ``'slowest'`` (per step, the rank
    whose last compute piece ends latest after its step began).
    """
    timed = _timed(trace, source)
    ranks = sorted({e['pid'] for e in timed})
    if rank is not None and rank != SLOWEST and rank not in ranks:
        raise ValueError('%s: no events of rank %r (ranks %s)' % (source, rank, ranks))
    per_rank = {}
    for r in ranks if rank == SLOWEST else [ranks[0] if rank is None else rank]:
        mine = sorted((e for e in timed if e['pid'] == r and e.get('tid') == 0),
                      key=lambda e: e['ts'])
        steps = [e for e in mine if e['name'].startswith('step ')]
        if not steps:                    # no step spans: everything is one step
            per_rank[r] = [mine]
            continue
        if len(steps) > 1:
            steps = steps[1:]            # drop the first step
        per_rank[r] = [[e for e in mine if s['ts'] <= e['ts'] < s['ts'] + s['dur']
                        and e is not s] for s in steps]
    if rank != SLOWEST:
        (r, steps), = per_rank.items()
        return r, steps
    n = min(len(v) for v in per_rank.values())
    return SLOWEST, [max((per_rank[r][i] for r in ranks), key=_compute_end) for i in range(n)]


def _compute_end(events):
    # microseconds from the step's first piece to the end of its last compute piece
    ends = [e['ts'] + e['dur'] for e in events if _is_compute(e['name'])]
    return (max(ends) - events[0]['ts']) if ends else 0.0


def layers_from_trace(trace, source='trace', rank=None, gaps=False):
    """The layers-file object ``{"layers", "forward_s", "name"}`` of a timeline trace.

    Raises ``ValueError`` naming ``source`` when the trace has no chunked
    backward (a run with the serial exchanger times only one
    ``forward_backward`` piece, which has no per-layer split). ``rank`` and
    ``gaps``: see the module doc.
    """
    slowest = rank == SLOWEST
    rank, steps = rank_steps(trace, source, rank)
    chunks, forward, ends = {}, [], []
    for events in steps:
        ends.append(_compute_end(events))
        prev_end = None
        for e in events:
            if e['name'] == 'forward':
                forward.append(e['dur'])
            elif e['name'].startswith('backward:'):
                args = e.get('args') or {}
                if 'grad_bytes' not in args:
                    raise ValueError('%s: event %r carries no grad_bytes (a timeline written '
                                     'before chunk sizes were recorded)' % (source, e['name']))
                entry = chunks.setdefault(e['name'], {'durs': [], 'bytes': args['grad_bytes'],
                                                      'tensors': args.get('tensors', 1)})
                start = prev_end if gaps and prev_end is not None else e['ts']
                entry['durs'].append(e['ts'] + e['dur'] - start)
            prev_end = e['ts'] + e['dur']
    if not chunks:
        raise ValueError('%s: no backward chunks for rank %s; record the timeline of a '
                         'run with the chunked backward (exch_strategy ar-overlap)'
                         % (source, rank))
    layers = [{'name': label[len('backward:'):],
               'backward_s': float(np.median(c['durs'])) / 1e6,
               'grad_bytes': c['bytes'],
               'tensors': max(1, int(c['tensors']))}
              for label, c in chunks.items()]          # first appearance: backward order
    n = len(next(iter(chunks.values()))['durs'])
    out = {'layers': layers,
           'name': '%s (rank %s, median of %d step(s))' % (source, rank, n)}
    if forward:
        out['forward_s'] = float(np.median(forward)) / 1e6
    if slowest and gaps:
        # Medians of the pieces do not add up to the median of the whole; the
        # step waits for the whole (the slowest rank's compute end), so the
        # pieces are scaled to it, keeping their proportions.
        parts = out.get('forward_s', 0.0) + sum(l['backward_s'] for l in layers)
        f = float(np.median(ends)) / 1e6 / parts if parts > 0 else 1.0
        for l in layers:
            l['backward_s'] *= f
        if forward:
            out['forward_s'] *= f
    return out


def piece_seconds(trace, name, source='trace', rank=None):
    """Median seconds per step of the pieces called ``name`` (summed within a step)."""
    rank, steps = rank_steps(trace, source, rank)
    per = [sum(e['dur'] for e in events if e['name'] == name) for events in steps]
    per = [d for d, events in zip(per, steps) if any(e['name'] == name for e in events)]
    if not per:
        raise ValueError('%s: no %r pieces for rank %s' % (source, name, rank))
    return float(np.median(per)) / 1e6


def bucket_bytes(trace, source='trace'):
    """Bytes of each bucket of one step, in the order the comm thread sent them.

    Read from the lowest rank's comm lane (``tid 1``, ``bucket<b>``
    events, whose ``args`` carry ``bytes`` and ``step``) in its last step;
    every step sends the same buckets.
    """
    timed = _timed(trace, source)
    r = min(e['pid'] for e in timed)
    lane = sorted((e for e in timed if e['pid'] == r and e.get('tid') == 1
                   and e['name'].startswith('bucket')), key=lambda e: e['ts'])
    if not lane:
        raise ValueError('%s: no buckets on the comm lane of rank %d' % (source, r))
    last = (lane[-1].get('args') or {}).get('step')
    return [float((e.get('args') or {}).get('bytes', 0)) for e in lane
            if (e.get('args') or {}).get('step') == last]
