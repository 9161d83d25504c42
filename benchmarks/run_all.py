"""Run every benchmark, then print which targets are met and one final line of JSON.

    python -m benchmarks.run_all [--full] [--dir DIR] [--only NAME...]   (NAME: throughput commands heavy
        enqueue latency managers scale keys planning web)

Quick defaults finish in about five minutes on two cores; `--full` takes bigger
N, more rounds and the 1-million scale run (about an hour, and up to ~30 GB of
small temporary files, since nothing is removed before the end: on ext4
without a journal, fresh deletions slow file creation nearby for minutes).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

from benchmarks import commands, common, enqueue, heavy, keys, latency, managers, planning, scale, throughput, web

BENCHMARKS: dict[str, Callable[[list[str] | None], dict[str, Any]]] = {
    "throughput": throughput.main,
    "commands": commands.main,
    "heavy": heavy.main,
    "enqueue": enqueue.main,
    "latency": latency.main,
    "managers": managers.main,
    "scale": scale.main,
    "keys": keys.main,
    "planning": planning.main,
    "web": web.main,
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_common_options(parser)
    parser.add_argument("--only", nargs="+", choices=sorted(BENCHMARKS), help="run only these benchmarks")
    args = parser.parse_args(argv)
    root = common.choose_root(args.dir)
    shared = ["--dir", str(root), *(["--full"] if args.full else [])]
    results: dict[str, Any] = {}
    with common.removal_deferred():  # fresh deletions would slow the next benchmark's file creation
        for name, run in BENCHMARKS.items():
            if args.only and name not in args.only:
                continue
            started = time.perf_counter()
            print(f"\n=== {name} (load average {os.getloadavg()[0]:.2f}) ===", flush=True)
            results[name] = run(shared)
            results[name]["seconds"] = time.perf_counter() - started
    targets = {
        f"{name}: {target}": met for name, found in results.items() for target, met in found.get("targets", {}).items()
    }
    rows = [[target, "met" if met else "MISSED"] for target, met in targets.items()]
    common.print_table("Targets", ["target", "verdict"], rows)
    common.emit_json("run_all", root, {"targets": targets, **results})


if __name__ == "__main__":
    main()
