"""Web page and metrics: how long each request of `forkvisor web` takes with many done jobs.

    python -m benchmarks.web [--done 100000] [--rounds 3] [--dir DIR]

A queue is filled with N fabricated done jobs (docs/FORMAT.md, as `benchmarks.scale`
does) and a few ready ones; `forkvisor web` serves it from a subprocess. Timed, as a
browser or Prometheus would ask, each request after the server's snapshot cache ran
out (so each reads the folder): the overview (counts, managers, oldest wait), the first
page of done/, a page from the middle, one job's page, and /metrics; and
`forkvisor metrics` as a whole process. Reference, in the same rounds: a bare scandir
count of done/ (what any listing of the folder costs at least). Also the server's RSS.
A function filter that matches nothing reads every job.json: timed once with
--filter (minutes at a million).
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import subprocess
import sys
import time
import urllib.request
from typing import Any

from benchmarks import common
from benchmarks.scale import fabricate
from jobs import Queue
from supervisor import web

TOKEN = secrets.token_urlsafe(32)  # every request for data carries it, as a browser's or Prometheus's does


def _get(url: str) -> float:
    started = time.perf_counter()
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=600) as response:
        response.read()
    return time.perf_counter() - started


def _serve(queue: Queue) -> tuple[subprocess.Popen[str], str]:
    server = subprocess.Popen(
        [sys.executable, "-m", "supervisor.cli", "web", str(queue.path), "--port", "0", "--log-level", "WARNING"],
        cwd=common.REPO,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "FORKVISOR_WEB_TOKEN": TOKEN},  # given: none is made and kept in a runtime folder
    )
    assert server.stdout is not None
    line = server.stdout.readline()
    if not re.match(r"^http://\S+/$", line):
        server.kill()
        raise RuntimeError(f"forkvisor web did not start: {line!r}")
    return server, line.strip().rstrip("/")


def measure(queue: Queue, rounds: int, with_filter: bool) -> dict[str, Any]:
    server, url = _serve(queue)
    names = sorted(p.name for p in (queue.path / "done").iterdir())
    middle, one = names[len(names) // 2], names[len(names) // 3]
    requests = {
        "overview": "/api/overview",
        "done, first page": "/api/jobs?queue=0&state=done&limit=50",
        "done, middle page": f"/api/jobs?queue=0&state=done&limit=50&after={middle}",
        "one job": f"/api/job?queue=0&id={one}",
        "/metrics": "/metrics",
    }
    times: dict[str, list[float]] = {name: [] for name in [*requests, "forkvisor metrics", "scandir count"]}
    try:
        for _ in range(rounds):
            for name, path in requests.items():
                time.sleep(web.REFRESH + 0.1)  # past the snapshot cache: each request reads the folder
                times[name].append(_get(url + path))
            times["forkvisor metrics"].append(
                common.timed(
                    lambda: subprocess.run(
                        [sys.executable, "-m", "supervisor.cli", "metrics", str(queue.path)],
                        cwd=common.REPO,
                        check=True,
                        stdout=subprocess.DEVNULL,
                    )
                ).wall
            )
            times["scandir count"].append(common.timed(lambda: sum(1 for _ in (queue.path / "done").iterdir())).wall)
        if with_filter:
            times["function filter matching nothing"] = [
                _get(url + "/api/jobs?queue=0&state=done&limit=50&function=nothing.here")
            ]
        rss = common.rss_mb(server.pid)
    finally:
        server.terminate()
        server.wait()
        if server.stdout is not None:
            server.stdout.close()
    return {"seconds": {name: common.summary(values) for name, values in times.items()}, "server_rss_mb": rss}


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f}"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_common_options(parser)
    parser.add_argument("--done", type=int, default=100_000, help="done jobs in the queue (default 100,000)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--filter", action="store_true", help="also time a function filter matching nothing")
    args = parser.parse_args(argv)
    root = common.choose_root(args.dir)
    common.announce("web", root)
    with common.scratch(root, "web") as scratch:
        queue = Queue(scratch / "queue", durable=False)
        started = time.perf_counter()
        fabricate(queue.path / "done", args.done, ready=False)
        fabricate(queue.path / "ready", 100, ready=True)
        print(f"fabricated {args.done:,} done jobs in {time.perf_counter() - started:.1f}s", flush=True)
        found = measure(queue, args.rounds, args.filter)
    reference = found["seconds"]["scandir count"]["median"]
    rows = [
        [name, _ms(s["median"]), f"{_ms(s['min'])}-{_ms(s['max'])}", f"{s['median'] / reference:.1f}"]
        for name, s in found["seconds"].items()
    ]
    common.print_table(
        f"forkvisor web with {args.done:,} done jobs (ms; x: times a bare scandir count of done/)",
        ["request", "median ms", "range", "x scandir"],
        rows,
    )
    print(f"server RSS after: {found['server_rss_mb']:.1f} MiB")
    results = {"done_jobs": args.done, **found}
    common.emit_json("web", root, results)
    return results


if __name__ == "__main__":
    main()
