"""What `jobs.current().progress()` costs a job, per call.

    python -m benchmarks.progress [--calls N] [--dir DIR]

In a fake run folder (the environment a manager gives a job), this process calls
`progress(i, N)` N times in a tight loop (all but a few are rate-limited away),
against the same loop calling `time.monotonic()` alone; then N/100 calls that each
write (`done == total`, which is always written) to time one write of
`progress.json`. Reported: µs per call and the ratio to the bare loop.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from benchmarks import common
from jobs import Current


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_common_options(parser)
    parser.add_argument("--calls", type=int, default=1_000_000)
    args = parser.parse_args(argv)
    root = common.choose_root(args.dir)
    common.announce("progress", root)
    with common.scratch(root, "progress") as scratch:
        run = scratch / "attempt-1"
        run.mkdir(parents=True)
        (run / "stdout").touch(mode=0o600)
        found = Current("job", 1, "bench.noop", scratch, run)
        calls = args.calls
        started = time.perf_counter()
        for _ in range(calls):
            time.monotonic()
        bare = (time.perf_counter() - started) / calls * 1e6
        started = time.perf_counter()
        for n in range(calls):
            found.progress(n, calls)
        limited = (time.perf_counter() - started) / calls * 1e6
        writes = max(1, calls // 100)
        started = time.perf_counter()
        for n in range(writes):
            found.progress(n + 1, n + 1)
        written = (time.perf_counter() - started) / writes * 1e6
        assert os.path.exists(Path(run, "progress.json"))
    results = {"bare_loop_us": bare, "progress_us": limited, "ratio": common.ratio(limited, bare), "write_us": written}
    common.print_table(
        f"progress(): {calls:,} calls in a tight loop (rate-limited), {writes:,} that each write",
        ["bare loop µs/call", "progress µs/call", "ratio", "one write µs"],
        [[f"{bare:.3f}", f"{limited:.3f}", f"{results['ratio']:.1f}", f"{written:.1f}"]],
    )
    common.emit_json("progress", root, results)
    return results


if __name__ == "__main__":
    main()
