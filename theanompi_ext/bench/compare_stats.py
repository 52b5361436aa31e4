"""The numbers of ``bench compare``: per-step times of the jobs into result rows.

Every figure is a median over paired steps with a standard error
(:func:`median_and_error`, or a bootstrap where a ratio of medians needs
one): :func:`make_row` per system (overhead, hidden fraction),
:func:`bound_excess` and :func:`wire_ratio` for our overlapped and 16-bit
systems, :func:`summarize` for all systems of one setting.
"""
import numpy as np

#: The least exchange cost (serial - compute, as a share of the compute step)
#: for which a hidden fraction is reported: below it a shift of the step by
#: 1% of compute (what another job's burst or a launch's placement moves it
#: by on a shared 2-core machine) moves the fraction by more than 0.2.
MIN_COST = 0.05

from .compare_systems import DDP_HOOK_WIRE, SYSTEMS, WIRE_SUFFIX, ddp_system, ours_modes


def median_and_error(values):
    """Median of ``values`` and an estimate of its standard error.

    The error is 1.2533 sigma / sqrt(n), the median's standard error for
    normal data, with sigma = 1.4826 MAD (a robust standard deviation), so
    that a few steps stalled by another job on a shared machine do not
    inflate it.
    """
    v = np.asarray(values, float)
    med = float(np.median(v))
    sigma = 1.4826 * float(np.median(np.abs(v - med)))
    return med, 1.2533 * sigma / np.sqrt(len(v))


def job_steps(per_rank):
    """Per-step seconds of the job: step k ends when its slower rank ends.

    ``per_rank`` holds each rank's per-step seconds. With one step per
    block (the default) every step starts at a barrier, so the k-th steps
    of the ranks ran side by side, in the compute-only modes too: their
    maximum is what a synchronous step would have waited for.
    """
    return np.max(np.asarray(per_rank, float), axis=0)


def make_row(system, model, network, compute, step, serial, **extra):
    """One result object with the derived ratios (see the module docstring).

    ``compute``, ``step`` and ``serial`` hold each rank's per-step seconds.
    Entry k of every mode comes from repetition k of :func:`.timing.time_modes`, so
    the modes' k-th steps ran back to back; the ratios are medians of these
    paired figures, relative to the compute step of the same repetition,
    which cancels slow drifts of the machine's load::

        comm_overhead   = median_k(step_k / compute_k) - 1
        cost            = median_k((serial_k - compute_k) / compute_k)
        hidden_fraction = median_k((serial_k - step_k) / compute_k) / cost

    ``hidden_fraction`` is None when ``cost`` (the exchange's cost, as a
    fraction of the compute step) is under :data:`MIN_COST` or under twice
    its standard error (:func:`cost_measurable`); ``hidden_fraction_err`` is
    its bootstrap standard error
    (:func:`bootstrap_error`). The
    row also holds the medians of the three step times (``*_s``), standard
    errors (``*_err``, see :func:`median_and_error`) and the per-rank,
    per-step times (``times_s``).
    """
    c, t, s = [job_steps(v) for v in (compute, step, serial)]
    n = min(len(c), len(t), len(s))
    c, t, s = c[:n], t[:n], s[:n]
    (mc, ec), (mt, et), (ms, es) = [median_and_error(v) for v in (c, t, s)]
    overhead, overhead_err = median_and_error(t / c - 1.0)
    cost, cost_err = median_and_error((s - c) / c)
    hidden, hidden_err = None, None
    if cost_measurable(cost, cost_err):
        hidden = paired_hidden_fraction(c, t, s)
        hidden_err = bootstrap_error(paired_hidden_fraction, (c, t, s))
    row = dict(system=system, model=model, network=network, compute_s=mc, step_s=mt,
               comm_overhead=overhead, hidden_fraction=hidden,
               hidden_fraction_err=hidden_err, serial_s=ms,
               comm_overhead_err=overhead_err, comm_cost=cost, comm_cost_err=cost_err,
               compute_err_s=ec, step_err_s=et, serial_err_s=es,
               times_s=dict(compute=compute, step=step, serial=serial))
    row.update(extra)
    return row


