"""Heavy apps: no-op jobs from a manager whose app holds hundreds of MB, against a
bare fork loop from a parent of the same size.

    python -m benchmarks.heavy [--mb 200] [--jobs N] [--rounds R] [--dir DIR]

An `--app` that loads numpy arrays or a model makes the manager big, and each
fork copies its page tables and shares its pages copy-on-write. Each run is a
fresh interpreter that first allocates and touches `--mb` MB, in one of two
shapes, then runs one contender (cap 2, jobs enqueued before the timed window)
and prints its figures; rounds alternate the order:

- shapes: `buffer` (one bytearray, every page touched: weights, arrays) and
  `objects` (small dicts of strings: parsed data, an ORM's cache; the garbage
  collector tracks every one of them);
- contenders: `bare` (fork, the child exits at once: `references.bare_fork`),
  `forkvisor` (`Manager(...).run(burst=True)` on a plain queue), `forkvisor
  durable` (the same on a durable queue, the default, as users run it) and
  `recording` and `recording durable` (`references.RecordingQueue`: forkvisor's
  records, and durable its barriers, as straight-line code: the floor of any code that
  keeps them), and where forkvisor gives each run a cgroup on this host, `contained
  recording` and `contained recording durable` (the same with a cgroup per run, made
  as forkvisor's manager makes them: `references.RunCgroups`): the floor of any code
  that keeps the records and contains every process of a job. (A form after
  `gc.freeze()` measured no difference and was dropped: see docs/PERFORMANCE.md.)

The targets: forkvisor at least 0.8 of the bare fork loop (issue 12, plain), and
durable forkvisor at least 0.8 of it in at least four rounds of five (issue 30).
Each is printed with its floor: the contained recording queue's ratio, where runs
get cgroups here, else the recording queue's.

Reported: jobs/s, forkvisor's ratio to `bare` in the same round, the forking
process's CPU and minor faults per job, its children's CPU per job.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks import common, references
from benchmarks.throughput import Series, paired_ratios

CAP = 2
TARGET_RATIO = 0.8
SHAPES = ("buffer", "objects")
CONTENDERS = ("bare", "forkvisor", "forkvisor durable", "recording", "recording durable")
CONTAINED = ("contained recording", "contained recording durable")  # where runs get cgroups here
ROUNDS_SHARE = 0.8  # the share of rounds that must meet TARGET_RATIO (four of five)


def allocate(shape: str, mb: int) -> object:
    """`mb` MB held and touched, as an app would after its imports."""
    if shape == "buffer":
        ballast = bytearray(mb << 20)
        ballast[::4096] = b"\1" * len(range(0, len(ballast), 4096))  # every page written once
        return ballast
    entries = mb * 4096  # about 256 bytes each: a small dict and its strings
    return [{"key": f"entry-{n}", "value": f"{n:>40}"} for n in range(entries)]


def worker(shape: str, mb: int, contender: str, jobs: int, folder: Path) -> dict[str, float]:
    """One timed run, in this fresh process, after allocating."""
    held = allocate(shape, mb)
    if contender == "bare":
        run = common.timed(lambda: references.bare_fork(jobs, CAP))
    elif "recording" in contender:
        run = _recording(folder, jobs, contender.endswith("durable"), contender.startswith("contained"))
    else:
        from benchmarks.tasks import noop, registry
        from jobs import Call, Queue
        from supervisor import Manager

        queue = Queue(folder, durable=contender == "forkvisor durable")
        queue.enqueue_many([Call(noop)] * jobs)
        manager = Manager(queue, registry, concurrency=CAP)
        run = common.timed(lambda: manager.run(burst=True))
        if queue.counts()["done"] != jobs:
            raise SystemExit(f"forkvisor finished {queue.counts()['done']} of {jobs}")
    del held
    return {"wall": run.wall, "cpu": run.cpu, "children_cpu": run.children_cpu, "faults": run.minor_faults}


def _recording(folder: Path, jobs: int, durable: bool, contained: bool) -> common.Timed:
    with references.RunCgroups.here() if contained else contextlib.nullcontext() as cgroups:
        if contained and cgroups is None:
            raise SystemExit("no cgroup per run on this host: the contained recording queue cannot run")
        recording = references.RecordingQueue(folder, cgroups)
        recording.fill(jobs)
        return common.timed(lambda: recording.run(CAP, durable))


def contenders() -> tuple[str, ...]:
    """Who runs, in round order: the contained floors only where forkvisor's runs get cgroups here."""
    with references.RunCgroups.here() as cgroups:
        return CONTENDERS if cgroups is None else CONTENDERS + CONTAINED


def measure(root: Path, mb: int, jobs: int, rounds: int) -> dict[str, dict[str, Series]]:
    found: dict[str, dict[str, Series]] = {shape: {} for shape in SHAPES}
    runners = contenders()
    with common.scratch(root, "heavy") as scratch:
        for round_number in range(rounds):
            for shape in SHAPES:
                order = runners if round_number % 2 == 0 else tuple(reversed(runners))
                for contender in order:
                    folder = scratch / f"{shape}-{contender.replace(' ', '-')}-{round_number}"
                    command = [sys.executable, "-m", "benchmarks.heavy", "--worker", shape, contender]
                    command += ["--mb", str(mb), "--jobs", str(jobs), "--dir", str(folder)]
                    out = subprocess.run(command, cwd=common.REPO, capture_output=True, text=True, check=True)
                    figures = json.loads(out.stdout.splitlines()[-1])
                    timed = common.Timed(figures["wall"], figures["cpu"], figures["children_cpu"], figures["faults"])
                    found[shape].setdefault(contender, Series()).add(jobs, timed)
    return found


