"""Command jobs: `true` through forkvisor, against a fork+exec loop with the same cap.

    python -m benchmarks.commands [--jobs N] [--rounds R] [--concurrency 2] [--full] [--dir DIR]

For each concurrency cap, in interleaved rounds (the order alternates between
rounds), this process runs:

- the reference, `seq N | xargs -P CAP -n 1 true`: a plain fork+exec loop with
  the same cap, no queue and no records (what the issue compares with),
- the recording queue for commands (`references.CommandRecordingQueue`): every record
  forkvisor keeps of a command job, its children vforked by the same C module, with the
  barriers of issue 30's decisions, as straight-line code; its ratio to xargs is the most
  any code that keeps those records can reach; where forkvisor gives each run a cgroup
  here, also the contained recording queue, which does too (`references.RunCgroups`),
- forkvisor, plain and durable, with its command jobs started each way this host
  allows (supervisor/spawner.py): vforked by its C module (the default where it was
  built), spawned through `setpriv` and `sh` (without the module), and forked (for
  jobs run as their submitter, and where neither works):
  `Manager(queue, concurrency=cap).run(burst=True)` in this very process, on a
  queue filled with `enqueue_many` BEFORE the timed window.

Reported: jobs/s (median and spread), each forkvisor form's ratio to the
reference measured in the same round, and the manager's own CPU and minor page
faults per job (a fork makes the manager's pages copy-on-write: each it writes
afterwards faults).
"""

from __future__ import annotations

import argparse
import functools
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import common, references
from benchmarks.throughput import Series, paired_ratios
from jobs import Queue, command_call
from supervisor import Manager
from supervisor.spawner import Chained, Spawner, Vforked

TARGET_RATIO = 0.5  # command jobs at concurrency 2 against the fork+exec loop
TRUE = shutil.which("true") or "true"


def run_xargs(folder: Path, jobs: int, cap: int) -> common.Timed:
    del folder
    numbers = "".join(f"{n}\n" for n in range(jobs))
    cpu, children = common.cpu_self(), common.cpu_children()
    started = time.perf_counter()
    subprocess.run(["xargs", "-P", str(cap), "-n", "1", TRUE], input=numbers, text=True, check=True)
    wall = time.perf_counter() - started
    return common.Timed(wall, common.cpu_self() - cpu, common.cpu_children() - children, 0)


def run_forkvisor(folder: Path, jobs: int, cap: int, durable: bool, how: str) -> common.Timed:
    queue = Queue(folder, durable=durable)
    queue.enqueue_many([command_call([TRUE])] * jobs)  # before the timed window
    common.sync_filesystem(folder)
    manager = Manager(queue, concurrency=cap)
    for served in manager.served:
        served.launcher.spawner = SPAWNERS[how]()
    run = common.timed(lambda: manager.run(burst=True))
    done = queue.counts()["done"]
    if done != jobs:
        raise SystemExit(f"forkvisor finished {done} of {jobs} command jobs")
    return run


def run_recording(
    folder: Path, jobs: int, cap: int, durable: bool, cgroups: references.RunCgroups | None = None
) -> common.Timed:
    queue = references.CommandRecordingQueue(folder, cgroups)
    queue.fill(jobs)
    common.sync_filesystem(folder)
    run = common.timed(lambda: queue.run(cap, durable))
    done = len(list(queue.done.iterdir()))
    if done != jobs:
        raise SystemExit(f"the recording queue finished {done} of {jobs} command jobs")
    return run


Contender = Callable[[Path, int, int], common.Timed]
SPAWNERS: dict[str, Callable[[], Spawner | None]] = {
    "vforked": Vforked.probe,
    "chain": Chained.probe,
    "forked": lambda: None,
}


@functools.cache
def ways() -> list[str]:
    """How this host can start command jobs, the default first."""
    return [how for how, probe in SPAWNERS.items() if how == "forked" or probe() is not None]


def forms() -> list[tuple[bool, str]]:
    return [(durable, how) for durable in (False, True) for how in ways()]


def _form(durable: bool, how: str) -> str:
    return f"{how} {'durable' if durable else 'plain'}"


def _recording(durable: bool, contained: bool = False) -> str:
    return f"{'contained ' if contained else ''}recording queue {'durable' if durable else 'plain'}"


