"""A measured workload from a training timeline (``train --timeline PREFIX``).

The timeline's Chrome trace (:mod:`theanompi_ext.exchange.timeline`) holds,
per step and rank, the ``forward`` piece and each ``backward:<chunk>`` of
the chunked backward with the gradient bytes and tensors the chunk
produces. That is the simulator's layers format at chunk granularity, the
granularity at which the overlapped exchanger can start buckets: one
"layer" per chunk, in backward order, with the median of its times.

The first step is left out when there are others (it pays compilation
and first-touch costs). One rank is read (default: the lowest).
"""
import numpy as np


def is_trace(doc):
    """True for a Chrome trace object (what the timeline writes)."""
    return isinstance(doc, dict) and 'traceEvents' in doc


def layers_from_trace(trace, source='trace', rank=None):
    """The layers-file object ``{"layers", "forward_s", "name"}`` of a timeline trace.

    Raises ``ValueError`` naming ``source`` when the trace has no chunked
    backward (a run with the serial exchanger times only one
    ``forward_backward`` piece, which has no per-layer split).
    """
    events = trace.get('traceEvents')
    if not isinstance(events, list):
        raise ValueError('%s: traceEvents must be a list' % (source,))
    timed = [e for e in events if isinstance(e, dict) and e.get('ph') == 'X'
             and isinstance(e.get('name'), str) and isinstance(e.get('pid'), int)
             and isinstance(e.get('dur'), (int, float)) and isinstance(e.get('ts'), (int, float))]
    if rank is None:
        ranks = sorted({e['pid'] for e in timed})
        if not ranks:
            raise ValueError('%s: no timed events' % (source,))
        rank = ranks[0]
    mine = sorted((e for e in timed if e['pid'] == rank and e.get('tid') == 0),
                  key=lambda e: e['ts'])
    steps = [e for e in mine if e['name'].startswith('step ')]
    if len(steps) > 1:
        mine = [e for e in mine if e['ts'] >= steps[1]['ts']]   # drop the first step
    chunks, forward = {}, []
    for e in mine:
        if e['name'] == 'forward':
            forward.append(e['dur'])
        elif e['name'].startswith('backward:'):
            args = e.get('args') or {}
            if 'grad_bytes' not in args:
                raise ValueError('%s: event %r carries no grad_bytes (a timeline written '
                                 'before chunk sizes were recorded)' % (source, e['name']))
            entry = chunks.setdefault(e['name'], {'durs': [], 'bytes': args['grad_bytes'],
                                                  'tensors': args.get('tensors', 1)})
            entry['durs'].append(e['dur'])
    if not chunks:
        raise ValueError('%s: no backward chunks for rank %d; record the timeline of a '
                         'run with the chunked backward (exch_strategy ar-overlap)'
                         % (source, rank))
    layers = [{'name': label[len('backward:'):],
               'backward_s': float(np.median(c['durs'])) / 1e6,
               'grad_bytes': c['bytes'],
               'tensors': max(1, int(c['tensors']))}
              for label, c in chunks.items()]          # first appearance: backward order
    n = len(next(iter(chunks.values()))['durs'])
    out = {'layers': layers,
           'name': '%s (rank %d, median of %d step(s))' % (source, rank, n)}
    if forward:
        out['forward_s'] = float(np.median(forward)) / 1e6
    return out
