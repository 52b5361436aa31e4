"""The timing protocol of ``bench compare``, the same for both projects."""
import time


def time_modes(run, modes, steps, reps, barrier, warmup=1):
    """Time ``run[mode]()`` calls, alternating the modes; returns {mode: [seconds]}.

    Every mode first runs ``warmup`` untimed steps (allocation, DDP's bucket
    rebuild after its first step). Then, ``reps`` times, each mode runs a
    block of ``steps`` timed steps after ``barrier()``; the order of the
    modes rotates by one each repetition. The same function times both
    projects, so they are measured the same way.
    """
    for mode in modes:
        for _ in range(warmup):
            barrier()
            run[mode]()
    times = {m: [] for m in modes}
    clock = time.perf_counter
    for rep in range(reps):
        k = rep % len(modes)
        for mode in tuple(modes[k:]) + tuple(modes[:k]):
            barrier()
            for _ in range(steps):
                t0 = clock()
                run[mode]()
                times[mode].append(clock() - t0)
    return times
