"""What a cgroup per run costs: a run's life with and without one, alternating.

    python -m benchmarks.containment [--runs N] [--rounds R]

Needs a cgroup this process may divide (cgroup v2, delegated or root); says why not
otherwise. Each round times, one run after the other (no queue, no job code):

- plain: fork a child that exits at once, and wait for it (what every run pays);
- cgroup: the same, inside the manager's code path for a run's cgroup
  (`CgroupContainment.new_run`: mkdir, open `cgroup.procs`; the child writes itself in
  before it exits; then read `cpu.stat`, as the record of a run's cost does, and
  `remove`, which waits until the kernel has emptied it).

Then a run's start, one run at a time with `--gap` ms between them (an idle manager fed
one job at a time): the time from the fork's call to the child's first step inside its
cgroup, for a child that moves itself in (`os.fork`, then `cgroup.procs`) and for one born
there (clone3 with CLONE_INTO_CGROUP), both through `forking.start_child`, alternating.
A move between cgroups may wait for an RCU grace period where cgroup2 is mounted without
`favordynmods`; a child born in its cgroup moves nowhere.

Then, whole: a real manager runs `--jobs` no-op jobs in burst mode (concurrency 2, plain
queue), once with `containment="processes"` and once with `"cgroup"`, alternating.

Reported: runs/s of each, the ratio cgroup/plain measured in the same round, and what
the cgroup adds per run in microseconds. Rounds alternate which way goes first, since
these machines are shared. docs/PERFORMANCE.md ("A cgroup per run") has the figures.
"""

from __future__ import annotations

import argparse
import functools
import os
import time
from pathlib import Path

from benchmarks import common
from benchmarks.tasks import noop, registry
from jobs import Call, Queue
from supervisor import Manager, containment, forking
from supervisor.containment import CgroupContainment, CgroupRun

OWNER = f"bench.{os.getpid()}.000000"


def plain(runs: int, _: CgroupContainment) -> float:
    """Seconds for `runs` fork-and-wait."""
    began = time.perf_counter()
    for _ in range(runs):
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
    return time.perf_counter() - began


def in_cgroups(runs: int, place: CgroupContainment) -> float:
    """Seconds for `runs` runs, each in a cgroup of its own, made, entered, read and removed."""
    began = time.perf_counter()
    for number in range(runs):
        box = place.new_run(OWNER, "bench", number)
        assert box is not None, "the cgroup could not be made"
        pid = os.fork()
        if pid == 0:
            containment.enter(box.entries())
            os._exit(0)
        box.started()
        os.waitpid(pid, 0)
        _read_cpu(box)
        while not box.remove():
            time.sleep(0.0001)  # the kernel empties it a moment after the exit
    return time.perf_counter() - began


def managed(mode: str, jobs: int, root: Path) -> float:
    """Seconds for a burst manager to run `jobs` no-op jobs with runs contained by `mode`."""
    with common.scratch(root, f"containment-{mode}") as folder:
        queue = Queue(folder / "queue")
        queue.enqueue_many([Call(noop)] * jobs)  # before the timed window
        manager = Manager(queue, registry, concurrency=2, containment=mode)
        taken = common.timed(lambda: manager.run(burst=True)).wall
        if queue.counts()["done"] != jobs:
            raise SystemExit(f"the {mode} manager finished {queue.counts()['done']} of {jobs} jobs")
    return taken


def start_times(runs: int, place: CgroupContainment, gap: float) -> dict[str, list[float]]:
    """Milliseconds from the fork's call to the child's first step in its new cgroup, run by
    run, `gap` seconds apart, alternating a child that moves in and one born there."""
    found: dict[str, list[float]] = {"moved": [], "born": []}
    for number in range(runs):
        born = number % 2 == 1
        box = place.new_run(OWNER, "start", number)
        assert box is not None, "the cgroup could not be made"
        read_end, write_end = os.pipe()
        folder, procs = box.fork_into()[0]
        began = time.perf_counter()  # (the same code either way: a child without a folder moves in)
        cgroup = (folder, procs) if born else (-1, procs)
        pid = forking.start_child(functools.partial(_stamp, write_end), [read_end], cgroup=cgroup)
        box.started()
        os.close(write_end)
        stamped = float(os.read(read_end, 64))
        os.close(read_end)
        os.waitpid(pid, 0)
        deadline = time.monotonic() + 5
        while not box.remove():  # (the kernel empties it a moment after the reap)
            if time.monotonic() > deadline:
                raise SystemExit(f"the cgroup of run {number} is still in use 5 s after its child was reaped")
            time.sleep(0.0001)
        found["born" if born else "moved"].append((stamped - began) * 1000)
        time.sleep(gap)
    return found