def report(found: dict[str, dict[str, Series]], mb: int, jobs: int, rounds: int) -> dict[str, Any]:
    rows, results = [], {}
    for shape, config in found.items():
        bare = config["bare"]
        results[shape] = entry = {"bare_jobs_per_s": common.summary(bare.rates)}
        for contender in (name for name in CONTENDERS + CONTAINED if name in config):
            series = config[contender]
            ratios = paired_ratios(series, bare)
            key = contender.replace(" ", "_")
            entry[f"{key}_jobs_per_s"] = common.summary(series.rates)
            entry[f"{key}_ratio_vs_bare"] = common.summary(ratios)
            entry[f"{key}_cpu_us_per_job"] = common.summary(series.cpu_per_job_us)
            entry[f"{key}_children_cpu_us_per_job"] = common.summary(series.children_cpu_per_job_us)
            entry[f"{key}_minor_faults_per_job"] = common.summary(series.faults_per_job)
            entry[f"{key}_rounds_at_target"] = sum(ratio >= TARGET_RATIO for ratio in ratios)
            rows.append(
                [
                    shape,
                    contender,
                    common.spread_text(series.rates),
                    common.spread_text(ratios, 2),
                    f"{common.median(series.cpu_per_job_us):,.0f}",
                    f"{common.median(series.children_cpu_per_job_us):,.0f}",
                    f"{common.median(series.faults_per_job):,.0f}",
                ]
            )
    common.print_table(
        f"Heavy app: {mb} MB held by the forking process, {jobs} no-op jobs per run, cap {CAP}, {rounds} rounds; "
        "median [min-max].\nratio = jobs/s against the bare fork loop in the same round; cpu and child = the "
        "forking process's and its children's CPU, us per job; flt = its minor faults per job.",
        ["shape", "who", "jobs/s", "ratio", "cpu", "child", "flt"],
        rows,
    )
    return results


def verdicts(results: dict[str, Any], rounds: int) -> dict[str, bool]:
    found = {}
    for shape in SHAPES:
        if shape not in results:
            continue
        found[f"{shape} forkvisor >= {TARGET_RATIO} x bare fork"] = (
            results[shape]["forkvisor_ratio_vs_bare"]["median"] >= TARGET_RATIO
        )
        met = results[shape]["forkvisor_durable_rounds_at_target"]
        found[f"{shape} durable >= {TARGET_RATIO} x bare fork in {ROUNDS_SHARE:.0%} of rounds ({met}/{rounds})"] = (
            met >= ROUNDS_SHARE * rounds
        )
    return found


def floors(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """For each target, its floor: the contained recording queue's ratio to the bare fork loop
    where runs get cgroups here, else the recording queue's (median, and rounds at the target)."""
    found = {}
    for shape in SHAPES:
        figures = results.get(shape, {})
        for durable in ("", " durable"):
            for who in (f"contained recording{durable}", f"recording{durable}"):
                key = who.replace(" ", "_")
                if f"{key}_ratio_vs_bare" in figures:
                    median, met = figures[f"{key}_ratio_vs_bare"]["median"], figures[f"{key}_rounds_at_target"]
                    found[f"{shape}{durable}"] = {"who": who, "median": median, "rounds_at_target": met}
                    break
    return found


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_common_options(parser)
    parser.add_argument("--mb", type=int, default=200, help="MB the app holds (default 200)")
    parser.add_argument("--jobs", type=int, help="jobs per run (default 500, --full 2000)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 3, --full 5)")
    parser.add_argument("--worker", nargs=2, metavar=("SHAPE", "CONTENDER"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    jobs = args.jobs or (2000 if args.full else 500)
    if args.worker:
        print(json.dumps(worker(args.worker[0], args.mb, args.worker[1], jobs, args.dir)))
        return {}
    root = common.choose_root(args.dir)
    common.announce("heavy", root)
    rounds = args.rounds or (5 if args.full else 3)
    results: dict[str, Any] = report(measure(root, args.mb, jobs, rounds), args.mb, jobs, rounds)
    results["targets"] = verdicts(results, rounds)
    results["mb"], results["jobs_per_run"], results["rounds"] = args.mb, jobs, rounds
    results["floors"] = floors(results)
    for target, met in results["targets"].items():
        print(f"target {target}: {'met' if met else 'MISSED'}")
    for key, floor in results["floors"].items():
        print(
            f"floor {key}: {floor['median']:.2f} x bare fork ({floor['who']}, as straight-line code; "
            f"at {TARGET_RATIO} or more in {floor['rounds_at_target']} of {rounds} rounds)"
        )
    common.emit_json("heavy", root, results)
    return results


if __name__ == "__main__":
    main()
