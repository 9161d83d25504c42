"""Many managers on one queue: does throughput rise with them, and what do they cost each other?

    python -m benchmarks.managers [--jobs N] [--rounds R] [--managers 1 2 4 8] [--trickle N] [--full] [--dir DIR]

Two scenarios, each with M managers (`forkvisor run -c 2`, each its own process):

- **burst**: N no-op jobs enqueued (`enqueue_many`) BEFORE the timed window; M
  managers started together with `--burst`; timed until the last one exits. Every
  job must end in `done/` having run once. Reported: jobs/s, its ratio to one
  manager in the same round, and per job the claims lost to another manager
  (`races`: a failed rename, the job taken between a manager's look and its try), the
  names found already gone when looked at (`gone`: an lstat, no rename) and the turns of
  all managers' loops woken by new names (`wakeups`).
- **trickle**: M idle managers; jobs enqueued one at a time, each waited for in
  `done/` before the next (the latency benchmark's pattern): per job, how many
  managers woke and how many lost the race for it. Then the managers drain.

The counts are the managers' own (`stats/manager.*.json`, docs/FORMAT.md), written as
each stops. Rounds are interleaved: the order of M alternates from one to the next.
The targets (issue 30): lost races per job < 0.2 at M=8; wakeups per enqueue that do
not grow with M; total throughput that rises with M until the cores are busy.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.tasks import noop
from jobs import Call, Queue, State

CONCURRENCY = 2  # each manager's -c
EXIT_TIMEOUT = 600.0
RACES_TARGET = 0.2  # lost claim races per job at the largest M


def _counts(queue: Path) -> dict[str, int]:
    """The managers' summed races and wakeups, from their stats files."""
    total = {"races": 0, "gone": 0, "wakeups": 0}
    for path in (queue / "stats").glob("manager.*.json"):
        found = json.loads(path.read_text())
        for name in total:
            total[name] += int(found.get(name, 0))
    return total


def _start(queue: Path, managers: int, *options: str) -> list[subprocess.Popen[bytes]]:
    command = common.manager_command(queue, "--concurrency", str(CONCURRENCY), *options)
    return [subprocess.Popen(command, cwd=common.REPO) for _ in range(managers)]


