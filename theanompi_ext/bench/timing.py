"""The timing protocol of the benchmarks (``bench compare`` for both projects,
``bench overlap``): modes alternated, each timed in blocks after a barrier."""
import time


def time_modes(run, modes, steps, reps, barrier, warmup=1, after_warmup=None, cpu=None):
    """Time ``run[mode]()`` calls, alternating the modes; returns {mode: [seconds]}.

    Every mode first runs ``warmup`` untimed steps (allocation, DDP's bucket
    rebuild after its first step); ``after_warmup()`` is then called if given.
    Then, ``reps`` times, each mode runs a block of ``steps`` timed steps after
    ``barrier()``; the order of the modes rotates by one each repetition. The
    same function times both projects, so they are measured the same way.
    With a dict ``cpu``, ``cpu[mode]`` becomes ``[process CPU seconds, wall
    seconds]`` summed over the mode's timed blocks.
    """
    for mode in modes:
        for _ in range(warmup):
            barrier()
            run[mode]()
    if after_warmup is not None:
        after_warmup()
    times = {m: [] for m in modes}
    if cpu is not None:
        cpu.update((m, [0.0, 0.0]) for m in modes)
    clock = time.perf_counter
    for rep in range(reps):
        k = rep % len(modes)
        for mode in tuple(modes[k:]) + tuple(modes[:k]):
            barrier()
            c0, w0 = time.process_time(), clock()
            for _ in range(steps):
                t0 = clock()
                run[mode]()
                times[mode].append(clock() - t0)
            if cpu is not None:
                cpu[mode][0] += time.process_time() - c0
                cpu[mode][1] += clock() - w0
    return times
