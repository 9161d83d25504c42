"""Scale: claim-and-complete rate and manager memory with many queued jobs, and
counting with many done jobs.

    python -m benchmarks.scale [--sizes 1000 100000] [--full] [--dir DIR]

`--full` adds the 1-million run (several minutes, about 8 GB of small files
per million jobs, removed afterwards). Queues are filled by fabricating job
folders directly in the documented format (docs/FORMAT.md: `ready/100.ID/`
or `done/ID/` holding a `job.json`), not through `enqueue`, which would take
far longer; refills between timed batches use `enqueue_many(durable=False)`.
Everything here is durable=False: fsync costs do not depend on queue size and
would hide what does.

1. Store: `queue.serving.claim` + `queue.serving.complete` (no fork), in timed batches with an
   untimed refill after each (fabricated, then `queue.serving.note_ready`, as inotify
   feeds a manager), so the queue stays at its size. One queue per size; each
   size runs its claims in one stretch (the claim index rescans by wall time
   and when its 8,192 names run dry, so interleaving sizes batch by batch would
   charge one size's rescans to another's time); rounds alternate the order.
   The first claim of a fresh `Queue` (which scans ready/) is timed apart.
2. Manager: `forkvisor run --no-durable` in a subprocess on each queue until K
   more jobs are in done/ (seen through inotify), then SIGTERM. Rate from the
   K/5-th to the K-th completion (startup apart), time to the first completion,
   and the manager's own RSS (now and peak) and CPU from /proc.
3. Counting: `Queue.counts()` in this process and `forkvisor status`
   (subprocess; against the same interpreter importing supervisor.cli and
   exiting) with N jobs in done/, against a bare scandir count of done/.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from benchmarks import common
from benchmarks.tasks import noop
from jobs import Call, Owner, Queue
from jobs.job import new_job_id, ready_name
from supervisor.watch import Watch

SPEC = b'{"format": 1, "function": "bench.noop", "args": [], "kwargs": {}}\n'
TARGET_CLAIM_RATIO, TARGET_RSS_MB, TARGET_COUNTS_S = 0.8, 64.0, 1.0
BATCH = 200


# -- filling ----------------------------------------------------------------------------


def fabricate(folder: Path, count: int, ready: bool) -> list[str]:
    """Make `count` job folders in `folder` (ready/ or done/ names), each with a job.json;
    return their names."""
    names = []
    for _ in range(count):
        job_id = new_job_id()
        name = ready_name(job_id, 0) if ready else job_id
        os.mkdir(folder / name, 0o700)
        fd = os.open(folder / name / "job.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, SPEC)
        os.close(fd)
        names.append(name)
    return names


def make_queues(scratch: Path, sizes: list[int]) -> dict[int, Queue]:
    queues = {}
    for size in sizes:
        started = time.perf_counter()
        queue = Queue(scratch / f"queue-{size}", durable=False)
        fabricate(queue.path / "ready", size, ready=True)
        print(f"fabricated {size:,} ready jobs in {time.perf_counter() - started:.1f}s", flush=True)
        queues[size] = queue
    return queues


# -- 1. store level ---------------------------------------------------------------------


@dataclass
class StoreRun:
    first_claim_s: float = 0.0
    rates: list[float] = field(default_factory=list)
    slowest_batch_s: float = 0.0


def store_rates(queues: dict[int, Queue], claims: int, rounds: int) -> dict[int, StoreRun]:
    """Claim + complete `claims` jobs per size and round, in timed batches; each batch is
    followed by an untimed refill (fabricated, then told to the claim index as inotify
    would tell a manager), so the queue stays at its size. Sizes run one after another,
    in alternating order from round to round."""
    runs: dict[int, StoreRun] = {}
    fresh: dict[int, tuple[Queue, str]] = {}
    for size, queue in queues.items():
        cold = Queue(queue.path, create=False, durable=False)  # a cold claim index
        registered = Owner.new()
        cold.serving.register_owner(registered)
        started = time.perf_counter()
        claim = cold.serving.claim(registered.name)
        runs[size] = StoreRun(first_claim_s=time.perf_counter() - started)
        assert claim is not None
        cold.serving.complete(claim)
        fresh[size] = cold, registered.name
    for number in range(rounds):
        for size in sorted(fresh, reverse=number % 2 == 1):
            queue, owner = fresh[size]
            batches = [_claim_batch(queue, owner) for _ in range(max(1, claims // BATCH))]
            runs[size].rates.append(BATCH * len(batches) / sum(batches))
            runs[size].slowest_batch_s = max(runs[size].slowest_batch_s, *batches)
    for queue, owner in fresh.values():
        queue.serving.retire_owner(owner)
    return runs


def _claim_batch(queue: Queue, owner: str) -> float:
    """Time BATCH claims and completions, then refill BATCH jobs (untimed)."""
    started = time.perf_counter()
    for _ in range(BATCH):
        claim = queue.serving.claim(owner)
        if claim is None:
            raise SystemExit(f"{queue.path} ran dry")
        queue.serving.complete(claim)
    seconds = time.perf_counter() - started
    for name in fabricate(queue.path / "ready", BATCH, ready=True):
        queue.serving.note_ready(name)
    return seconds


# -- 2. through the manager ---------------------------------------------------------------


@dataclass(frozen=True)
class ManagerRun:
    rate: float
    first_done_s: float
    rss_mb: float
    peak_rss_mb: float
    cpu_us_per_job: float


def manager_run(queue: Queue, jobs: int) -> ManagerRun:
    """Run `forkvisor run --no-durable` until `jobs` more jobs are done; then drain it."""
    watch = Watch([queue.path / "done"])
    command = common.manager_command(queue.path, "--no-durable")
    started = time.monotonic()
    process = subprocess.Popen(command, cwd=common.REPO)
    try:
        times = _completions(watch, jobs)
        manager = psutil.Process(process.pid)
        cpu = manager.cpu_times()
        rss, peak = common.rss_mb(process.pid), common.peak_rss_mb(process.pid)
    finally:
        watch.close()
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=120)
    steady = times[len(times) // 5 :]
    return ManagerRun(
        rate=(len(steady) - 1) / (steady[-1] - steady[0]),
        first_done_s=times[0] - started,
        rss_mb=rss,
        peak_rss_mb=peak,
        cpu_us_per_job=(cpu.user + cpu.system) / jobs * 1e6,
    )


def _completions(watch: Watch, jobs: int) -> list[float]:
    times: list[float] = []
    while len(times) < jobs:
        if not select.select([watch.fd], [], [], 120)[0]:
            raise SystemExit(f"the manager completed only {len(times)} of {jobs} jobs in 120s")
        now = time.monotonic()
        times += [now for folder, _ in watch.read() if folder is not None]
    return times[:jobs]


def manager_rates(queues: dict[int, Queue], jobs: int, rounds: int) -> dict[int, list[ManagerRun]]:
    runs: dict[int, list[ManagerRun]] = {size: [] for size in queues}
    for _ in range(rounds):
        for size, queue in queues.items():
            queue.enqueue_many([Call(noop)] * jobs)  # untimed: back to size + jobs
            runs[size].append(manager_run(queue, jobs))
    return runs


# -- 3. counting -------------------------------------------------------------------------


def counting(scratch: Path, done: int, repeats: int) -> dict[str, Any]:
    queue = Queue(scratch / "counted", durable=False)
    started = time.perf_counter()
    fabricate(queue.path / "done", done, ready=False)
    print(f"fabricated {done:,} done jobs in {time.perf_counter() - started:.1f}s", flush=True)
    counts = [common.timed(queue.counts).wall for _ in range(repeats)]
    assert queue.counts()["done"] == done
    scandir = [common.timed(lambda: sum(1 for _ in os.scandir(queue.path / "done"))).wall for _ in range(repeats)]
    status = [_subprocess_seconds(["-m", "supervisor.cli", "status", str(queue.path)]) for _ in range(repeats)]
    startup = [_subprocess_seconds(["-c", "import supervisor.cli"]) for _ in range(repeats)]
    return {
        "done_jobs": done,
        "counts_s": counts,
        "scandir_count_s": scandir,
        "status_s": status,
        "python_import_cli_s": startup,
    }


def _subprocess_seconds(arguments: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, *arguments], cwd=common.REPO, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


# -- reporting -------------------------------------------------------------------------------


def summarise(store: dict[int, StoreRun], manager: dict[int, list[ManagerRun]]) -> dict[str, Any]:
    smallest = min(store)
    base = common.median([r.rate for r in manager[smallest]])
    found: dict[str, Any] = {"store": {}, "manager": {}}
    for size, run in store.items():
        runs = manager[size]
        rates = [r.rate for r in runs]
        found["store"][size] = {
            "claim_complete_per_s": common.summary(run.rates),
            "ratio_vs_smallest": common.median(run.rates) / common.median(store[smallest].rates),
            "first_claim_s": run.first_claim_s,
            "slowest_batch_s": run.slowest_batch_s,
        }
        found["manager"][size] = {
            "jobs_per_s": common.summary(rates),
            "ratio_vs_smallest": common.median(rates) / base,
            "first_done_s": common.summary([r.first_done_s for r in runs]),
            "rss_mb": max(r.rss_mb for r in runs),
            "peak_rss_mb": max(r.peak_rss_mb for r in runs),
            "cpu_us_per_job": common.summary([r.cpu_us_per_job for r in runs]),
        }
    return found


def _row(size: int, store: dict[str, Any], manager: dict[str, Any]) -> list[str]:
    return [
        f"{size:,}",
        f"{store['claim_complete_per_s']['median']:,.0f}",
        f"{store['ratio_vs_smallest']:.2f}",
        f"{store['first_claim_s'] * 1000:,.1f}",
        f"{store['slowest_batch_s'] * 1000:,.0f}",
        f"{manager['jobs_per_s']['median']:,.0f} [{manager['jobs_per_s']['min']:,.0f}-"
        f"{manager['jobs_per_s']['max']:,.0f}]",
        f"{manager['ratio_vs_smallest']:.2f}",
        f"{manager['first_done_s']['median']:.2f}",
        f"{manager['rss_mb']:.1f}",
        f"{manager['peak_rss_mb']:.1f}",
        f"{manager['cpu_us_per_job']['median']:,.0f}",
    ]


def report(store: dict[int, StoreRun], manager: dict[int, list[ManagerRun]], counted: dict[str, Any]) -> dict[str, Any]:
    results = summarise(store, manager)
    common.print_table(
        f"Scale, durable=False. store: claim+complete per s in batches of {BATCH} (refilled untimed), its ratio to "
        "the smallest queue, first claim of a cold Queue (ms), slowest batch (ms).\n"
        "manager: forkvisor run -c 2, jobs/s after the first fifth, ratio, first job done (s), "
        "RSS at the end and peak (MiB), manager CPU per job (us)",
        [
            "queued",
            "store/s",
            "ratio",
            "1st claim",
            "slowest",
            "manager j/s",
            "ratio",
            "1st done",
            "RSS",
            "peak",
            "cpu",
        ],
        [_row(size, results["store"][size], results["manager"][size]) for size in store],
    )
    results["counting"] = _report_counting(counted)
    results["targets"] = targets(results, min(store), max(store))
    for target, met in results["targets"].items():
        print(f"target {target}: {'met' if met else 'MISSED'}")
    return results


def targets(results: dict[str, Any], smallest: int, largest: int) -> dict[str, bool]:
    store, manager, counting = results["store"][largest], results["manager"][largest], results["counting"]
    within = f"at {largest:,} queued within 20% of {smallest:,}"
    return {
        f"store claim rate {within}": store["ratio_vs_smallest"] >= TARGET_CLAIM_RATIO,
        f"manager rate {within}": manager["ratio_vs_smallest"] >= TARGET_CLAIM_RATIO,
        f"manager peak RSS < {TARGET_RSS_MB:g} MiB at {largest:,} queued": manager["peak_rss_mb"] < TARGET_RSS_MB,
        f"counts() < {TARGET_COUNTS_S:g} s with {counting['done_jobs']:,} done": counting["counts_s"]["median"]
        < TARGET_COUNTS_S,
    }


def _report_counting(counted: dict[str, Any]) -> dict[str, Any]:
    keys = ("counts_s", "scandir_count_s", "status_s", "python_import_cli_s")
    summarised: dict[str, Any] = {key: common.summary(counted[key]) for key in keys}
    summarised["done_jobs"] = counted["done_jobs"]
    summarised["ratio_counts_vs_scandir"] = common.ratio(
        summarised["counts_s"]["median"], summarised["scandir_count_s"]["median"]
    )
    common.print_table(
        f"Counting with {counted['done_jobs']:,} jobs in done/ (seconds, median [min-max])",
        ["what", "seconds"],
        [
            ["Queue.counts()", common.spread_text(counted["counts_s"], 3)],
            ["reference: scandir count of done/", common.spread_text(counted["scandir_count_s"], 3)],
            ["forkvisor status (subprocess)", common.spread_text(counted["status_s"], 3)],
            ["reference: python -c 'import supervisor.cli'", common.spread_text(counted["python_import_cli_s"], 3)],
        ],
    )
    return summarised


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_common_options(parser)
    parser.add_argument("--sizes", type=int, nargs="+", help="queued jobs (default 1000 100000; --full adds 1000000)")
    parser.add_argument("--claims", type=int, help="store-level claims per size and round (default 4000, --full 20000)")
    parser.add_argument("--manager-jobs", type=int, help="jobs per manager run (default 1000, --full 3000)")
    parser.add_argument("--rounds", type=int, help="manager runs per size, interleaved (default 2, --full 3)")
    parser.add_argument("--done", type=int, help="jobs in done/ for counting (default 100000, --full 1000000)")
    args = parser.parse_args(argv)
    root = common.choose_root(args.dir)
    common.announce("scale", root)
    sizes = sorted(args.sizes or ([1_000, 100_000, 1_000_000] if args.full else [1_000, 100_000]))
    with common.scratch(root, "scale") as scratch:
        queues = make_queues(scratch, sizes)
        store = store_rates(queues, args.claims or (20_000 if args.full else 4_000), 3 if args.full else 2)
        manager = manager_rates(
            queues, args.manager_jobs or (3_000 if args.full else 1_000), args.rounds or (3 if args.full else 2)
        )
        common.empty(scratch)
        counted = counting(scratch, args.done or (1_000_000 if args.full else 100_000), 5 if args.full else 3)
    results = report(store, manager, counted)
    results["filled"] = "fabricated job folders (docs/FORMAT.md), refills by enqueue_many(durable=False)"
    common.emit_json("scale", root, results)
    return results


if __name__ == "__main__":
    main()