def cost_measurable(cost, cost_err):
    """Whether an exchange cost (share of compute, with its standard error) is
    large enough for a hidden fraction: over :data:`MIN_COST` and over twice
    its error."""
    return cost > max(MIN_COST, 2.0 * cost_err)


def launch_fractions(jobs, step_mode, serial_mode):
    """The hidden fraction of each job (launch) alone, None where its cost is not
    :func:`cost_measurable`: ``jobs`` are job results (``{mode: [[per-step
    seconds] of each rank]}``) with ``'compute'``, ``step_mode`` and
    ``serial_mode``."""
    out = []
    for job in jobs:
        c, t, s = [job_steps(job[m]) for m in ('compute', step_mode, serial_mode)]
        n = min(len(c), len(t), len(s))
        c, t, s = c[:n], t[:n], s[:n]
        cost, cost_err = median_and_error((s - c) / c)
        out.append(paired_hidden_fraction(c, t, s) if cost_measurable(cost, cost_err)
                   else None)
    return out


def paired_hidden_fraction(c, t, s):
    """median_k((s_k - t_k) / c_k) / median_k((s_k - c_k) / c_k) of paired step
    times (compute, step, serial); None when the cost's median is not positive."""
    cost = float(np.median((s - c) / c))
    return float(np.median((s - t) / c)) / cost if cost > 0 else None


def bootstrap_error(stat, arrays, n_boot=400, seed=0):
    """Standard deviation of ``stat`` over ``n_boot`` resamples of the paired
    entries of ``arrays`` (drawn with replacement, the same indices for every
    array; a fixed seed makes it reproducible). Resamples where ``stat`` is
    None are left out; None when fewer than half remain."""
    n = len(arrays[0])
    rng = np.random.RandomState(seed)
    vals = []
    for _ in range(n_boot):
        idx = rng.randint(0, n, n)
        v = stat(*[a[idx] for a in arrays])
        if v is not None:
            vals.append(v)
    return float(np.std(vals)) if len(vals) >= n_boot // 2 else None


def summarize(model, network, spec, ours, theirs):
    """Result rows of one setting from the jobs' per-step times.

    ``ours`` is a list of our jobs' results, ``theirs`` maps ``(bucket cap,
    hook)`` (or a bare cap: no hook) to the list of DDP jobs' results with it.
    """
    common = dict(batch=spec['batch'], ranks=None, threads=spec['threads'])
    rows = _our_rows(model, network, spec, ours, common) if ours else []
    keyed = [(k if isinstance(k, tuple) else (k, 'none'), jobs) for k, jobs in theirs.items()]
    for (cap, hook), jobs in sorted(keyed, key=lambda kj: (kj[0][0], kj[0][1] != 'none')):
        if not jobs:
            continue
        t = {m: _all(jobs, m) for m in ('compute', 'serial', 'full', 'allreduce')}
        row = make_row(
            ddp_system(cap, hook), model, network, t['compute'], t['full'], t['serial'],
            **dict(common, ranks=len(t['full']), grad_bytes=jobs[0]['grad_bytes'],
                   params=jobs[0]['params'], allreduce_s=_median(t['allreduce']),
                   steps_measured=len(t['full'][0]), torch=jobs[0]['torch'],
                   ddp_bucket_cap_mb=cap, ddp_comm_hook=hook, wire_dtype=DDP_HOOK_WIRE[hook],
                   hook_check=jobs[0].get('hook_check')))
        row['times_s']['allreduce'] = t['allreduce']
        row['bound_excess'], row['bound_excess_err'] = bound_excess(row)
        row['hidden_fraction_launches'] = launch_fractions(jobs, 'full', 'serial')
        row['cpu_per_wall'] = _cpu_per_wall(jobs, {'compute': 'compute', 'step': 'full',
                                                   'serial': 'serial'})
        rows.append(row)
    return rows


