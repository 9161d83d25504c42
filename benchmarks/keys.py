"""Unique keys: what a key costs an enqueue, and that many keys cost claims nothing.

    python -m benchmarks.keys [--keys 100000] [--jobs 2000] [--rounds 3] [--dir DIR]

Two queues, one with K keys already taken (fabricated as docs/FORMAT.md describes:
`keys/KEY/0000000001` naming a job that finished), one with none. In interleaved
rounds, each queue gets N enqueues without a key, N with a fresh key each, and N
with a key already taken (which return the holder); then every ready job is
claimed and completed (no fork). Reported: rates and the ratios keyed/plain and
with-K-keys/without. Durable (fsyncs), as users run it.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from benchmarks import common
from jobs import Owner, Queue, new_job_id


def fabricate_keys(queue: Queue, count: int) -> None:
    keys = queue.path / "keys"
    finished = new_job_id()  # a job that is nowhere: each key is free
    for n in range(count):
        folder = keys / f"old-{n}"
        os.mkdir(folder, 0o700)
        with open(folder / "0000000001", "w") as file:
            file.write(finished + "\n")


def _rate(action: Any, count: int) -> float:
    started = time.perf_counter()
    for n in range(count):
        action(n)
    return count / (time.perf_counter() - started)


def one_round(queue: Queue, jobs: int, tag: str) -> dict[str, float]:
    plain = _rate(lambda n: queue.enqueue("bench.noop", n), jobs)
    fresh = _rate(lambda n: queue.with_options(key=f"{tag}-{n}").enqueue("bench.noop", n), jobs)
    taken = _rate(lambda n: queue.with_options(key=f"{tag}-{n}").enqueue("bench.noop", n), jobs)
    owner = Owner.new()
    queue.serving.register_owner(owner)

    def claim_and_complete(_: int) -> None:
        claim = queue.serving.claim(owner.name)
        if claim is None:
            raise RuntimeError("the queue ran dry: a bug in the benchmark")
        queue.serving.complete(claim)

    claims = _rate(claim_and_complete, 2 * jobs)
    queue.serving.retire_owner(owner.name)
    return {"enqueue": plain, "enqueue, fresh key": fresh, "enqueue, taken key": taken, "claim+complete": claims}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_common_options(parser)
    parser.add_argument("--keys", type=int, default=100_000, help="keys taken already (default 100,000)")
    parser.add_argument("--jobs", type=int, default=2000, help="enqueues of each kind per round (default 2,000)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    root = common.choose_root(args.dir)
    common.announce("keys", root)
    with common.scratch(root, "keys") as scratch:
        queues = {"no keys": Queue(scratch / "none"), f"{args.keys:,} keys": Queue(scratch / "many")}
        started = time.perf_counter()
        fabricate_keys(queues[f"{args.keys:,} keys"], args.keys)
        print(f"fabricated {args.keys:,} keys in {time.perf_counter() - started:.1f}s", flush=True)
        rates: dict[str, dict[str, list[float]]] = {name: {} for name in queues}
        for number in range(args.rounds):
            order = list(queues) if number % 2 == 0 else list(reversed(queues))
            for name in order:
                for what, rate in one_round(queues[name], args.jobs, f"r{number}").items():
                    rates[name].setdefault(what, []).append(rate)
    none, many = (rates[name] for name in queues)
    rows = [
        [
            what,
            common.spread_text(none[what]),
            common.spread_text(many[what]),
            f"{common.median(many[what]) / common.median(none[what]):.2f}",
            f"{common.median(none[what]) / common.median(none['enqueue']):.2f}",
        ]
        for what in none
    ]
    common.print_table(
        f"durable, jobs/s (median [min-max] of {args.rounds} rounds of {args.jobs:,})",
        ["operation", "no keys", f"{args.keys:,} keys", "many/none", "/ plain enqueue"],
        rows,
    )
    results = {
        "keys": args.keys,
        "jobs": args.jobs,
        "rates": {name: {k: common.summary(v) for k, v in r.items()} for name, r in rates.items()},
    }
    common.emit_json("keys", root, results)
    return results


if __name__ == "__main__":
    main()
