"""One job's path through the house: the modules and the calls between them on each leg.

    python -m benchmarks.legs [--jobs N]

A burst manager runs N no-op jobs on a fresh durable queue, in this process, with a
profile hook on for two legs of each job, on the manager's side:

- claim and fork: `Served.start_next`, from the claim to the child forked and recorded;
- harvest: `Outcomes.harvest`, from the child's exit status to the job in `done/`.

Counted per leg (the median over the jobs): the modules of `jobs` and `supervisor` that
run, the calls from one of those modules into another (a module's calls within itself
are its own business), and the crossings between the two packages, each way. Not a
speed measurement: how far one job's path spreads over the code (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from benchmarks.tasks import noop, registry
from jobs import Call, Queue
from supervisor import Manager
from supervisor.outcomes import Outcomes
from supervisor.served import Served

PACKAGES = ("jobs", "supervisor")


@dataclass
class Leg:
    """What one run of a leg touched."""

    modules: set[str] = field(default_factory=set)
    calls: int = 0  # calls from one of our modules into another
    crossings: Counter[str] = field(default_factory=Counter)  # "supervisor->jobs", "jobs->supervisor"


def _module(frame: FrameType | None) -> str | None:
    name = frame.f_globals.get("__name__", "") if frame is not None else ""
    return name if name.split(".")[0] in PACKAGES else None


def _traced(method: Callable[..., Any], legs: list[Leg]) -> Callable[..., Any]:
    """`method`, profiled: each call adds a Leg to `legs` (kept if the call did its work)."""

    def profiled(*args: Any, **kwargs: Any) -> Any:
        leg = Leg()

        def hook(frame: FrameType, event: str, _arg: object) -> None:
            if event != "call":
                return
            callee, caller = _module(frame), _module(frame.f_back)
            if callee is None:
                return
            leg.modules.add(callee)
            if caller is not None and caller != callee:
                leg.calls += 1
                if caller.split(".")[0] != callee.split(".")[0]:
                    leg.crossings[f"{caller.split('.')[0]}->{callee.split('.')[0]}"] += 1

        sys.setprofile(hook)
        try:
            result = method(*args, **kwargs)
        finally:
            sys.setprofile(None)
        if result is not False:  # start_next says False when no job was there to start
            legs.append(leg)
        return result

    return profiled


def measure(jobs: int, folder: Path) -> dict[str, list[Leg]]:
    """Run `jobs` no-op jobs with both legs traced; each leg's runs."""
    queue = Queue(folder / "queue", durable=True)
    queue.enqueue_many([Call(noop)] * jobs)
    legs: dict[str, list[Leg]] = {"claim and fork": [], "harvest": []}
    start_next, harvest = Served.start_next, Outcomes.harvest
    Served.start_next = _traced(start_next, legs["claim and fork"])  # type: ignore[method-assign]
    Outcomes.harvest = _traced(harvest, legs["harvest"])  # type: ignore[method-assign]
    try:
        Manager(queue, registry=registry, concurrency=1).run(burst=True)
    finally:
        Served.start_next, Outcomes.harvest = start_next, harvest  # type: ignore[method-assign]
    return legs


def report(legs: dict[str, list[Leg]]) -> list[str]:
    lines = []
    for name, runs in legs.items():
        modules = statistics.median(len(run.modules) for run in runs)
        calls = statistics.median(run.calls for run in runs)
        down = statistics.median(run.crossings["supervisor->jobs"] for run in runs)
        up = statistics.median(run.crossings["jobs->supervisor"] for run in runs)
        lines.append(
            f"{name}: {modules:g} modules, {calls:g} calls between modules, "
            f"supervisor->jobs {down:g}, jobs->supervisor {up:g} (median of {len(runs)} jobs)"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="forkvisor-legs-") as folder:
        for line in report(measure(args.jobs, Path(folder))):
            print(line)


if __name__ == "__main__":
    main()
