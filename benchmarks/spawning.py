"""Spawning: the ways a manager-like parent can start `true`, without any queue.

    python -m benchmarks.spawning [--jobs N] [--rounds R]

The parent holds a heap and, after starting each process, writes to 600 of its
pages, as the manager does per job (its loop, the store's objects): after a
fork each of those writes is a copy-on-write fault. Cap 2, interleaved rounds.

- fork + exec: `os.fork`, `setpgrp`, `execv` (how a forked command job starts),
- vfork (C module): `forking.vfork_exec`, what supervisor/spawner.py runs where the
  module was built (process group, parent-death signal, the check that the parent
  still lives, exec; no helper program),
- spawn + setpriv + sh: `posix_spawn` of `setpriv --pdeathsig KILL -- sh -c CHECK`
  (what supervisor/spawner.py runs without the module: the parent-death signal,
  then the check that the parent still lives, then exec),
- spawn + setpriv: without the check (a manager dying in between would leave an
  orphan: not an option, shown for its cost),
- spawn: `posix_spawn` of `true` alone (no parent-death signal: not an option).

Reported: jobs/s, the ratio to fork + exec in the same round, the parent's CPU
and minor faults per job. docs/DECISIONS.md ("Command jobs are spawned, not forked") uses it.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import time
from collections.abc import Callable

from benchmarks import common
from supervisor import forking
from supervisor.spawner import Chained

CAP = 2
PAGES_WRITTEN = 600
TRUE = shutil.which("true") or "/bin/true"


def _forked() -> None:
    pid = os.fork()
    if pid == 0:
        try:
            os.setpgrp()
            os.execv(TRUE, [TRUE])
        finally:
            os._exit(127)


def _vforked() -> None:
    forking.vfork_exec((TRUE,), {}, (0, 1, 2), None)


def _spawner(check: bool) -> Callable[[], None]:
    found = Chained.probe()
    if found is None:
        raise SystemExit("no setpriv with --pdeathsig here: nothing to compare")
    argv = found.argv(os.getpid(), None, (TRUE,))
    if not check:
        argv = [found.setpriv, "--pdeathsig", "KILL", "--", TRUE]
    return lambda: os.posix_spawn(argv[0], argv, os.environ, setpgroup=0) and None


def _bare_spawn() -> None:
    os.posix_spawn(TRUE, [TRUE], os.environ, setpgroup=0)


def run(start: Callable[[], None], jobs: int, pages: list[bytearray]) -> tuple[float, float, float]:
    """jobs/s, parent CPU us per job, parent minor faults per job."""
    running = started = done = 0
    faults, cpu, began = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.process_time(), time.perf_counter()
    while done < jobs:
        while running < CAP and started < jobs:
            start()
            for page in pages:  # the manager's own writes after each start
                page[0] = (page[0] + 1) & 255
            running += 1
            started += 1
        os.wait4(-1, 0)
        running -= 1
        done += 1
    wall = time.perf_counter() - began
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    return jobs / wall, (time.process_time() - cpu) / jobs * 1e6, faults / jobs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    heap = [bytearray(4096) for _ in range(PAGES_WRITTEN * 10)]  # a parent of some tens of MB
    pages = heap[::10]
    ways = {
        "fork + exec": _forked,
        **({"vfork (C module)": _vforked} if forking.CAN_VFORK else {}),
        "spawn + setpriv + sh": _spawner(check=True),
        "spawn + setpriv (no check)": _spawner(check=False),
        "spawn alone (no pdeathsig)": _bare_spawn,
    }
    found: dict[str, list[tuple[float, float, float]]] = {name: [] for name in ways}
    for round_number in range(args.rounds):
        order = list(ways.items())
        for name, start in order if round_number % 2 == 0 else reversed(order):
            found[name].append(run(start, args.jobs, pages))
    reference = [rate for rate, _, _ in found["fork + exec"]]
    rows = []
    for name, results in found.items():
        rates = [rate for rate, _, _ in results]
        ratios = [common.ratio(rate, base) for rate, base in zip(rates, reference, strict=True)]
        cpu = common.median([c for _, c, _ in results])
        faults = common.median([f for _, _, f in results])
        rows.append([name, common.spread_text(rates), common.spread_text(ratios, 2), f"{cpu:,.0f}", f"{faults:,.0f}"])
    common.print_table(
        f"Starting `true`, cap {CAP}, {args.jobs} per run, {args.rounds} rounds; the parent writes "
        f"{PAGES_WRITTEN} pages after each start; median [min-max]",
        ["how", "jobs/s", "vs fork+exec", "parent cpu us", "parent faults"],
        rows,
    )


if __name__ == "__main__":
    main()
