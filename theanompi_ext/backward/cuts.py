"""Where a model's backward pass can be cut into chunks, read from its Theano graph.

The chunked backward (:mod:`~theanompi_ext.backward.chunked`) passes one
gradient from a chunk to the next: ``dL/dh`` at the chunk's input ``h``.
That is the whole story only when every path from the batch to the loss
goes through ``h`` (``h`` *dominates* the loss): cut inside a residual
block and the gradient flowing along the skip connection would be lost.
So a chunk boundary is a variable of the graph from the batch (``source``)
to the loss (``cost``) that

* every path from ``source`` to ``cost`` passes through, and
* lies between two groups of parameters: each parameter belongs to the
  chunk of its first use from the input (with the other parameters of its
  layer, ``units``). A parameter also used further on (a tied weight, a
  weight-decay term added to the loss) does not merge the chunks between:
  the chunked backward adds the partial gradient from those later chunks
  to its own chunk's (``ChunkedBackward``, "foreign" parameters).

Between two groups of parameters there are usually several candidates
(``conv -> +b -> relu -> pool``): the boundary is the last one before the
next group's first use, i.e. the next layer's input, preferring a
variable the model itself calls a layer output (``preferred``).

:func:`find_cuts` does this on any graph; the names of the groups come
from the caller (a Theano-MPI model's ``layers``, a Lasagne layer graph),
see :mod:`theanompi_ext.theanompi_compat.chunks`.
"""
import collections

from ..engine.core import toposort

# One group of parameters and the variable that ends it (None for the last
# group: it ends at the loss). ``params`` keeps the order of the caller's list.
Group = collections.namedtuple('Group', 'output params')


def _dependents(nodes, source):
    """Variables computed from ``source`` (``source`` included)."""
    dep = {source}
    for node in nodes:
        if any(v in dep for v in node.inputs):
            dep.update(node.outputs)
    return dep


def _ancestors(nodes, cost):
    """Variables ``cost`` is computed from (``cost`` included)."""
    up = {cost}
    for node in reversed(nodes):
        if any(v in up for v in node.outputs):
            up.update(node.inputs)
    return up


def _dominators(nodes, source, relevant):
    """The variables of ``relevant`` (source -> cost paths, in ``nodes`` order)
    that every such path passes through, in forward order (``source`` first).

    In a topological order, ``v`` is on every path iff no edge jumps from
    before ``v`` to after it: anything beside ``v`` would need one.
    """
    order = [source] + [v for node in nodes for v in node.outputs
                        if v in relevant and v is not source]
    pos = {v: i for i, v in enumerate(order)}
    reach = [0] * len(order)          # furthest position an edge from i lands on
    for node in nodes:
        ins = [pos[v] for v in node.inputs if v in pos]
        outs = [pos[v] for v in node.outputs if v in pos]
        if ins and outs:
            far = max(outs)
            for i in ins:
                reach[i] = max(reach[i], far)
    cuts, furthest = [], 0
    for i, v in enumerate(order):
        if furthest <= i:
            cuts.append(v)
        furthest = max(furthest, reach[i])
    return cuts


def _param_uses(nodes, params, dependent):
    """``{param: [node, ...]}``: the first batch-dependent nodes each parameter
    reaches through parameter-only expressions (a dimshuffled bias, ``W.T``)."""
    clients = collections.defaultdict(list)
    for node in nodes:
        for v in node.inputs:
            clients[v].append(node)
    uses = {}
    for p in params:
        found, seen, stack = [], {p}, [p]
        while stack:
            v = stack.pop()
            for node in clients.get(v, ()):
                if any(o in dependent for o in node.outputs):
                    found.append(node)
                    continue
                for o in node.outputs:
                    if o not in seen:
                        seen.add(o)
                        stack.append(o)
        uses[p] = found
    return uses


def default_units(params, spans):
    """Parameters that stay in one chunk when the model names no layers: each
    vector (a bias, a BN scale) joins the nearest matrix or filter bank used
    before or with it, as a layer's ``W, b`` go together."""
    units, current = [], None
    for p in sorted(params, key=lambda q: spans[q][0]):
        if current is None or getattr(p, 'ndim', 2) >= 2:
            current = [p]
            units.append(current)
        else:
            current.append(p)
    return units


def find_cuts(cost, source, params, units=None, preferred=()):
    """Groups of ``params`` separated by dominating variables of ``source -> cost``.

    Parameters
    ----------
    cost : symbolic scalar
        The loss.
    source : variable
        Where the batch enters (a model's symbolic ``x``, or the shared
        variable holding the batch).
    params : list of shared variables
    units : list of lists of parameters, or None
        Parameters that must end up in the same group (a layer's); None:
        :func:`default_units`. A parameter in no unit is a unit alone.
    preferred : iterable of variables
        Among equally good boundaries, these win (a model's layer outputs).

    Returns
    -------
    list of Group
        Forward order; every parameter in exactly one group; the last
        group's ``output`` is None. One group means the graph has no cut
        (the caller runs the serial exchange).
    """
    nodes = toposort([cost])
    dependent = _dependents(nodes, source)
    if cost not in dependent:
        raise ValueError('the loss does not depend on the batch variable %s' % (source,))
    relevant = dependent & _ancestors(nodes, cost)
    cuts = _dominators(nodes, source, relevant)
    # Which interval each batch-dependent variable is in: interval i runs from
    # cuts[i] to cuts[i + 1] (cuts[0] is the source, cuts[-1] the loss).
    index = {v: i for i, v in enumerate(cuts)}
    interval, node_interval = {source: 0}, {}
    for node in nodes:
        found = [interval[v] for v in node.inputs if v in interval]
        if not found:
            continue
        node_interval[node] = at = max(found)
        for v in node.outputs:
            interval[v] = index.get(v, at)
    uses = _param_uses(nodes, params, relevant)
    last = len(cuts) - 2          # the interval that ends at the loss
    spans = {}
    for p in params:
        at = [node_interval[n] for n in uses[p] if n in node_interval]
        # Its first use from the input (later uses are added by the chunked
        # backward); used by nothing that reaches the loss: the output side.
        home = min(at) if at else last
        spans[p] = (home, home)
    # A unit (a layer's parameters) first used on both sides of a cut removes it.
    units = default_units(params, spans) if units is None else \
        [list(u) for u in units] + [[p] for p in params if not any(p in u for u in units)]
    removed = set()
    for unit in units:
        lo = min(spans[p][0] for p in unit)
        hi = max(spans[p][1] for p in unit)
        removed.update(range(lo + 1, hi + 1))
        for p in unit:
            spans[p] = (lo, hi)
    keep = [i for i in range(1, last + 1) if i not in removed]
    # The interval each parameter's group starts at, after merging.
    starts = [0] + keep

    def group_of(i):
        g = 0
        while g + 1 < len(starts) and starts[g + 1] <= i:
            g += 1
        return g
    members = collections.defaultdict(list)
    for p in params:
        members[group_of(spans[p][0])].append(p)
    used = sorted(members)
    preferred = set(preferred)
    groups = []
    for j, g in enumerate(used):
        if j + 1 == len(used):
            groups.append(Group(None, members[g]))
            break
        # Any kept cut after this group's intervals and up to the next group's
        # first interval would do: the last one (the next layer's input),
        # a model's own layer output if there is one.
        first_next = starts[used[j + 1]]
        lo = starts[g + 1] if g + 1 < len(starts) else first_next
        choices = [i for i in keep if lo <= i <= first_next]
        mine = [i for i in choices if cuts[i] in preferred]
        groups.append(Group(cuts[(mine or choices)[-1]], members[g]))
    return groups