def contenders(cgroups: references.RunCgroups | None) -> dict[str, Contender]:
    found: dict[str, Contender] = {"xargs": run_xargs}
    if "vforked" in ways():
        for durable in (False, True):
            found[_recording(durable)] = lambda f, j, c, d=durable: run_recording(f, j, c, d)
            if cgroups is not None:  # a cgroup per run, as forkvisor's manager gives each here
                found[_recording(durable, True)] = lambda f, j, c, d=durable: run_recording(f, j, c, d, cgroups)
    for durable, how in forms():
        found[_form(durable, how)] = lambda f, j, c, d=durable, h=how: run_forkvisor(f, j, c, d, h)
    return found


def measure(root: Path, jobs: int, rounds: int, caps: list[int]) -> dict[int, dict[str, Series]]:
    found: dict[int, dict[str, Series]] = {}
    with references.RunCgroups.here() as cgroups, common.scratch(root, "commands") as scratch:
        for round_number in range(rounds):
            for cap in caps:
                config = found.setdefault(cap, {})
                order = list(contenders(cgroups).items())
                for name, run in order if round_number % 2 == 0 else reversed(order):
                    folder = scratch / f"{name.replace(' ', '-')}-c{cap}-{round_number}"
                    config.setdefault(name, Series()).add(jobs, run(folder, jobs, cap))
    return found


def report(found: dict[int, dict[str, Series]], jobs: int, rounds: int) -> dict[str, Any]:
    rows, results = [], {}
    for cap, config in found.items():
        reference = config["xargs"]
        results[f"c{cap}"] = entry = {"xargs_jobs_per_s": common.summary(reference.rates)}
        rows.append([f"c{cap}", "xargs -P", common.spread_text(reference.rates), "1", "", ""])
        named = [(f"forkvisor {_form(d, h)}", _form(d, h)) for d, h in forms()]
        recordings = [_recording(durable, contained) for contained in (False, True) for durable in (False, True)]
        named += [(name, name) for name in recordings if name in config]
        for shown, name in named:
            series = config[name]
            ratios = paired_ratios(series, reference)
            key = name.replace(" ", "_")
            entry[f"{key}_jobs_per_s"] = common.summary(series.rates)
            entry[f"{key}_ratio_vs_xargs"] = common.summary(ratios)
            entry[f"{key}_manager_cpu_us_per_job"] = common.summary(series.cpu_per_job_us)
            entry[f"{key}_manager_minor_faults_per_job"] = common.summary(series.faults_per_job)
            rows.append(
                [
                    f"c{cap}",
                    shown,
                    common.spread_text(series.rates),
                    common.spread_text(ratios, 2),
                    f"{common.median(series.cpu_per_job_us):,.0f}",
                    f"{common.median(series.faults_per_job):,.0f}",
                ]
            )
    common.print_table(
        f"Command jobs (`true`): {jobs} per run, {rounds} interleaved rounds; median [min-max]. Jobs enqueued "
        "BEFORE the timed window.\nratio = jobs/s against xargs in the same round; cpu = the manager's own CPU "
        "(us per job); flt = its minor page faults per job. The recording queue keeps forkvisor's records of "
        "each command job, vforked, as straight-line code (benchmarks/references.py); the contained one also "
        "gives each run a cgroup, as forkvisor's manager does here.",
        ["cap", "who", "jobs/s", "ratio", "cpu", "flt"],
        rows,
    )
    return results


def verdicts(results: dict[str, Any]) -> dict[str, bool]:
    """The issue's target: at concurrency 2, command jobs started the host's default way at
    least 0.5 of the fork+exec loop."""
    default = ways()[0]
    return {
        f"c2 {form} >= {TARGET_RATIO} x xargs": results["c2"][f"{form.replace(' ', '_')}_ratio_vs_xargs"]["median"]
        >= TARGET_RATIO
        for form in (_form(False, default), _form(True, default))
        if "c2" in results
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_common_options(parser)
    parser.add_argument("--jobs", type=int, help="jobs per run (default 1000, --full 3000)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 3, --full 5)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[2])
    args = parser.parse_args(argv)
    root = common.choose_root(args.dir)
    common.announce("commands", root)
    jobs = args.jobs or (3000 if args.full else 1000)
    rounds = args.rounds or (5 if args.full else 3)
    results: dict[str, Any] = report(measure(root, jobs, rounds, args.concurrency), jobs, rounds)
    results["targets"] = verdicts(results)
    results["jobs_per_run"], results["rounds"] = jobs, rounds
    for target, met in results["targets"].items():
        print(f"target {target}: {'met' if met else 'MISSED'}")
    common.emit_json("commands", root, results)
    return results


if __name__ == "__main__":
    main()
