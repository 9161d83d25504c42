"""Pages: what a Python job's turn of the manager's loop writes, and what each write costs.

    python -m benchmarks.pages [--jobs N] [--turns T] [--rounds R] [--dir DIR]

After a fork every page of the manager is shared with the new child, copy-on-write: the
first write to each afterwards copies it (a fault, a new page, a 4 KiB copy). A manager
forks once per job, so every page its loop writes in a job's turn is copied once per
job. This measures both halves of that cost:

- **a copied page**: a parent forks a child that lives 3 ms and writes one byte in each
  of 700 pages of a private mapping, against the same loop without the writes (the
  manager's heap, imported, is the same size); the difference per page, in interleaved
  rounds. (`MADV_POPULATE_WRITE`, the kernel copying them in one call, saves about an
  eighth: the copy itself is the cost.)
- **the pages a job's turn writes, by phase**: `Manager(queue, concurrency=2).run(burst=True)`
  on N no-op jobs, plain, in this process. For T turns in the middle, a holder child forked
  after each job's fork keeps every page shared (a no-op child exits at once, and then its
  pages are no longer shared); the pages no longer shared (`/proc/self/pagemap`: mapped
  once) are counted at the boundaries of the loop's phases (its methods wrapped here). A
  page is counted in the first phase of the turn that writes it. Counting costs a few pages
  per boundary: "(counting)".

A turn runs from one job's fork to the next job's: the table lists its phases in the
loop's order, starting with what follows the fork. Linux only (`/proc/self/pagemap`).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import mmap
import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.tasks import noop, registry
from jobs import Call, Queue
from supervisor import Manager, forking

PAGE = mmap.PAGESIZE
PAGES_WRITTEN = 700
_SHARED_ONCE = (1 << 63) | (1 << 56)  # pagemap: present, and mapped exactly once


# -- what a copied page costs ------------------------------------------------------------


def fork_loop(forks: int, pages: mmap.mmap | None) -> tuple[float, float]:
    """Fork `forks` children that live 3 ms each, one at a time, writing a byte in each page
    of `pages` (if given) while each lives; this process's CPU (µs) and faults per fork."""
    cpu, faults = common.cpu_self(), common.minor_faults()
    for _ in range(forks):
        pid = os.fork()
        if pid == 0:
            time.sleep(0.003)
            os._exit(0)
        if pages is not None:
            for offset in range(0, len(pages), PAGE):
                pages[offset] = 2
        os.waitpid(pid, 0)
    return (common.cpu_self() - cpu) / forks * 1e6, (common.minor_faults() - faults) / forks


