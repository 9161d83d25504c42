"""Work that plans itself: what 10,000 schedules and 100,000 waiting jobs cost claims and completions.

    python -m benchmarks.planning [--schedules 10000] [--waiting 100000] [--jobs 2000] [--rounds 3] [--dir DIR]

Two queues: one empty, one with S schedules (`every 1h`, kept in `schedules/`) and W
jobs in `waiting/` (each depending on one job scheduled far ahead, as docs/FORMAT.md
describes them). On each, a sweeper process loops as a manager's does (a sweep, then
the schedules' firer; measuring starts after its first pass) while this process
enqueues N jobs, then claims, completes each and settles its dependents (what a
manager does per job, without the fork). Rounds alternate between the queues.
Reported: claim+complete+settle rates, loaded/empty, and the firer's own figures:
its first pass over S schedules, a pass with none due; and what settling costs a
manager after each end of a fan-in's parents.
Durable (fsyncs), as users run it.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import time
from pathlib import Path
from typing import Any

from benchmarks import common
from jobs import Call, Owner, Queue, Schedule, Timing, new_job_id, unknown_liveness

SWEEP_EVERY = 0.5  # seconds; a manager's default is a sixth of the lease, at most 5 s


def fabricate(queue: Queue, schedules: int, waiting: int) -> None:
    """S schedules and W waiting jobs, all waiting for one job due in a year."""
    for n in range(schedules):
        queue.add_schedule(
            Schedule(name=f"s{n}", timing=Timing("every 1h"), function="bench.noop", created=time.time())
        )
    gate = queue.with_options(delay=365 * 86400).enqueue("bench.noop")
    edges = queue.path / "edges" / gate
    edges.mkdir(mode=0o700)
    spec = json.dumps({"function": "bench.noop", "depends_on": [gate]})
    for _ in range(waiting):
        job_id = new_job_id()
        folder = queue.path / "waiting" / job_id
        folder.mkdir(mode=0o700)
        (folder / "job.json").write_text(spec)
        (edges / job_id).touch()


def sweeper(path: Path, started: Any, stop: Any) -> None:
    """A manager's sweeper loop, reduced to what it does to the queue; `started` is set after
    its first pass (which reads every schedule: a manager's start, measured apart)."""
    queue = Queue(path, create=False)
    planner = queue.serving.planner()
    while not stop.is_set():
        queue.serving.sweep(queue.serving.filesystem_now(), unknown_liveness)
        planner.fire(time.time(), time.monotonic())
        started.set()
        stop.wait(SWEEP_EVERY)


def one_round(queue: Queue, jobs: int) -> float:
    """Enqueue `jobs`, then claim, complete and settle each; the rate of the second part."""
    for n in range(jobs):
        queue.enqueue("bench.noop", n)
    owner = Owner.new()
    queue.serving.register_owner(owner)
    started = time.perf_counter()
    for _ in range(jobs):
        claim = queue.serving.claim(owner.name)
        if claim is None:
            raise RuntimeError("the queue ran dry: a bug in the benchmark")
        queue.serving.complete(claim)
        queue.serving.settle_dependents(claim.job_id)
    rate = jobs / (time.perf_counter() - started)
    queue.serving.retire_owner(owner.name)
    return rate


def fan_in_cost(root: Path, parents: int) -> float:
    """Milliseconds a manager spends settling after each end of a fan-in's `parents`."""
    queue = Queue(root / "fan-in")
    ids, _ = queue.fan_in([Call("bench.noop", (n,)) for n in range(parents)], Call("bench.noop"))
    owner = Owner.new()
    queue.serving.register_owner(owner)
    spent = 0.0
    for _ in ids:
        claim = queue.serving.claim(owner.name)
        if claim is None:
            raise RuntimeError("the fan-in ran dry: a bug in the benchmark")
        queue.serving.complete(claim)
        started = time.perf_counter()
        queue.serving.settle_dependents(claim.job_id)
        spent += time.perf_counter() - started
    return spent / len(ids) * 1000


def firer_figures(queue: Queue) -> dict[str, float]:
    """The firer's first pass (reads every schedule) and a pass with nothing due."""
    planner = queue.serving.planner()
    started = time.perf_counter()
    planner.fire(time.time(), time.monotonic())
    first = time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(100):
        planner.fire(time.time(), time.monotonic())
    return {"first pass s": first, "idle pass ms": (time.perf_counter() - started) * 10}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_common_options(parser)
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--waiting", type=int, default=100_000)
    parser.add_argument("--jobs", type=int, default=2000, help="jobs claimed and completed per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fan-in", type=int, default=500, help="parents of the fan-in whose settling is timed")
    args = parser.parse_args(argv)
    root = common.choose_root(args.dir)
    common.announce("planning", root)
    loaded_name = f"{args.schedules:,} schedules, {args.waiting:,} waiting"
    with common.scratch(root, "planning") as scratch:
        queues = {"empty": Queue(scratch / "empty"), loaded_name: Queue(scratch / "loaded")}
        started = time.perf_counter()
        fabricate(queues[loaded_name], args.schedules, args.waiting)
        os.sync()  # the fabrication's writeback would weigh on what follows
        print(f"fabricated in {time.perf_counter() - started:.1f}s", flush=True)
        firer = firer_figures(queues[loaded_name])
        rates: dict[str, list[float]] = {name: [] for name in queues}
        context = multiprocessing.get_context("fork")
        for number in range(args.rounds):
            for name in list(queues) if number % 2 == 0 else list(reversed(queues)):
                begun, stop = context.Event(), context.Event()
                child = context.Process(target=sweeper, args=(queues[name].path, begun, stop))
                child.start()
                try:
                    begun.wait(120)
                    rates[name].append(one_round(queues[name], args.jobs))
                finally:
                    stop.set()
                    child.join()
        counts = queues[loaded_name].counts()
        fan_in = fan_in_cost(scratch, args.fan_in)
    empty, loaded = rates["empty"], rates[loaded_name]
    ratio = common.median(loaded) / common.median(empty)
    common.print_table(
        f"claim + complete + settle, durable, jobs/s (median [min-max] of {args.rounds} rounds of {args.jobs:,}), "
        "a sweeper looping beside",
        ["queue", "jobs/s", "loaded/empty"],
        [["empty", common.spread_text(empty), "1.00"], [loaded_name, common.spread_text(loaded), f"{ratio:.2f}"]],
    )
    print(
        f"firer over {args.schedules:,} schedules: first pass {firer['first pass s']:.2f}s, "
        f"a pass with none due {firer['idle pass ms']:.3f} ms; waiting at the end: {counts['waiting']:,}"
    )
    print(f"a fan-in of {args.fan_in:,}: settling after each parent's end {fan_in:.2f} ms")
    results = {
        "schedules": args.schedules,
        "waiting": args.waiting,
        "jobs": args.jobs,
        "rates": {name: common.summary(values) for name, values in rates.items()},
        "loaded/empty": ratio,
        "firer": firer,
        "fan_in_settle_ms": fan_in,
    }
    common.emit_json("planning", root, results)
    return results


if __name__ == "__main__":
    main()
