"""Cross-rank checks of the NCCL backends: same buffers on every rank, one rank per GPU.

NCCL given different counts on different ranks hangs or corrupts memory,
so sizes are checked over MPI before NCCL sees them.
``size_check='first'`` (default): the first start of each *name*
allgathers ``(name, count)`` from every rank and compares; later starts
of a known name with the same count cost nothing (a changed count is
re-checked). Unnamed buffers have no identity to remember and are
checked on every start. ``'always'`` checks every start (debugging),
``'off'`` never.

:func:`check_sizes` and :func:`check_one_rank_per_gpu` are pure functions
of the gathered lists (unit-tested with fake ones).
"""

SIZE_CHECKS = ('first', 'always', 'off')


def check_sizes(gathered):
    """Raise ``ValueError`` unless every rank started the same buffers.

    ``gathered[r]`` is rank r's list of ``(name, count)`` in start order
    (what an allgather of each rank's list returns).
    """
    ref = list(gathered[0])
    problems = []
    for r, entries in enumerate(gathered[1:], 1):
        entries = list(entries)
        if len(entries) != len(ref):
            problems.append('rank 0 started %d buffer(s), rank %d started %d'
                            % (len(ref), r, len(entries)))
            continue
        for i, (mine, theirs) in enumerate(zip(ref, entries)):
            if tuple(mine) != tuple(theirs):
                problems.append('allreduce #%d: rank 0 has %r (%d float32), rank %d has %r (%d float32)'
                                % (i, mine[0], mine[1], r, theirs[0], theirs[1]))
                break
    if problems:
        shown = problems[:4] + (['... %d more rank(s)' % (len(problems) - 4)]
                                if len(problems) > 4 else [])
        raise ValueError('allreduce buffers differ across ranks: %s. Every rank must '
                         'start the same buffers, same sizes, same order (same model, '
                         'same bucket plan).' % '; '.join(shown))


def check_one_rank_per_gpu(gathered):
    """Raise ``RuntimeError`` when two ranks would share one GPU.

    ``gathered[r]`` is ``(hostname, pci_bus_id)`` of rank r (bus id None
    when unknown; such ranks are not compared). NCCL refuses duplicate
    GPUs in a communicator; saying so here names the ranks.
    """
    seen = {}
    for r, (host, bus) in enumerate(gathered):
        if bus is None:
            continue
        seen.setdefault((host, bus), []).append(r)
    clashes = ['ranks %s on %s GPU %s' % (','.join(map(str, rs)), host, bus)
               for (host, bus), rs in sorted(seen.items()) if len(rs) > 1]
    if clashes:
        raise RuntimeError('NCCL needs one rank per GPU, but %s. Launch at most one '
                           'rank per GPU per node (bind by local rank, or set '
                           'CUDA_VISIBLE_DEVICES per rank).' % '; '.join(clashes))


class SizeChecked(object):
    """Cross-rank size checks of the device backends (see the module docstring).

    Needs ``self.comm``, ``self.size``; :meth:`_init_size_check` sets the rest.
    """

    def _init_size_check(self, size_check):
        if size_check not in SIZE_CHECKS:
            raise ValueError('size_check must be one of %s, got %r' % (SIZE_CHECKS, size_check))
        self.size_check = size_check
        self._seen = {}

    def _check_size(self, name, count):
        if self.size == 1 or self.size_check == 'off':
            return
        if self.size_check == 'first' and name is not None and self._seen.get(name) == count:
            return
        check_sizes([[entry] for entry in self.comm.allgather((name, count))])
        if name is not None:
            self._seen[name] = count


__all__ = ['SIZE_CHECKS', 'SizeChecked', 'check_one_rank_per_gpu', 'check_sizes']