def _stamp(fd: int) -> int:
    os.write(fd, repr(time.perf_counter()).encode())
    return 0


def _read_cpu(box: CgroupRun) -> bytes:
    with open(os.path.join(box.path, "cpu.stat"), "rb") as stat:
        return stat.read()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=1000, help="no-op jobs per manager run")
    parser.add_argument("--starts", type=int, default=200, help="runs whose start is timed, one at a time")
    parser.add_argument("--gap", type=float, default=20.0, help="ms between two timed starts")
    common.add_common_options(parser)
    args = parser.parse_args(argv)
    place = containment.detect()
    if not isinstance(place, CgroupContainment):
        raise SystemExit(f"no cgroup to divide here: {place.describe()}")
    place.open_owner(OWNER)
    ways = {"plain": plain, "cgroup": in_cgroups}
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    try:
        for round_number in range(args.rounds):
            order = list(ways.items())
            for name, way in order if round_number % 2 == 0 else reversed(order):
                seconds[name].append(way(args.runs, place))
    finally:
        place.close_owner(OWNER)
    rates = {name: [args.runs / taken for taken in found] for name, found in seconds.items()}
    ratios = [common.ratio(c, p) for c, p in zip(rates["cgroup"], rates["plain"], strict=True)]
    added = [(c - p) / args.runs * 1e6 for c, p in zip(seconds["cgroup"], seconds["plain"], strict=True)]
    common.print_table(
        f"A run's life with and without a cgroup, {args.runs} runs, {args.rounds} rounds alternating; median [min-max]",
        ["way", "runs/s", "vs plain", "added us per run"],
        [
            ["plain", common.spread_text(rates["plain"]), "1.00", "0"],
            ["cgroup", common.spread_text(rates["cgroup"]), common.spread_text(ratios, 2), common.spread_text(added)],
        ],
    )
    if place.forks_into:  # (probed when the owner above was opened)
        place.open_owner(OWNER)
        try:
            starts = start_times(args.starts, place, args.gap / 1000)
        finally:
            place.close_owner(OWNER)
        common.print_table(
            f"A run's start, fork call to child in its cgroup; {args.starts} runs {args.gap:g} ms apart, alternating",
            ["child", "p50 ms", "p99 ms", "max ms"],
            [
                [way, *(f"{common.percentile(found, share):.2f}" for share in (0.5, 0.99, 1.0))]
                for way, found in starts.items()
            ],
        )
    else:
        print("\nno child is born in its cgroup here (clone3 or the C module missing): starts not measured")
    root = common.choose_root(args.dir)
    modes = ("processes", "cgroup")
    managers: dict[str, list[float]] = {mode: [] for mode in modes}
    for round_number in range(args.rounds):
        for mode in modes if round_number % 2 == 0 else reversed(modes):
            managers[mode].append(args.jobs / managed(mode, args.jobs, root))
    whole = [common.ratio(c, p) for c, p in zip(managers["cgroup"], managers["processes"], strict=True)]
    common.print_table(
        f"A burst manager, {args.jobs} no-op jobs, concurrency 2, {args.rounds} rounds alternating; median [min-max]",
        ["containment", "jobs/s", "vs processes"],
        [
            ["processes", common.spread_text(managers["processes"]), "1.00"],
            ["cgroup", common.spread_text(managers["cgroup"]), common.spread_text(whole, 2)],
        ],
    )
    print(f"\ncgroups below {place.base}; memory cgroups: {place.memory.base if place.memory else place.why_no_memory}")
    print(f"queues on {common.describe_filesystem(root)}")


if __name__ == "__main__":
    main()
