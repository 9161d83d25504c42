"""Latency: from `enqueue` returning (and from its call) to the job's function
starting, and to the job being in done/, with an idle manager waiting; durable
unless --plain.

    python -m benchmarks.latency [--jobs N] [--gap MS] [--plain] [--containment MODE] [--full] [--dir DIR]

A manager runs as `forkvisor run QUEUE --app benchmarks.tasks:registry` in a
subprocess and idles. This process enqueues one `bench.stamp` job at a time
(its function returns CLOCK_MONOTONIC, which is system-wide, as its result),
notes the time `enqueue` returned, and waits on inotify for the job to appear
in done/. Then it waits a small random gap and goes on.

Alternately, job by job, the same is done against the reference: the
FORMAT.md submission recipe (`references.minimal_submit`, durable) and an
idle minimal server (`references.minimal_server`) in a forked child, which
renames, forks a child that stamps its start, waits and renames to done/. And
the floor of forkvisor's own records under issue 30's decisions: the same recipe
with the `events` line, served by `references.recording_server` (the recording
queue: the count staged, the child forked to wait at a gate until its count is on
disk, the outcome, the result's link, the move, each with its barriers). Warm-up
jobs run first and are not counted. The target is from the enqueue's call.
"""

from __future__ import annotations

import argparse
import os
import random
import select
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import common, references
from benchmarks.tasks import stamp
from jobs import Queue
from supervisor.watch import Watch

TARGET_P50_MS, TARGET_P99_MS = 3.0, 10.0
WARM_UP = 20
TIMEOUT = 30.0


@dataclass
class Samples:
    """Per job, in milliseconds from `enqueue` returning (`from_call`: from its call)."""

    to_start: list[float] = field(default_factory=list)
    to_done: list[float] = field(default_factory=list)
    enqueue_call: list[float] = field(default_factory=list)
    from_call: list[float] = field(default_factory=list)

    def row(self, name: str) -> list[str]:
        cells = [name, str(len(self.to_start))]
        for values in (self.to_start, self.to_done):
            cells += [f"{common.percentile(values, q):.2f}" for q in (0.5, 0.99)] + [f"{max(values):.1f}"]
        cells += [f"{common.percentile(self.from_call, q):.2f}" for q in (0.5, 0.99)]
        return [*cells, f"{common.median(self.enqueue_call):.2f}"]

    def as_dict(self) -> dict[str, Any]:
        return {
            name: {
                "p50": common.percentile(values, 0.5),
                "p99": common.percentile(values, 0.99),
                "max": max(values),
                "mean": sum(values) / len(values),
            }
            for name, values in (
                ("enqueue_to_start_ms", self.to_start),
                ("enqueue_to_done_ms", self.to_done),
                ("enqueue_call_ms", self.enqueue_call),
                ("enqueue_call_to_start_ms", self.from_call),
            )
        }


