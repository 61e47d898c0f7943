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
