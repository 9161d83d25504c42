"""Where a command job's turn spends its time, step by step: forkvisor against its floor.

    python -m benchmarks.steps [--jobs N] [--rounds R] [--dir DIR]

A burst manager runs N `true` jobs (plain queue, concurrency 2, enqueued before the
timed window) in this process, and so does the contained recording queue
(`references.CommandRecordingQueue` with a cgroup per run, where forkvisor's runs get
one here): the same records and the same containment, as straight-line code. Rounds
alternate which goes first. A clock (`time.perf_counter`) around each step adds up, per
job, the wall time of:

- claim: take the `ready/` entry, read `job.json`, count the run, make its folder and
  policy, log the claim (forkvisor: `queue.serving.claim`; the floor: `_claim`);
- launch: the run's cgroups made, its output opened, the vfork (the child moves into its
  cgroups before its exec, while the manager waits), the `pid` file (forkvisor: the rest of
  `Served.start_next`; the floor: the rest of its turn's start, with the renames that put
  the counts in place);
- end, cgroups: the run's cgroups read (CPU, memory peak, OOM kills) and removed;
- end, records: `outcome.json`, the result, the event, the move to `done/` (forkvisor:
  `Outcomes.harvest`; the floor: the rest of its turn's end);
- the turn: all of it, wall time per job.

Not a throughput figure (`benchmarks.commands` is): which step holds the difference. The
clocks cost about a microsecond per step. docs/PERFORMANCE.md ("A command job's cost beyond
its floor") has the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks import common, references
from jobs import Queue, command_call
from supervisor import Manager
from supervisor.containment import CgroupRun

STEPS = ("claim", "launch", "end, cgroups", "end, records", "the turn")


class Clocks:
    """Seconds spent in each step, added up; `inside` names, for a step, the step whose calls
    it makes (its own time is the rest)."""

    def __init__(self, inside: dict[str, str]) -> None:
        self.spent: Counter[str] = Counter()
        self.inside = inside

    def timed(self, step: str, action: Callable[..., Any]) -> Callable[..., Any]:
        """`action`, adding the time each call takes to `step`."""

        def clocked(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return action(*args, **kwargs)
            finally:
                self.spent[step] += time.perf_counter() - began

        return clocked

    def per_job(self, jobs: int) -> dict[str, float]:
        """Microseconds per job of each step, less the step inside it."""
        found = {step: self.spent[step] / jobs * 1e6 for step in STEPS}
        for outer, inner in self.inside.items():
            found[outer] -= found[inner]
        return found


@contextlib.contextmanager
def _clocked_cgroups(clocks: Clocks) -> Iterator[None]:
    """Time forkvisor's reads and removals of a run's cgroups (`CgroupRun.cost`, `remove`)."""
    cost, remove = CgroupRun.cost, CgroupRun.remove
    CgroupRun.cost = clocks.timed("end, cgroups", cost)
    CgroupRun.remove = clocks.timed("end, cgroups", remove)
    try:
        yield
    finally:
        CgroupRun.cost, CgroupRun.remove = cost, remove


def forkvisor(folder: Path, jobs: int) -> dict[str, float]:
    queue = Queue(folder, durable=False)
    queue.enqueue_many([command_call([references.TRUE])] * jobs)
    common.sync_filesystem(folder)
    manager = Manager(queue, concurrency=2)
    clocks = Clocks({"launch": "claim"})  # (its runs' cgroups are read and removed as the child is reaped)
    for served in manager.served:
        serving = served.queue.serving
        serving.claim = clocks.timed("claim", serving.claim)
        served.start_next = clocks.timed("launch", served.start_next)
        served.outcomes.harvest = clocks.timed("end, records", served.outcomes.harvest)
    with _clocked_cgroups(clocks):
        clocks.timed("the turn", lambda: manager.run(burst=True))()
    if (done := queue.counts()["done"]) != jobs:
        raise SystemExit(f"forkvisor finished {done} of {jobs} command jobs")
    return clocks.per_job(jobs)


def floor(folder: Path, jobs: int, cgroups: references.RunCgroups | None) -> dict[str, float]:
    queue = references.CommandRecordingQueue(folder, cgroups)
    queue.fill(jobs)
    common.sync_filesystem(folder)
    clocks = Clocks({"launch": "claim", "end, records": "end, cgroups"})
    queue._claim = clocks.timed("claim", queue._claim)
    queue._start_turn = clocks.timed("launch", queue._start_turn)
    queue._end_turn = clocks.timed("end, records", queue._end_turn)
    if cgroups is not None:
        cgroups.end = clocks.timed("end, cgroups", cgroups.end)
    try:
        clocks.timed("the turn", lambda: queue.run(2, durable=False))()
    finally:
        if cgroups is not None:
            del cgroups.end  # (this run's clock: the class's method again)
    if (done := len(list(queue.done.iterdir()))) != jobs:
        raise SystemExit(f"the recording queue finished {done} of {jobs} command jobs")
    return clocks.per_job(jobs)


def measure(root: Path, jobs: int, rounds: int) -> dict[str, dict[str, list[float]]]:
    found: dict[str, dict[str, list[float]]] = {"forkvisor": {}, "floor": {}}
    with references.RunCgroups.here() as cgroups, common.removal_deferred():
        ways: list[tuple[str, Callable[[Path], dict[str, float]]]] = [
            ("forkvisor", lambda folder: forkvisor(folder, jobs)),
            ("floor", lambda folder: floor(folder, jobs, cgroups)),
        ]
        for round_number in range(rounds):
            for who, way in ways if round_number % 2 == 0 else reversed(ways):
                with common.scratch(root, f"steps-{who}") as folder:
                    for step, micros in way(folder / "q").items():
                        found[who].setdefault(step, []).append(micros)
    return found


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_common_options(parser)
    parser.add_argument("--jobs", type=int, help="command jobs per run (default 1000, --full 3000)")
    parser.add_argument("--rounds", type=int, help="alternating rounds (default 3, --full 7)")
    args = parser.parse_args(argv)
    root = common.choose_root(args.dir)
    common.announce("steps", root)
    jobs = args.jobs or (3000 if args.full else 1000)
    rounds = args.rounds or (7 if args.full else 3)
    found = measure(root, jobs, rounds)
    common.print_table(
        f"A command job's turn, step by step: {jobs} `true` jobs per run, c2, plain, {rounds} rounds "
        "alternating; wall us per job, median [min-max]",
        ["step", "forkvisor", "floor (the contained recording queue)", "forkvisor - floor"],
        [
            [
                step,
                common.spread_text(found["forkvisor"][step]),
                common.spread_text(found["floor"][step]),
                f"{common.median(found['forkvisor'][step]) - common.median(found['floor'][step]):+.0f}",
            ]
            for step in STEPS
        ],
    )
    results: dict[str, Any] = {
        who: {step: common.summary(values) for step, values in steps.items()} for who, steps in found.items()
    }
    results["jobs_per_run"], results["rounds"] = jobs, rounds
    common.emit_json("steps", root, results)
    return results


if __name__ == "__main__":
    main()