class DoneWatch:
    """Wakes this process when a job appears in one of the done/ folders."""

    def __init__(self, folders: list[Path]) -> None:
        self._watch = Watch(folders)
        self._seen: set[tuple[Path, str]] = set()

    def wait_for(self, folder: Path, name: str) -> float:
        """Block until `folder/name` appears; return the CLOCK_MONOTONIC time it was seen."""
        now = time.monotonic()
        deadline = now + TIMEOUT
        while (folder, name) not in self._seen:
            if not select.select([self._watch.fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                raise SystemExit(f"job {name} did not reach {folder} within {TIMEOUT}s")
            now = time.monotonic()
            self._seen.update((found, entry) for found, entry in self._watch.read() if found is not None)
        self._seen.discard((folder, name))
        return now

    def close(self) -> None:
        self._watch.close()


Submit = Callable[[], str]


def one_job(submit: Submit, done: Path, watch: DoneWatch, samples: Samples | None) -> None:
    before = time.monotonic()
    job_id = submit()
    returned = time.monotonic()
    finished = watch.wait_for(done, job_id)
    started = float((done / job_id / "result.json").read_text())
    if samples is not None:
        samples.to_start.append((started - returned) * 1000)
        samples.to_done.append((finished - returned) * 1000)
        samples.enqueue_call.append((returned - before) * 1000)
        samples.from_call.append((started - before) * 1000)


def start_manager(queue: Path, durable: bool, containment: str) -> subprocess.Popen[bytes]:
    options = [*([] if durable else ["--no-durable"]), "--containment", containment]
    return subprocess.Popen(common.manager_command(queue, *options), cwd=common.REPO)


def start_server(serve: Callable[[Path, bool], None], queue: Path, durable: bool) -> int:
    (queue / "tmp").mkdir(parents=True)
    references.MinimalQueue(queue)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            serve(queue, durable)
        finally:
            os._exit(code)
    return pid


def measure(root: Path, jobs: int, gap: float, durable: bool, containment: str = "auto") -> dict[str, Samples]:
    with common.scratch(root, "latency") as scratch:
        queue = Queue(scratch / "forkvisor", durable=durable)
        minimal, recording = scratch / "minimal", scratch / "recording"
        manager = start_manager(queue.path, durable, containment)
        servers = [start_server(references.minimal_server, minimal, durable)]
        servers.append(start_server(references.recording_server, recording, durable))
        watch = DoneWatch([queue.path / "done", minimal / "done", recording / "done"])
        contenders: dict[str, tuple[Submit, Path]] = {
            "forkvisor": (lambda: queue.enqueue(stamp), queue.path / "done"),
            "reference": (lambda: references.minimal_submit(minimal, durable), minimal / "done"),
            "recording": (lambda: references.minimal_submit(recording, durable, logged=True), recording / "done"),
        }
        found = {name: Samples() for name in contenders}
        try:
            for number in range(WARM_UP + jobs):
                order = list(contenders.items())
                for name, (submit, done) in order if number % 2 == 0 else reversed(order):
                    one_job(submit, done, watch, found[name] if number >= WARM_UP else None)
                    time.sleep(random.uniform(gap / 2, gap * 1.5) / 1000)
        finally:
            watch.close()
            manager.send_signal(signal.SIGTERM)
            manager.wait(timeout=60)
            for server in servers:
                os.kill(server, signal.SIGKILL)
                os.waitpid(server, 0)
    return found


def report(found: dict[str, Samples], durable: bool, gap: float) -> dict[str, Any]:
    headers = ["who", "jobs", "start p50", "start p99", "start max", "done p50", "done p99", "done max"]
    headers += ["call->start p50", "call->start p99", "enqueue"]
    mode = "durable" if durable else "plain"
    common.print_table(
        f"Latency, {mode}, ms from enqueue returning (start: the job's function starts; done: in done/); "
        f"one job at a time, gaps {gap / 2:g}-{gap * 1.5:g} ms; call->start: from the enqueue call instead; "
        "enqueue = duration of the enqueue call",
        headers,
        [samples.row(name) for name, samples in found.items()],
    )
    results: dict[str, Any] = {name: samples.as_dict() for name, samples in found.items()}
    fv = results["forkvisor"]["enqueue_to_start_ms"]
    ref = results["reference"]["enqueue_to_start_ms"]
    results["ratio_p50_start"] = common.ratio(fv["p50"], ref["p50"])
    results["ratio_p99_start"] = common.ratio(fv["p99"], ref["p99"])
    results["durable"] = durable
    if durable:  # issue 30's measure: from the enqueue's call
        call = results["forkvisor"]["enqueue_call_to_start_ms"]
        results["targets"] = {
            f"enqueue call->start p50 < {TARGET_P50_MS} ms": call["p50"] < TARGET_P50_MS,
            f"enqueue call->start p99 < {TARGET_P99_MS} ms": call["p99"] < TARGET_P99_MS,
        }
        for target, met in results["targets"].items():
            print(f"target {target}: {'met' if met else 'MISSED'}")
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_common_options(parser)
    parser.add_argument("--jobs", type=int, help="measured jobs per contender (default 500, --full 2000)")
    parser.add_argument("--gap", type=float, default=5.0, help="mean gap between jobs, ms (default 5)")
    parser.add_argument("--plain", action="store_true", help="durable=False on both sides")
    parser.add_argument(
        "--containment", default="auto", help="the manager's (auto, cgroup, processes): a cgroup per run may add a move"
    )
    args = parser.parse_args(argv)
    root = common.choose_root(args.dir)
    common.announce("latency", root)
    jobs = args.jobs or (2000 if args.full else 500)
    found = measure(root, jobs, args.gap, not args.plain, args.containment)
    results = report(found, not args.plain, args.gap)
    results["containment"] = args.containment
    common.emit_json("latency", root, results)
    return results


if __name__ == "__main__":
    main()
