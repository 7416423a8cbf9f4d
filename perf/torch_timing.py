"""Timing for the PyTorch baselines of perf/ (torch_mha.py, torch_multiscale.py): one warm-up
run, then the median of the rest, in wall and process CPU time (user + system: on a shared
machine CPU time counts only the time the process was on a core), and the peak memory."""
import resource
import statistics
import time


def median_times(run, repeat, setup=lambda: ()):
    """Calls run(*setup()) repeat + 1 times, timing run only; the first call warms up. Returns
    the median wall and CPU seconds of the others."""
    wall, cpu = [], []
    for _ in range(repeat + 1):
        args = setup()
        t0, c0 = time.perf_counter(), time.process_time()
        run(*args)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall[1:]), statistics.median(cpu[1:])


def peak_rss_mib():
    """The most memory the process has held so far, MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
