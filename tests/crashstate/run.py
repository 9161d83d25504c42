"""Record a workload, generate its crash states, recover and check each distinct one.

    python -m tests.crashstate.run [--workload NAME]... [--every N] [--limit N] [--keep DIR]

prints, per workload: operations, barriers, crash points, states, distinct states,
states checked, violations (each with how to find it again), and the time taken.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.crashstate import check, crash, model, trace
from tests.crashstate.workloads import PREPARE, RECOVERY, WORKLOADS, Marks, Recovery, prepare

ROOT = Path(__file__).resolve().parent.parent.parent


@dataclass
class Recorded:
    name: str
    ops: list[model.Op]
    initial: model.Tree
    marks_before: list[str]  # acknowledged before the trace (a prepared queue's jobs)
    replayed_exactly: bool  # the model's final folder is the real one: the recording is whole


@dataclass
class Report:
    workload: str
    ops: int = 0
    barriers: int = 0
    points: int = 0
    states: int = 0
    distinct: int = 0
    checked: int = 0
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def line(self) -> str:
        return (
            f"{self.workload}: {self.ops} operations ({self.barriers} barriers), {self.points} crash points, "
            f"{self.states} states, {self.distinct} distinct, {self.checked} checked, "
            f"{len(self.violations)} violations, {self.seconds:.1f}s"
        )


def record(name: str, folder: Path) -> Recorded:
    """Run workload `name` under strace in `folder`; its operations on the queue."""
    queue, marks = folder / "queue", folder / "marks"
    folder.mkdir(parents=True)
    before: list[str] = []
    if name in PREPARE:
        prepare(name, queue, Marks(str(marks)))
        before = marks.read_text().splitlines()
    else:
        queue.mkdir()
    initial = model.Tree.read(queue)
    argv = [sys.executable, "-m", "tests.crashstate.workloads", name, str(queue), str(marks)]
    status = trace.record(argv, folder / "trace", env=None)
    if status != 0:
        said = (folder / "trace.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"workload {name} exited {status} under strace:\n{said}")
    recording = model.Recording(queue, marks, initial)
    ops = recording.add(trace.calls(folder / "trace"))
    exact = recording.tree.signature() == model.Tree.read(queue).signature()
    return Recorded(name, ops, initial, before, exact)


def check_states(
    recorded: Recorded, work: Path, every: int = 1, limit: int | None = None, seed: int = 0, workers: int = 1
) -> Report:
    """Check the distinct crash states of a recording (at most `limit`, spread over them),
    in `workers` processes."""
    started = time.monotonic()
    report = Report(recorded.name, len(recorded.ops), sum(op.kind == "sync" for op in recorded.ops))
    report.points = len(crash.points(recorded.ops))
    distinct: dict[tuple[object, ...], crash.CrashState] = {}
    for state in crash.states(recorded.ops, recorded.initial, random.Random(seed), every=every):
        report.states += 1
        distinct.setdefault((state.tree.signature(), tuple(state.marks(recorded.ops))), state)
    report.distinct = len(distinct)
    chosen = list(distinct.values())
    if limit is not None and len(chosen) > limit:
        chosen = random.Random(seed).sample(chosen, limit)
    for number, state in enumerate(chosen):  # all made first: one wait ages them all
        _materialize(state, work / f"state-{number}" / "queue")
    _age(work, RECOVERY.get(recorded.name, Recovery()).aged)
    shares = [list(enumerate(chosen))[index::workers] for index in range(workers)]
    context = multiprocessing.get_context("fork")  # the states are in memory: the workers inherit them
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        for found in pool.map(_check_share, [(recorded, work, share) for share in shares]):
            report.violations += found
    report.checked = len(chosen)
    report.seconds = time.monotonic() - started
    return report


def _check_share(task: tuple[Recorded, Path, list[tuple[int, crash.CrashState]]]) -> list[str]:
    recorded, work, share = task
    found: list[str] = []
    for number, state in share:
        folder = work / f"state-{number}"
        marks = recorded.marks_before + state.marks(recorded.ops)
        options = RECOVERY.get(recorded.name, Recovery()).options
        problems = check.violations(folder / "queue", marks, folder / "tools.log", options=options)
        found += [
            f"{state.model} model, point {state.point} ({state.how}), {folder.name}: {problem}" for problem in problems
        ]
        if problems:  # kept as it was found too, to recover again by hand
            _materialize(state, folder / "found")
        else:
            shutil.rmtree(folder)
    return found


def _materialize(state: crash.CrashState, queue: Path) -> None:
    check.renumber_taken(queue, state.tree.materialize(queue))


def _age(work: Path, seconds: float) -> None:
    """Wait until the states just made in `work` are `seconds` old by the file system's clock:
    a copy renews every change time, which a host back from a power cut finds as old as it
    is (one wait for all the states of a workload)."""
    if not seconds:
        return
    made = work / ".made"
    made.touch()
    now = work / ".now"
    while True:  # the file system's clock, as the recovering tools read it
        now.touch()
        if now.stat().st_mtime - made.stat().st_mtime >= seconds:
            return
        time.sleep(1.0)


def run(names: list[str], every: int, limit: int | None, keep: Path | None, workers: int = 1) -> Iterator[Report]:
    work = keep or Path(tempfile.mkdtemp(prefix="forkvisor-crash-"))
    try:
        for name in names:
            recorded = record(name, work / f"{name}-recording")
            if not recorded.replayed_exactly:
                raise RuntimeError(f"workload {name}: the replayed operations do not rebuild its final folder")
            yield check_states(recorded, work / name, every, limit, workers=workers)
    finally:
        if keep is None:
            shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", action="append", choices=sorted(WORKLOADS))
    parser.add_argument("--every", type=int, default=1, help="check every N-th crash point")
    parser.add_argument("--limit", type=int, default=None, help="check at most N distinct states per workload")
    parser.add_argument("--keep", type=Path, help="work in this (new) folder and keep it")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes checking states")
    args = parser.parse_args()
    if shutil.which("strace") is None:
        print("strace is not installed (Debian: apt-get install strace)", file=sys.stderr)
        return 2
    failed = False
    for report in run(args.workload or sorted(WORKLOADS), args.every, args.limit, args.keep, args.workers):
        print(report.line(), flush=True)
        for problem in report.violations[:50]:
            print(f"  {problem}")
        failed |= bool(report.violations)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
