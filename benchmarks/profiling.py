"""Profile one forkvisor scenario: the code a benchmark times, alone, for a profiler.

    python -m benchmarks.profiling SCENARIO [options] [--cprofile]
    py-spy record -r 1000 -f raw -o out.txt -- python -m benchmarks.profiling SCENARIO [options]
    python -m benchmarks.profiling summarize out.txt

Scenarios (each prints its rate; the profiled part runs inside `profiled_region`):

    throughput  Manager(...).run(burst=True) on a queue pre-filled with N no-op jobs
    enqueue     N single `enqueue` calls (or `enqueue_many` batches with --many)
    claim       Queue.claim + Queue.complete, no fork, with --queued jobs in ready/
    latency     an idle Manager.run() here, fed one job at a time by a forked child
                that waits for each to reach done/ (profile with `py-spy --idle`)

`--cprofile` wraps the region in the standard library's profiler and prints
the top functions; deterministic profiling inflates Python-heavy code, so
prefer a sampling profiler (py-spy, pyinstrument) for shares of time. It is
not a dependency: `pip install py-spy` into the venv to use it. `summarize`
reads py-spy's raw (collapsed) output and prints each function's share of
the samples under `profiled_region`, inclusive and self.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import os
import pstats
import re
import select
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks import common
from benchmarks.scale import fabricate
from benchmarks.tasks import noop, registry, stamp
from jobs import Call, Owner, Queue
from supervisor import Manager
from supervisor.watch import Watch


def profiled_region(action: Callable[[], object], use_cprofile: bool) -> float:
    """Run `action` (under cProfile if asked); return its wall time."""
    profiler = cProfile.Profile() if use_cprofile else None
    started = time.perf_counter()
    if profiler is not None:
        profiler.runcall(action)
    else:
        action()
    seconds = time.perf_counter() - started
    if profiler is not None:
        stats = pstats.Stats(profiler, stream=sys.stdout).strip_dirs()
        stats.sort_stats("cumulative").print_stats(30)
        stats.sort_stats("tottime").print_stats(20)
    return seconds


def throughput(folder: Path, args: argparse.Namespace) -> tuple[int, Callable[[], object]]:
    queue = Queue(folder, durable=args.durable)
    queue.enqueue_many([Call(noop)] * args.jobs)
    common.sync_filesystem(folder)
    manager = Manager(queue, registry, concurrency=args.concurrency)
    return args.jobs, lambda: manager.run(burst=True)


def enqueue(folder: Path, args: argparse.Namespace) -> tuple[int, Callable[[], object]]:
    queue = Queue(folder, durable=args.durable)
    common.sync_filesystem(folder)

    def run() -> None:
        if args.many:
            for _ in range(args.jobs // 1000):
                queue.enqueue_many([Call(noop)] * 1000)
        else:
            for _ in range(args.jobs):
                queue.enqueue(noop)

    return args.jobs, run


def claim(folder: Path, args: argparse.Namespace) -> tuple[int, Callable[[], object]]:
    Queue(folder, durable=args.durable)
    fabricate(folder / "ready", args.queued + args.jobs, ready=True)
    common.sync_filesystem(folder)
    queue = Queue(folder, create=False, durable=args.durable)
    owner = Owner.new()
    queue.serving.register_owner(owner)

    def run() -> None:
        for _ in range(args.jobs):
            found = queue.serving.claim(owner.name)
            assert found is not None
            queue.serving.complete(found)

    return args.jobs, run


def latency(folder: Path, args: argparse.Namespace) -> tuple[int, Callable[[], object]]:
    queue = Queue(folder, durable=args.durable)
    manager = Manager(queue, registry, concurrency=args.concurrency)
    feeder = os.fork()
    if feeder == 0:
        code = 1
        try:
            _feed(queue, args.jobs, os.getppid())
            code = 0
        finally:
            os._exit(code)

    def run() -> None:
        manager.run()
        os.waitpid(feeder, 0)

    return args.jobs, run


def _feed(queue: Queue, jobs: int, manager_pid: int) -> None:
    """Enqueue one job at a time, wait for it in done/, pause 5 ms; then ask the manager to drain."""
    time.sleep(0.5)  # let the manager start
    watch = Watch([queue.path / "done"])
    for _ in range(jobs):
        queue.enqueue(stamp)
        select.select([watch.fd], [], [], 30)
        list(watch.read())
        time.sleep(0.005)
    os.kill(manager_pid, signal.SIGTERM)


SCENARIOS = {"throughput": throughput, "enqueue": enqueue, "claim": claim, "latency": latency}


def summarize(path: Path, top: int) -> None:
    """Shares of py-spy samples under `profiled_region`, inclusive and self."""
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [re.sub(r":\d+\)$", ")", frame) for frame in stack.split(";")]
        start = next((i for i, frame in enumerate(frames) if frame.startswith("profiled_region ")), None)
        if start is None:
            continue
        frames, samples = frames[start + 1 :], int(count)
        total += samples
        for frame in set(frames):
            inclusive[frame] += samples
        if frames:
            own[frames[-1]] += samples
    print(f"{total} samples under profiled_region")
    for title, counter in (("inclusive", inclusive), ("self", own)):
        common.print_table(
            title, ["share", "function"], [[f"{100 * n / total:.1f}%", f] for f, n in counter.most_common(top)]
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenario", choices=[*SCENARIOS, "summarize"])
    parser.add_argument("raw", nargs="?", type=Path, help="summarize: py-spy's raw output")
    parser.add_argument("--dir", type=Path)
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--durable", action="store_true")
    parser.add_argument("--many", action="store_true", help="enqueue: enqueue_many in batches of 1000")
    parser.add_argument("--queued", type=int, default=100_000, help="claim: jobs left in ready/")
    parser.add_argument("--cprofile", action="store_true")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args(argv)
    if args.scenario == "summarize":
        summarize(args.raw, args.top)
        return
    with common.scratch(common.choose_root(args.dir), f"profile-{args.scenario}") as scratch:
        jobs, action = SCENARIOS[args.scenario](scratch / "queue", args)
        seconds = profiled_region(action, args.cprofile)
    print(f"{args.scenario}: {jobs} jobs in {seconds:.2f}s, {jobs / seconds:,.0f} jobs/s", file=sys.stderr)


if __name__ == "__main__":
    main()
