"""Enqueue: `Queue.enqueue` one job at a time and `Queue.enqueue_many` in batches,
durable and not, against docs/FORMAT.md's submission recipe done by hand.

    python -m benchmarks.enqueue [--jobs N] [--batch B] [--rounds R] [--full] [--dir DIR]

References (`benchmarks.references`): `minimal_submit` (mkdir tmp/ID, write
job.json, rename to ready/100.ID; durable: fsync the file, tmp/ID and ready/,
the same fsyncs as forkvisor's durable enqueue) and `minimal_submit_many`
(stage a batch, one syncfs, rename all, fsync ready/). Each run gets a fresh
queue, and the file system is synced before it, so no run pays for another's
writeback. Rounds interleave forkvisor and the reference, alternating order.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import common, references
from benchmarks.tasks import noop
from jobs import Call, Queue

TARGETS = {"single durable": 1_500.0, "single plain": 10_000.0, "many durable": 20_000.0}


def forkvisor_single(folder: Path, jobs: int, durable: bool, batch: int) -> float:
    queue = Queue(folder, durable=durable)
    common.sync_filesystem(folder)

    def enqueue_all() -> None:
        for _ in range(jobs):
            queue.enqueue(noop)

    return jobs / common.timed(enqueue_all).wall


def forkvisor_many(folder: Path, jobs: int, durable: bool, batch: int) -> float:
    queue = Queue(folder, durable=durable)
    common.sync_filesystem(folder)
    batches, size = batching(jobs, batch)
    calls = [Call(noop)] * size

    def enqueue_all() -> None:
        for _ in range(batches):
            queue.enqueue_many(calls)

    return batches * size / common.timed(enqueue_all).wall


def batching(jobs: int, batch: int) -> tuple[int, int]:
    """(number of batches, jobs per batch): whole batches of at most `batch` jobs."""
    size = max(1, min(batch, jobs))
    return max(1, jobs // size), size


def reference_single(folder: Path, jobs: int, durable: bool, batch: int) -> float:
    _make_minimal_queue(folder)

    def submit_all() -> None:
        for _ in range(jobs):
            references.minimal_submit(folder, durable)

    return jobs / common.timed(submit_all).wall


def reference_many(folder: Path, jobs: int, durable: bool, batch: int) -> float:
    _make_minimal_queue(folder)
    batches, size = batching(jobs, batch)

    def submit_all() -> None:
        for _ in range(batches):
            references.minimal_submit_many(folder, size, durable)

    return batches * size / common.timed(submit_all).wall


def _make_minimal_queue(folder: Path) -> None:
    for name in ("tmp", "ready"):
        (folder / name).mkdir(parents=True)
    common.sync_filesystem(folder)


Run = Callable[[Path, int, bool, int], float]
MODES: dict[str, tuple[Run, Run]] = {
    "single": (forkvisor_single, reference_single),
    "many": (forkvisor_many, reference_many),
}


def job_counts(full: bool, requested: int | None) -> dict[str, int]:
    """Jobs per run of each configuration: fsync-bound runs get fewer."""
    if requested:
        return dict.fromkeys(("single durable", "single plain", "many durable", "many plain"), requested)
    scale = 4 if full else 1
    return {
        "single durable": 500 * scale,
        "single plain": 3000 * scale,
        "many durable": 5000 * scale,
        "many plain": 5000 * scale,
    }


def measure(root: Path, counts: dict[str, int], batch: int, rounds: int) -> dict[str, dict[str, list[float]]]:
    found: dict[str, dict[str, list[float]]] = {}
    with common.scratch(root, "enqueue") as scratch:
        for round_number in range(rounds):
            for mode, (fv, reference) in MODES.items():
                for durable in (True, False):
                    key = f"{mode} {'durable' if durable else 'plain'}"
                    order = [("forkvisor", fv), ("reference", reference)]
                    for name, run in order if round_number % 2 == 0 else reversed(order):
                        folder = scratch / f"{name}-{key.replace(' ', '-')}-{round_number}"
                        rate = run(folder, counts[key], durable, batch)
                        found.setdefault(key, {}).setdefault(name, []).append(rate)
    return found


def report(found: dict[str, dict[str, list[float]]], counts: dict[str, int], batch: int) -> dict[str, Any]:
    rows, results = [], {}
    for key, rates in found.items():
        fv, reference = rates["forkvisor"], rates["reference"]
        ratios = [common.ratio(a, b) for a, b in zip(fv, reference, strict=True)]
        target = TARGETS.get(key)
        met = None if target is None else common.median(fv) >= target
        rows.append(
            [
                key,
                counts[key],
                common.spread_text(fv),
                common.spread_text(reference),
                common.spread_text(ratios, 2),
                f"{target:,.0f}" if target else "-",
                "-" if met is None else ("met" if met else "MISSED"),
            ]
        )
        results[key] = {
            "jobs_per_run": counts[key],
            "forkvisor_jobs_per_s": common.summary(fv),
            "reference_jobs_per_s": common.summary(reference),
            "ratio": common.summary(ratios),
            "target_jobs_per_s": target,
            "target_met": met,
        }
    results["targets"] = {
        f"{key} >= {target:,.0f} jobs/s": results[key]["target_met"]
        for key, target in TARGETS.items()
        if key in results
    }
    common.print_table(
        f"Enqueue (jobs/s, median [min-max]; enqueue_many in batches of {batch}; reference = FORMAT.md recipe)",
        ["config", "jobs", "forkvisor", "reference", "fv/ref", "target", "verdict"],
        rows,
    )
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_common_options(parser)
    parser.add_argument("--jobs", type=int, help="jobs per run for every configuration")
    parser.add_argument("--batch", type=int, default=1000, help="jobs per enqueue_many call (default 1000)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 3, --full 5)")
    args = parser.parse_args(argv)
    root = common.choose_root(args.dir)
    common.announce("enqueue", root)
    counts = job_counts(args.full, args.jobs)
    found = measure(root, counts, args.batch, args.rounds or (5 if args.full else 3))
    results = report(found, counts, args.batch)
    results["batch"] = args.batch
    common.emit_json("enqueue", root, results)
    return results


if __name__ == "__main__":
    main()