def _our_rows(model, network, spec, ours, common):
    """Our two systems per wire dtype, all paired against the shared compute step;
    overlapped ones carry :func:`bound_excess`, 16-bit ones :func:`wire_ratio`."""
    wires = spec.get('wire_dtypes', ['float32'])
    t = {m: _all(ours, m) for m in ours_modes(wires)}
    base = dict(common, ranks=ours[0]['ranks'], grad_bytes=ours[0]['grad_bytes'],
                params=ours[0]['params'], compute_chunked_s=_median(t['compute_chunked']),
                buckets=ours[0]['buckets'], chunks=ours[0]['chunks'],
                mpi_env=ours[0].get('mpi_env', {}), topology=ours[0].get('topology'))
    rows, by_wire = [], {}
    for wire in wires:
        sfx = WIRE_SUFFIX[wire]
        extra = dict(base, wire_dtype=wire, allreduce_s=_median(t['allreduce' + sfx]),
                     steps_measured=len(t['overlap' + sfx][0]))
        for system, mode in ((SYSTEMS[0], 'overlap'), (SYSTEMS[1], 'serial')):
            row = make_row(system + sfx, model, network, t['compute'], t[mode + sfx],
                           t['serial' + sfx], **extra)
            row['times_s']['allreduce'] = t['allreduce' + sfx]
            row['hidden_fraction_launches'] = launch_fractions(ours, mode + sfx,
                                                               'serial' + sfx)
            row['cpu_per_wall'] = _cpu_per_wall(ours, {'compute': 'compute',
                                                       'step': mode + sfx,
                                                       'serial': 'serial' + sfx})
            rows.append(row)
        overlapped = rows[-2]
        overlapped['bound_excess'], overlapped['bound_excess_err'] = bound_excess(overlapped)
        by_wire[wire] = overlapped
    for wire, row in by_wire.items():
        if wire != 'float32' and 'float32' in by_wire:
            ratio = wire_ratio(row, by_wire['float32'])
            for r in rows:
                if r.get('wire_dtype') == wire:
                    r['wire_time_ratio'], r['wire_time_ratio_err'] = ratio
    return rows


def _paired(row, modes):
    """The per-step times (slower rank) of ``modes`` of ``row``, cut to a common length."""
    v = [job_steps(row['times_s'][m]) for m in modes]
    n = min(len(x) for x in v)
    return [x[:n] for x in v]


def wire_ratio(row16, row32):
    """(median, error) of the exchange time ratio 16-bit / float32, repetition by
    repetition: median_k(allreduce16_k / allreduce32_k) of the two rows'
    ``times_s['allreduce']`` (both from the same jobs, entry k of the same
    repetition, so a drift of the load cancels)."""
    a = job_steps(row16['times_s']['allreduce'])
    b = job_steps(row32['times_s']['allreduce'])
    n = min(len(a), len(b))
    return median_and_error(a[:n] / b[:n])


def bound_excess(row):
    """(median, error) of how far a step is above max(compute, communication):
    median_k(step_k / max(compute_k, allreduce_k)) - 1, the three times of
    repetition k paired as for the overhead; the communication time is the
    system's own allreduce of the whole gradient alone."""
    c, t, a = _paired(row, ('compute', 'step', 'allreduce'))
    return median_and_error(t / np.maximum(c, a) - 1.0)


def _cpu_per_wall(jobs, modes):
    """``{name: median over jobs and ranks of CPU / wall}`` for ``modes`` (name ->
    the jobs' mode), from each job's ``cpu_per_wall`` (absent in older jobs: {})."""
    if not all('cpu_per_wall' in j for j in jobs):
        return {}
    return {name: float(np.median(sum((j['cpu_per_wall'][m] for j in jobs), [])))
            for name, m in modes.items()}


def _median(per_rank):
    return float(np.median(job_steps(per_rank)))


def _all(results, mode):
    """Each rank's per-step times of ``mode``, over every job."""
    return [sum((r[mode][k] for r in results), []) for k in range(len(results[0][mode]))]


__all__ = ['MIN_COST', 'bootstrap_error', 'bound_excess', 'cost_measurable', 'job_steps',
           'launch_fractions', 'make_row', 'median_and_error', 'paired_hidden_fraction',
           'summarize', 'wire_ratio']
