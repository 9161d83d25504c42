"""`forkvisor web` over HTTP: what it serves, what it refuses. A real server process on a
real queue; requests made with the standard library."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobs import Queue, State
from tests import sample_jobs
from tests.cli.conftest import cli, refused
from tests.conftest import wait_until
from tests.processes import Processes

SECRET = "s3cret-token"


class Web:
    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def get(
        self, path: str, headers: dict[str, str] | None = None, method: str = "GET"
    ) -> tuple[int, dict[str, str], bytes]:
        request = urllib.request.Request(self.url + path, headers=headers or {}, method=method)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), error.read()

    def json(self, path: str, headers: dict[str, str] | None = None) -> Any:
        status, _, body = self.get(path, headers)
        assert status == 200, (path, status, body)
        return json.loads(body)


def start_web(procs: Processes, *args: str | Path) -> tuple[subprocess.Popen[bytes], Web]:
    server = procs.forkvisor("web", *map(str, args), "--port", "0", name="web")
    found: list[str] = []

    def listening() -> bool:
        found[:] = re.findall(r"^http://\S+/$", procs.log(server), re.M)
        return bool(found) or server.poll() is not None

    wait_until(listening, 15, "the web server listens")
    assert found, procs.log(server)
    return server, Web(found[0])


@pytest.fixture
def web(procs: Processes, queue: Queue) -> Iterator[Web]:
    server, found = start_web(procs, queue.path)
    yield found
    server.terminate()
    assert procs.wait_exit(server, 10, "the web server stops") == 0


def test_the_page_and_its_files_are_served_with_a_strict_policy(web: Web) -> None:
    for path, kind in [("/", "text/html"), ("/app.js", "text/javascript"), ("/style.css", "text/css")]:
        status, headers, body = web.get(path)
        assert status == 200, path
        assert headers["Content-Type"].startswith(kind)
        assert "script-src 'self'" in headers["Content-Security-Policy"]
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert body


def test_the_overview_shows_counts_managers_and_running_jobs(
    procs: Processes, queue: Queue, web: Web, barriers: Path
) -> None:
    started, release = barriers / "started", barriers / "release"
    running = queue.enqueue(sample_jobs.wait_release, str(started), str(release))
    queue.enqueue(sample_jobs.ok, "done soon")
    manager = procs.manager(queue)
    wait_until(started.exists, 10, "the job started", manager=manager)
    wait_until(lambda: queue.counts()["done"] == 1, 10, "the other job ran", manager=manager)
    manager.step(0.1)

    def shown() -> dict[str, Any]:
        return web.json("/api/overview")["queues"][0]["status"]  # type: ignore[no-any-return]

    wait_until(lambda: shown()["counts"]["done"] == 1 and shown()["running"], 10, "the page sees them", manager=manager)
    status = shown()
    assert status["queue"] == str(queue.path)
    assert [job["id"] for job in status["running"]] == [running]
    (mine,) = status["managers"]
    assert (mine["owner"], mine["busy"], mine["concurrency"]) == (manager.owner.name, 1, 2)
    release.touch()
    wait_until(lambda: shown()["counts"]["done"] == 2, 10, "the count changes", manager=manager)


def test_a_job_page_shows_its_cause_and_output(procs: Processes, queue: Queue, web: Web) -> None:
    job_id = queue.with_options(max_attempts=1).enqueue(sample_jobs.print_and_fail, "said before dying")
    manager = procs.manager(queue)
    wait_until(lambda: queue.job(job_id).state is State.DEAD, 10, "the job died", manager=manager)
    job = web.json(f"/api/job?queue=0&id={job_id}")
    assert job["state"] == "dead"
    assert "attempts exhausted" in job["error"]["reason"]
    assert "said before dying" in job["output"]["1"]["stdout"]
    assert job["events"]
    listed = web.json("/api/jobs?queue=0&state=dead")
    assert [row["id"] for row in listed["jobs"]] == [job_id]


def test_the_job_list_pages_through_a_state(queue: Queue, web: Web) -> None:
    ids = [queue.enqueue(sample_jobs.ok, n) for n in range(7)]
    first = web.json("/api/jobs?queue=0&state=ready&limit=3")
    second = web.json(f"/api/jobs?queue=0&state=ready&limit=3&after={first['next']}")
    third = web.json(f"/api/jobs?queue=0&state=ready&limit=3&after={second['next']}")
    shown = [row["id"] for page in (first, second, third) for row in page["jobs"]]
    assert sorted(shown) == sorted(ids)
    assert third["next"] is None


@pytest.mark.parametrize(
    "path",
    [
        "/api/job?queue=0&id=../../../etc/passwd",
        "/api/job?queue=0&id=%2Fetc%2Fpasswd",
        "/api/job?queue=0&id=20200101-000000-000000-0badc0de",  # a job id, but no such job
        "/api/job?queue=1&id=20200101-000000-000000-0badc0de",  # no such queue
        "/api/job?queue=-1&id=20200101-000000-000000-0badc0de",
        "/api/jobs?queue=7&state=done",
        "/../../etc/passwd",
        "/static/../web.py",
        "/app.js/../../web.py",
        "/%2e%2e/%2e%2e/etc/passwd",
        "/queue.json",
    ],
)
def test_nothing_outside_what_it_serves_is_read(web: Web, path: str) -> None:
    status, _, body = web.get(path)
    assert status == 404, (path, body)
    assert b"root:" not in body
    assert b"import" not in body


@pytest.mark.parametrize(
    "path",
    [
        "/api/jobs?queue=0&state=../../etc",
        "/api/jobs?queue=x&state=done",
        "/api/jobs?queue=0&state=done&limit=many",
        "/api/job?queue=%00&id=x",
    ],
)
def test_a_malformed_parameter_is_a_400_that_says_which(web: Web, path: str) -> None:
    status, _, body = web.get(path)
    assert status == 400, (path, body)
    assert json.loads(body)["error"]


def test_after_and_function_are_names_never_paths(queue: Queue, web: Web) -> None:
    queue.enqueue(sample_jobs.ok, 1)
    for query in ("after=../../../etc", "after=%2F", "function=../../etc/passwd"):
        listed = web.json(f"/api/jobs?queue=0&state=ready&{query}")
        assert all(row["function"] == "sample.ok" for row in listed["jobs"]), query


def test_it_is_read_only(web: Web) -> None:
    for method in ("POST", "PUT", "DELETE"):
        status, _, _ = web.get("/api/overview", method=method)
        assert status == 405, method


def test_a_request_for_another_host_is_refused_on_loopback(web: Web) -> None:
    """A page elsewhere that rebinds its own name to 127.0.0.1 cannot read the queue."""
    status, _, body = web.get("/api/overview", {"Host": "attacker.example:9810"})
    assert status == 403, body
    assert web.get("/api/overview", {"Host": "localhost"})[0] == 200


def test_with_a_token_every_request_needs_it(procs: Processes, queue: Queue) -> None:
    server, web = start_web(procs, queue.path, "--token", SECRET)
    for path in ("/", "/metrics", "/api/overview"):
        assert web.get(path)[0] == 401, path
        assert web.get(path, {"Authorization": "Bearer wrong"})[0] == 401, path
        assert web.get(path, {"Authorization": f"Bearer {SECRET}"})[0] == 200, path
    assert web.get(f"/api/overview?token={SECRET}")[0] == 200
    server.terminate()
    procs.wait_exit(server, 10, "the web server stops")


def test_binding_beyond_loopback_without_a_token_warns(procs: Processes, queue: Queue) -> None:
    server, web = start_web(procs, queue.path, "--bind", "0.0.0.0")
    assert "without a token" in procs.log(server)
    assert web.get("/metrics", {"Host": "anything"})[0] == 200  # not loopback: any Host
    server.terminate()
    procs.wait_exit(server, 10, "the web server stops")


def test_metrics_are_served_too(web: Web) -> None:
    status, headers, body = web.get("/metrics")
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain")
    assert b"forkvisor_jobs{" in body


def test_one_page_for_several_queues_served_by_one_manager(procs: Processes, tmp_path: Path) -> None:
    urgent, default = Queue(tmp_path / "urgent"), Queue(tmp_path / "default")
    urgent.enqueue(sample_jobs.ok, "u")
    for n in range(3):
        default.enqueue(sample_jobs.ok, n)
    manager = procs.manager([urgent, default])
    wait_until(lambda: urgent.counts()["done"] + default.counts()["done"] == 4, 15, "the jobs ran", manager=manager)
    server, web = start_web(procs, urgent.path, default.path)
    shown = web.json("/api/overview")["queues"]
    assert [entry["status"]["queue"] for entry in shown] == [str(urgent.path), str(default.path)]
    assert [entry["status"]["counts"]["done"] for entry in shown] == [1, 3]
    assert all(len(entry["status"]["managers"]) == 1 for entry in shown)  # the one manager, in each
    assert web.json("/api/jobs?queue=1&state=done")["queue"] == str(default.path)
    server.terminate()
    assert procs.wait_exit(server, 10, "the web server stops") == 0


def test_a_port_in_use_is_one_line_and_exit_111(procs: Processes, queue: Queue) -> None:
    server, web = start_web(procs, queue.path)
    port = web.url.rsplit(":", 1)[1]
    taken = cli("web", queue.path, "--port", port)
    refused(taken, 111, "cannot listen on 127.0.0.1:" + port)
    refused(cli("web", queue.path, "--port", "70000"), 2, "--port")
    server.terminate()
    assert procs.wait_exit(server, 10, "the web server stops") == 0
