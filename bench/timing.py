"""What the benchmarks measure time with (imported by the scripts in this
directory, which Python puts first on ``sys.path``)."""

import resource
import statistics
import time


def median_ms(func, runs):
    """Median wall time of ``runs`` calls of ``func()``, in ms."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        func()
        times.append((time.perf_counter() - start) * 1000.0)
    return statistics.median(times)


def children_cpu():
    """CPU seconds (user + system) of every ended child process so far: a
    figure that other work on a busy machine disturbs less than wall
    time."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def quartiles(values):
    """``(median, first quartile, third quartile)`` of ``values``: the
    spread printed beside a median (the extremes of fewer than four)."""
    ordered = sorted(values)
    if len(ordered) < 4:
        return statistics.median(ordered), ordered[0], ordered[-1]
    q1, _, q3 = statistics.quantiles(ordered, n=4, method='inclusive')
    return statistics.median(ordered), q1, q3