def page_cost(forks: int, rounds: int) -> tuple[list[float], float]:
    """CPU (µs) per copied page in each round, forks with writes against forks without,
    interleaved; and the pages copied per fork (the writes' faults)."""
    pages = mmap.mmap(-1, PAGES_WRITTEN * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for offset in range(0, len(pages), PAGE):
        pages[offset] = 1
    per_page, faults = [], []
    for round_number in range(rounds):
        order = ["bare", "written"] if round_number % 2 == 0 else ["written", "bare"]
        found = {kind: fork_loop(forks, pages if kind == "written" else None) for kind in order}
        (bare_cpu, bare_faults), (cpu, written_faults) = found["bare"], found["written"]
        per_page.append((cpu - bare_cpu) / max(1.0, written_faults - bare_faults))
        faults.append(written_faults - bare_faults)
    return per_page, common.median(faults)


# -- which pages a job's turn writes -----------------------------------------------------


class PageCounter:
    """Counts this process's pages that are not shared with any other process."""

    def __init__(self) -> None:
        self.pagemap = os.open("/proc/self/pagemap", os.O_RDONLY | os.O_CLOEXEC)
        self.buffer = bytearray(8 << 20)
        self.ranges: list[tuple[int, int]] = []

    def remap(self) -> None:
        """Note the private writable mappings (the heap grows: once per turn)."""
        self.ranges.clear()
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split()
                low, high = (int(part, 16) for part in fields[0].split("-"))
                if fields[1][1] == "w" and fields[1][3] == "p" and (high - low) // PAGE * 8 <= len(self.buffer):
                    self.ranges.append((low, high))

    def unshared(self) -> int:
        count = 0
        view = memoryview(self.buffer)
        for low, high in self.ranges:
            got = os.preadv(self.pagemap, [view[: (high - low) // PAGE * 8]], low // PAGE * 8)
            with view[:got].cast("Q") as entries:
                count += sum(1 for entry in entries if entry & _SHARED_ONCE == _SHARED_ONCE)
        return count


class Phases:
    """Pages first written in each phase of the turns being watched."""

    def __init__(self, first: int, turns: int) -> None:
        self.counter = PageCounter()
        self.first, self.last = first, first + turns
        self.forks = 0
        self.holder = 0
        self.alive = os.pipe()  # the holder's end of it reads EOF once this process is gone
        self.watching = False
        self.mark = 0
        self.pages: collections.Counter[str] = collections.Counter()
        self.turns = 0

    def boundary(self, phase: str) -> None:
        """The phase that just ended wrote the pages unshared since the last boundary."""
        if self.watching:
            now = self.counter.unshared()
            self.pages[phase] += now - self.mark
            self.mark = self.counter.unshared()
            self.pages["(counting)"] += self.mark - now

    def forked(self) -> None:
        """After a job's fork: share every page again with a new holder, for the next turn."""
        self.release_holder()
        self.forks += 1
        self.watching = self.first <= self.forks < self.last
        if self.watching:
            self.holder = os.fork()
            if self.holder == 0:
                os.close(self.alive[1])
                os.read(self.alive[0], 1)  # until the benchmark is gone (the manager's children die with it)
                os._exit(0)
            self.counter.remap()
            self.mark = self.counter.unshared()
            self.turns += 1

    def close(self) -> None:
        self.release_holder()
        for fd in self.alive:
            os.close(fd)

    def release_holder(self) -> None:
        if self.holder:
            os.kill(self.holder, signal.SIGKILL)
            os.waitpid(self.holder, 0)  # (here: the manager's reaper must not see it)
            self.holder = 0


@contextmanager
def wrapped(
    owner: Any, name: str, after: Callable[[], None], before: Callable[[], None] | None = None
) -> Iterator[None]:
    """`owner.name` calls `before` and `after` around itself, for the duration (an object's
    method: the wrapper shadows it on the object)."""
    original = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if before is not None:
            before()
        try:
            return original(*args, **kwargs)
        finally:
            after()

    setattr(owner, name, wrapper)
    try:
        yield
    finally:
        delattr(owner, name)


def turn_pages(folder: Path, jobs: int, turns: int) -> tuple[dict[str, float], int]:
    """Pages per turn by phase (in the loop's order), over `turns` turns mid-run."""
    queue = Queue(folder, durable=False)
    queue.enqueue_many([Call(noop)] * jobs)
    manager = Manager(queue, registry, concurrency=2)
    phases = Phases(first=(jobs - turns) // 2, turns=turns)
    fork = forking._fork

    def counted_fork(cgroup: forking.BirthCgroup | None) -> tuple[int, int]:
        phases.boundary(CLAIM_TO_FORK)
        pid, move_into = fork(cgroup)
        if pid != 0:
            phases.forked()
        return pid, move_into

    (served,) = manager.served  # (methods wrapped on this run's objects alone)
    ends = {  # (object, method): the phases its end and its start close (indexes into PHASES)
        (served.launcher, "launch"): (0, None),
        (manager.wakeups, "wait"): (2, 1),
        (manager.children, "_end_run"): (4, 3),
        (manager, "_on_exit"): (5, None),
        (served, "_claim_next"): (7, 6),
    }
    with contextlib.ExitStack() as stack:
        for (owner, name), (after, before) in ends.items():
            closes = functools.partial(phases.boundary, PHASES[after])
            opens = None if before is None else functools.partial(phases.boundary, PHASES[before])
            stack.enter_context(wrapped(owner, name, closes, opens))
        stack.callback(phases.close)
        stack.callback(setattr, forking, "_fork", fork)
        forking._fork = counted_fork
        manager.run(burst=True)
    return {phase: phases.pages[phase] / phases.turns for phase in [*PHASES, "(counting)"]}, phases.turns


CLAIM_TO_FORK = "claim to fork: its cgroup, the child's set-up"
PHASES = [
    "after the fork: the child's bookkeeping",
    "the rest of the turn: gates, deadlines, status",
    "waiting: the doorbell, signals, inotify",
    "reaping",
    "the run's end: its cgroup's cost, removed",
    "harvest: outcome, result, events, to done/",
    "between harvest and claim",
    "claim: spec, count, run folder, policy, events",
    CLAIM_TO_FORK,
]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_common_options(parser)
    parser.add_argument("--jobs", type=int, default=600, help="no-op jobs the manager runs (default 600)")
    parser.add_argument("--turns", type=int, default=200, help="turns watched, mid-run (default 200)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the page-cost loop (default 3)")
    parser.add_argument("--forks", type=int, default=300, help="forks per run of the page-cost loop")
    args = parser.parse_args(argv)
    root = common.choose_root(args.dir)
    common.announce("pages", root)
    costs, copied = page_cost(args.forks, args.rounds)
    results: dict[str, Any] = {"copied_page": {"us_per_page": common.summary(costs), "pages_per_fork": copied}}
    with common.scratch(root, "pages") as scratch:
        by_phase, turns = turn_pages(scratch / "queue", args.jobs, min(args.turns, args.jobs // 2))
    per_page = common.median(costs)
    total = sum(by_phase.values())
    rows = [
        [phase, f"{pages:,.1f}", f"{100 * pages / total:.0f}%", f"{pages * per_page:,.0f}"]
        for phase, pages in by_phase.items()
    ]
    rows.append(["total", f"{total:,.1f}", "100%", f"{total * per_page:,.0f}"])
    common.print_table(
        f"A copied page costs {common.spread_text(costs, 2)} us of the writer's CPU ({args.rounds} rounds).\n"
        f"Pages a Python job's turn of the manager's loop writes (each copied once per job), by phase, "
        f"over {turns} turns; us = pages x the cost of a copied page.",
        ["phase", "pages per turn", "share", "us"],
        rows,
    )
    results |= {"pages_per_turn": by_phase, "total_pages_per_turn": total, "turns": turns, "jobs": args.jobs}
    results["copy_us_per_turn"] = total * per_page
    common.emit_json("pages", root, results)
    return results


if __name__ == "__main__":
    main()