def _wait_all(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        if process.wait(EXIT_TIMEOUT) != 0:
            raise RuntimeError(f"a manager exited {process.returncode}")


def _check_all_done_once(queue: Queue, ids: list[str]) -> None:
    for job_id in ids:
        found = queue.job(job_id)
        if found.state is not State.DONE or found.attempts != 1:
            raise RuntimeError(f"job {job_id} ended {found.state.value} after {found.attempts} attempts")


def burst(root: Path, managers: int, jobs: int) -> dict[str, float]:
    """M burst managers on N pre-enqueued jobs: jobs/s, races and wakeups per job."""
    with common.scratch(root, f"managers{managers}") as folder:
        queue = Queue(folder / "queue")
        ids = queue.enqueue_many([Call(noop) for _ in range(jobs)])
        common.sync_filesystem(folder)
        started = time.perf_counter()
        _wait_all(_start(queue.path, managers, "--burst"))
        wall = time.perf_counter() - started
        _check_all_done_once(queue, ids)
        counts = _counts(queue.path)
    per_job = {name: count / jobs for name, count in counts.items()}
    return {"jobs_per_s": jobs / wall, **per_job}


def trickle(root: Path, managers: int, jobs: int) -> dict[str, float]:
    """M idle managers fed one job at a time: wakeups and lost races per job."""
    with common.scratch(root, f"trickle{managers}") as folder:
        queue = Queue(folder / "queue")
        processes = _start(queue.path, managers)
        try:
            _wait_for(lambda: len(_owners(queue.path)) == managers, "every manager registered")
            ids = []
            for _ in range(jobs):
                ids.append(job_id := queue.enqueue(noop))
                _wait_for(lambda job_id=job_id: (queue.path / "done" / job_id).exists(), "the job done")
        finally:
            for process in processes:
                process.send_signal(signal.SIGTERM)
            _wait_all(processes)
        _check_all_done_once(queue, ids)
        counts = _counts(queue.path)
    return {name: count / jobs for name, count in counts.items()}


def _owners(queue: Path) -> list[str]:
    return [name for name in os.listdir(queue / "claimed") if not name.startswith(".")]


def _wait_for(condition: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting until {what}")
        time.sleep(0.001)


def measure(root: Path, jobs: int, rounds: int, counts: list[int], trickled: int) -> dict[str, Any]:
    found: dict[str, Any] = {f"M{m}": {"burst": [], "trickle": []} for m in counts}
    for round_number in range(rounds):
        order = counts if round_number % 2 == 0 else list(reversed(counts))
        for managers in order:
            found[f"M{managers}"]["burst"].append(burst(root, managers, jobs))
            if trickled:
                found[f"M{managers}"]["trickle"].append(trickle(root, managers, trickled))
    return found


def report(found: dict[str, Any], counts: list[int], rounds: int) -> dict[str, Any]:
    """Tables and figures; ratios to one manager (the smallest M) paired by round."""
    base = found[f"M{counts[0]}"]["burst"]
    results: dict[str, Any] = {}
    rows = []
    for managers in counts:
        runs = found[f"M{managers}"]
        rates = [run["jobs_per_s"] for run in runs["burst"]]
        ratios = [run["jobs_per_s"] / first["jobs_per_s"] for run, first in zip(runs["burst"], base, strict=True)]
        races = [run["races"] for run in runs["burst"]]
        gone = [run["gone"] for run in runs["burst"]]
        wakeups = [run["wakeups"] for run in runs["burst"]]
        trickle_races = [run["races"] for run in runs["trickle"]] or [float("nan")]
        trickle_wakeups = [run["wakeups"] for run in runs["trickle"]] or [float("nan")]
        trickle_gone = [run["gone"] for run in runs["trickle"]] or [float("nan")]
        results[f"M{managers}"] = {
            "jobs_per_s": common.summary(rates),
            "ratio_to_first": common.summary(ratios),
            "races_per_job": common.summary(races),
            "gone_per_job": common.summary(gone),
            "wakeups_per_job": common.summary(wakeups),
            "trickle_races_per_job": common.summary(trickle_races),
            "trickle_wakeups_per_job": common.summary(trickle_wakeups),
            "trickle_gone_per_job": common.summary(trickle_gone),
        }
        rows.append(
            [
                f"M={managers}",
                common.spread_text(rates),
                common.spread_text(ratios, 2),
                common.spread_text(races, 2),
                common.spread_text(gone, 2),
                common.spread_text(wakeups, 2),
                common.spread_text(trickle_races, 2),
                common.spread_text(trickle_wakeups, 2),
                common.spread_text(trickle_gone, 2),
            ]
        )
    common.print_table(
        f"Many managers (each -c {CONCURRENCY}), {rounds} interleaved rounds; median [min-max]",
        [
            "managers",
            "burst jobs/s",
            f"/ M={counts[0]}",
            "races/job",
            "gone/job",
            "wakeups/job",
            "trickle races/job",
            "trickle wakeups/job",
            "trickle gone/job",
        ],
        rows,
    )
    return results


def verdicts(results: dict[str, Any], counts: list[int]) -> dict[str, bool]:
    most = f"M{counts[-1]}"
    return {
        f"races per job at M={counts[-1]} < {RACES_TARGET}": results[most]["races_per_job"]["median"] < RACES_TARGET
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_common_options(parser)
    parser.add_argument("--jobs", type=int, help="jobs per burst (default 1500, --full 3000)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 2, --full 5)")
    parser.add_argument("--managers", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--trickle", type=int, help="jobs fed one at a time per scenario (default 100; 0: none)")
    args = parser.parse_args(argv)
    root = common.choose_root(args.dir)
    common.announce("managers", root)
    jobs = args.jobs or (3000 if args.full else 1500)
    rounds = args.rounds or (5 if args.full else 2)
    trickled = 100 if args.trickle is None else args.trickle
    counts = sorted(args.managers)
    results: dict[str, Any] = report(measure(root, jobs, rounds, counts, trickled), counts, rounds)
    results["targets"] = verdicts(results, counts)
    results["jobs_per_run"], results["rounds"] = jobs, rounds
    for target, met in results["targets"].items():
        print(f"target {target}: {'met' if met else 'MISSED'}")
    common.emit_json("managers", root, results)
    return results


if __name__ == "__main__":
    main()
