"""Benchmarks of forkvisor against references measured in the same run.

Every figure is printed next to a reference measured in the same process,
alternately with forkvisor (interleaved rounds, median reported), because the
machines are shared and noisy: absolute numbers mean little, ratios travel.

    python -m benchmarks.run_all            quick defaults (a few minutes)
    python -m benchmarks.run_all --full     bigger N and the 1-million scale run
    python -m benchmarks.throughput         one benchmark (also enqueue, latency, scale)

Each prints a readable table, then one final line of JSON. Queues live in a
temporary folder on a real disk file system (`--dir` to choose; tmpfs is
refused because it would hide every fsync), removed afterwards.
"""
