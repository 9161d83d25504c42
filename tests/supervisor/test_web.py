"""`forkvisor web` over HTTP: what it serves, what it refuses, and what a client may cost
it. A real server process on a real queue; requests made with the standard library and
raw sockets. Every JSON answer is parsed strictly (NaN, Infinity refused)."""

from __future__ import annotations

import configparser
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from jobs import Queue, State
from supervisor import snapshot
from supervisor import web as web_module
from tests import sample_jobs
from tests.cli.conftest import cli, refused
from tests.conftest import REPO, wait_until
from tests.processes import Processes

SECRET = "s3cret-token"
DATA_PATHS = ("/metrics", "/api/overview", "/api/jobs?queue=0&state=ready", "/api/job?queue=0&id=")


def strict_json(body: bytes) -> Any:
    """JSON as any parser takes it: NaN, Infinity and -Infinity (which Python's json writes
    and reads, and JavaScript's JSON.parse refuses) are an error here too."""

    def refuse(constant: str) -> None:
        raise ValueError(f"invalid JSON: {constant} in {body[:300]!r}")

    return json.loads(body, parse_constant=refuse)


class Web:
    """A running `forkvisor web`: its URL, and its token (None if it needs none)."""

    def __init__(self, url: str, token: str | None) -> None:
        self.url = url.rstrip("/")
        self.token = token

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def page(self, fragment: str = "") -> str:
        """The page's address as the server printed it (the token in it), `#fragment` after."""
        query = "" if self.token is None else f"?token={self.token}"
        return f"{self.url}/{query}{fragment}"

    def get(
        self, path: str, headers: dict[str, str] | None = None, method: str = "GET", *, authorized: bool = True
    ) -> tuple[int, dict[str, str], bytes]:
        sent = {"Authorization": f"Bearer {self.token}"} if authorized and self.token else {}
        request = urllib.request.Request(self.url + path, headers={**sent, **(headers or {})}, method=method)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), error.read()

    def json(self, path: str, headers: dict[str, str] | None = None) -> Any:
        status, _, body = self.get(path, headers)
        assert status == 200, (path, status, body)
        return strict_json(body)


def start_web(procs: Processes, *args: str | Path, prefix: tuple[str, ...] = ()) -> tuple[subprocess.Popen[bytes], Web]:
    """`forkvisor web ARGS... --port 0`, once it listens: the URL it printed (with the token
    it made in it, if it made one)."""
    server = procs.forkvisor("web", *map(str, args), "--port", "0", name="web", prefix=prefix)
    found: list[tuple[str, str]] = []

    def listening() -> bool:
        found[:] = re.findall(r"^(http://\S+?/)(?:\?token=(\S+))?$", procs.log(server), re.M)
        return bool(found) or server.poll() is not None

    wait_until(listening, 15, "the web server listens")
    assert found, procs.log(server)
    url, token = found[0]
    return server, Web(url, unquote(token) or None)


def stop(procs: Processes, server: subprocess.Popen[bytes]) -> None:
    server.terminate()
    assert procs.wait_exit(server, 10, "the web server stops") == 0, procs.log(server)


@pytest.fixture(autouse=True)
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The runtime folder the servers of a test keep their token in (never the real one)."""
    folder = tmp_path / "runtime"
    folder.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(folder))
    for name in ("RUNTIME_DIRECTORY", "FORKVISOR_WEB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    return folder


@pytest.fixture
def web(procs: Processes, queue: Queue) -> Iterator[Web]:
    server, found = start_web(procs, queue.path)
    yield found
    stop(procs, server)


def test_the_page_and_its_files_are_served_with_a_strict_policy(web: Web) -> None:
    for path, kind in [("/", "text/html"), ("/app.js", "text/javascript"), ("/style.css", "text/css")]:
        status, headers, body = web.get(path)
        assert status == 200, path
        assert headers["Content-Type"].startswith(kind)
        assert "script-src 'self'" in headers["Content-Security-Policy"]
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert headers["Connection"] == "close"
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
    assert strict_json(body)["error"]


def test_after_and_function_are_names_never_paths(queue: Queue, web: Web) -> None:
    queue.enqueue(sample_jobs.ok, 1)
    for query in ("after=../../../etc", "after=%2F", "function=../../etc/passwd"):
        listed = web.json(f"/api/jobs?queue=0&state=ready&{query}")
        assert all(row["function"] == "sample.ok" for row in listed["jobs"]), query


def test_it_is_read_only(web: Web) -> None:
    for method in ("POST", "PUT", "DELETE", "HEAD"):
        status, headers, _ = web.get("/api/overview", method=method)
        assert status == 405, method
        assert headers["Allow"] == "GET"


def test_a_request_for_another_host_is_refused_on_loopback(web: Web) -> None:
    """A page elsewhere that rebinds its own name to 127.0.0.1 cannot read the queue."""
    status, _, body = web.get("/api/overview", {"Host": "attacker.example:9810"})
    assert status == 403, body
    assert web.get("/api/overview", {"Host": "localhost"})[0] == 200


# -- the token ---------------------------------------------------------------------------


def test_every_request_for_the_queues_data_needs_the_token(queue: Queue, web: Web) -> None:
    """Loopback is open to every user of the host: the data is behind the token made at
    start. The page's three files are not (they are the package's, the same for everyone),
    so a browser can load them before the page sends the token it was given."""
    job_id = queue.enqueue(sample_jobs.ok, "a secret argument")
    assert web.token is not None
    for path in (*DATA_PATHS[:-1], DATA_PATHS[-1] + job_id):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {web.token}"}):
            status, found, body = web.get(path, headers, authorized=False)
            assert status == 401, (path, headers, body)
            assert "token" in strict_json(body)["error"]
            assert b"a secret argument" not in body
            assert str(queue.path).encode() not in body
            assert found["WWW-Authenticate"].startswith("Bearer")
        assert web.get(path)[0] == 200, path
        assert web.get(f"{path}{'&' if '?' in path else '?'}token={web.token}", authorized=False)[0] == 200, path
    assert b"a secret argument" in web.get(DATA_PATHS[-1] + job_id)[2]
    for path, name in (("/", "index.html"), ("/app.js", "app.js"), ("/style.css", "style.css")):
        status, _, body = web.get(path, authorized=False)
        assert status == 200, path
        assert body == resources.files("supervisor").joinpath("static", name).read_bytes()


def test_a_made_token_is_kept_owner_only_printed_once_and_removed_at_exit(
    procs: Processes, queue: Queue, runtime: Path
) -> None:
    server, web = start_web(procs, queue.path)
    assert web.token is not None
    assert len(web.token) >= 40
    kept = runtime / "forkvisor" / f"web-{web.port}.token"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert stat.S_IMODE(kept.parent.stat().st_mode) == 0o700
    assert kept.read_text() == web.token + "\n"
    log = procs.log(server)
    assert log.count(web.token) == 1, log  # in the printed URL only: the log names the file
    assert str(kept) in log
    assert web.get("/api/overview")[0] == 200
    stop(procs, server)
    assert not kept.exists()  # the token dies with the server


def test_a_token_is_read_from_a_file_or_the_environment(
    procs: Processes, queue: Queue, tmp_path: Path, runtime: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    given = tmp_path / "token"
    given.write_text(f"{SECRET}\n")
    given.chmod(0o640)  # a group may read it (a service's group); others may not
    server, web = start_web(procs, queue.path, "--token-file", given)
    assert web.token is None  # the operator's token is not printed
    assert SECRET not in procs.log(server)
    assert web.get("/api/overview")[0] == 401
    assert web.get("/api/overview", {"Authorization": f"Bearer {SECRET}"})[0] == 200
    stop(procs, server)
    monkeypatch.setenv("FORKVISOR_WEB_TOKEN", SECRET)
    server, web = start_web(procs, queue.path)
    assert web.get("/metrics", {"Authorization": f"Bearer {SECRET}"})[0] == 200
    assert web.get("/metrics")[0] == 401
    stop(procs, server)
    assert not (runtime / "forkvisor").exists()  # none was made


def test_a_token_others_could_read_is_refused(
    queue: Queue, tmp_path: Path, runtime: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    given = tmp_path / "token"
    given.write_text(SECRET)
    refused(cli("web", queue.path, "--token", SECRET, "--port", "0"), 2, "--token-file", "FORKVISOR_WEB_TOKEN")
    given.chmod(0o644)
    refused(cli("web", queue.path, "--token-file", given, "--port", "0"), 111, "every user", f"chmod o-r {given}")
    given.chmod(0o600)
    given.write_text("two words\n")
    refused(cli("web", queue.path, "--token-file", given, "--port", "0"), 2, "letters, digits", "secrets")
    refused(cli("web", queue.path, "--token-file", tmp_path / "none", "--port", "0"), 111, "cannot read")
    refused(cli("web", queue.path, "--no-token", "--token-file", given, "--port", "0"), 2, "--no-token")
    refused(cli("web", queue.path, "--socket", tmp_path / "s", "--port", "0"), 2, "--socket", "--port")
    (runtime / "forkvisor").mkdir(mode=0o700)
    (runtime / "forkvisor").chmod(0o777)  # a folder others may write: they could swap the file
    refused(cli("web", queue.path, "--port", "0"), 111, "others may write", "chmod go-w")
    monkeypatch.setenv("FORKVISOR_WEB_TOKEN", SECRET)
    refused(cli("web", queue.path, "--token-file", given, "--port", "0"), 2, "one of them")


def test_a_service_keeps_its_token_where_the_example_unit_says(
    procs: Processes, queue: Queue, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """examples/systemd/forkvisor-web.service: systemd makes the RuntimeDirectory (its
    user's, the mode the unit says) and names it in $RUNTIME_DIRECTORY; the token is kept
    there, and the URL that carries it goes to stdout, which the unit keeps out of the journal."""
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read(REPO / "examples" / "systemd" / "forkvisor-web.service")
    service = unit["Service"]
    assert service["StandardOutput"] == "null"
    assert "--token " not in service["ExecStart"]
    assert "--no-token" not in service["ExecStart"]
    folder = tmp_path / "run" / service["RuntimeDirectory"]
    folder.mkdir(parents=True, mode=int(service["RuntimeDirectoryMode"], 8))
    monkeypatch.setenv("RUNTIME_DIRECTORY", str(folder))
    server, web = start_web(procs, queue.path)
    kept = folder / f"web-{web.port}.token"
    assert kept.read_text() == f"{web.token}\n"
    said = (REPO / "examples" / "systemd" / "forkvisor-web.service").read_text()
    assert f"sudo cat /run/{service['RuntimeDirectory']}/web-9810.token" in said
    stop(procs, server)


def test_without_a_token_it_says_loudly_who_can_read_what(procs: Processes, queue: Queue) -> None:
    server, web = start_web(procs, queue.path, "--no-token")
    assert web.token is None
    log = procs.log(server)
    for said in ("WARNING", "WITHOUT A TOKEN", "every local user", "arguments, results, output", str(queue.path)):
        assert said in log, log
    assert web.get("/api/overview")[0] == 200
    stop(procs, server)


def test_beyond_loopback_any_host_name_but_still_the_token(procs: Processes, queue: Queue) -> None:
    server, web = start_web(procs, queue.path, "--bind", "0.0.0.0")
    assert web.get("/metrics", {"Host": "anything"}, authorized=False)[0] == 401
    assert web.get("/metrics", {"Host": "anything"})[0] == 200  # not loopback: any Host
    stop(procs, server)


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
    stop(procs, server)


def test_a_port_in_use_is_one_line_and_exit_111(procs: Processes, queue: Queue) -> None:
    server, web = start_web(procs, queue.path)
    taken = cli("web", queue.path, "--port", str(web.port))
    refused(taken, 111, f"cannot listen on 127.0.0.1:{web.port}")
    refused(cli("web", queue.path, "--port", "70000"), 2, "--port")
    assert web.get("/api/overview")[0] == 200  # the first one's token file was left alone
    stop(procs, server)


# -- what a client may cost --------------------------------------------------------------


def _connect(web: Web) -> socket.socket:
    return socket.create_connection(("127.0.0.1", web.port), timeout=10)


def _exchange(web: Web, data: bytes) -> tuple[int, bytes]:
    """Send `data` on a new connection; the status and body of the answer, read to its end."""
    with _connect(web) as sock:
        sock.sendall(data)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs prlimit (util-linux)")
def test_idle_connections_cost_no_thread_and_never_lock_a_request_out(procs: Processes, queue: Queue) -> None:
    """300 connections that never ask anything, against a server that may open 256 files
    (one thread and one descriptor each would exhaust it): it holds at most half its
    descriptors for them, closing the oldest, and answers a real request at once."""
    server, web = start_web(procs, queue.path, prefix=("prlimit", "--nofile=256:256"))
    idle = []
    try:
        for n in range(300):
            idle.append(_connect(web))
            if n % 2:
                idle[-1].sendall(b"GET /api/overview HTTP/1.1\r\n")  # half of them start a request
        started = time.monotonic()
        assert web.get("/api/overview")[0] == 200
        assert time.monotonic() - started < web_module.HEAD_SECONDS  # not once the idle ones timed out
        assert _threads(server.pid) <= web_module.WORKERS + 4  # main, sampler, workers (+ slack)
        assert len(os.listdir(f"/proc/{server.pid}/fd")) <= 128 + web_module.WORKERS + 16
    finally:
        for sock in idle:
            sock.close()
    assert web.get("/api/overview")[0] == 200
    assert server.poll() is None, procs.log(server)
    stop(procs, server)


def _closed_by_server(sock: socket.socket, trickle: bytes) -> bool:
    """Whether the server has closed `sock`: waits for it as long as the socket's timeout,
    then sends `trickle` (a slow client's next bytes)."""
    try:
        assert sock.recv(1) == b"", "the server answered a request that never ended"
        return True
    except TimeoutError:
        pass
    except ConnectionResetError:
        return True
    try:
        sock.sendall(trickle)
    except (BrokenPipeError, ConnectionResetError):
        return True
    return False


def test_a_slow_or_silent_client_is_dropped_within_seconds(web: Web) -> None:
    """A connection gets `HEAD_SECONDS` to send its request's head, however it trickles."""
    clients = {"silent": (_connect(web), b""), "slow": (_connect(web), b"x")}  # one byte a quarter second
    started = time.monotonic()
    clients["slow"][0].sendall(b"GET /api/overview HTTP/1.1\r\nX-Slow: ")
    dropped: dict[str, float] = {}
    while len(dropped) < len(clients) and time.monotonic() - started < web_module.HEAD_SECONDS + 5:
        for name, (sock, trickle) in clients.items():
            sock.settimeout(0.25)  # the pace of the trickle, and how often we look
            if name not in dropped and _closed_by_server(sock, trickle):
                dropped[name] = time.monotonic() - started
    for sock, _ in clients.values():
        sock.close()
    assert set(dropped) == set(clients), dropped
    assert all(web_module.HEAD_SECONDS - 1 <= after <= web_module.HEAD_SECONDS + 2 for after in dropped.values())
    assert web.get("/api/overview")[0] == 200


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: localhost\r\n\r\n", 414),
        (b"GET / HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"b" * 20_000 + b"\r\n\r\n", 431),
        (b"GET / HTTP/1.1\r\nHost: localhost\r\n" + b"X-Many: c\r\n" * 200 + b"\r\n", 431),
        (b"GET /api/overview HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5\r\n\r\nhello", 413),
        (b"GET /api/overview HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n", 413),
        (b"GET / HTTP/2.0\r\nHost: localhost\r\n\r\n", 400),
        (b"GET http://localhost/ HTTP/1.1\r\nHost: localhost\r\n\r\n", 400),
    ],
    ids=["long line", "long header", "many headers", "a body", "a chunked body", "version", "absolute form"],
)
def test_an_oversize_or_malformed_request_is_refused_with_the_reason(
    web: Web, request_bytes: bytes, status: int
) -> None:
    answered, body = _exchange(web, request_bytes)
    assert answered == status, body
    assert strict_json(body)["error"]


# -- JSON that any parser takes ----------------------------------------------------------


def test_a_nan_or_infinity_in_a_jobs_files_never_makes_the_json_invalid(
    procs: Processes, queue: Queue, barriers: Path
) -> None:
    """A job's result and progress are its own to write, and Python's json reads NaN and
    Infinity; the page's JSON must stay JSON (JSON.parse refuses them) whatever is read."""
    started, release = barriers / "started", barriers / "release"
    done = queue.enqueue(sample_jobs.ok, "finished")
    running = queue.enqueue(sample_jobs.wait_release, str(started), str(release))
    manager = procs.run_manager(queue)
    wait_until(lambda: queue.counts()["done"] == 1 and started.exists(), 15, "one job ran, the other runs")
    hostile = '{"value": NaN, "top": Infinity, "bottom": -Infinity, "huge": 1e999, "list": [NaN]}'
    (queue.path / "done" / done / "result.json").write_text(hostile)
    (queue.path / "done" / done / "attempt-1" / "result.json").write_text(hostile)
    (run,) = (queue.path / "claimed").glob(f"*/{running}/attempt-1")
    (run / "progress.json").write_text('{"done": NaN, "total": Infinity, "message": "half"}')
    outcome = queue.path / "done" / done / "attempt-1" / "outcome.json"
    outcome.write_text(json.dumps({**json.loads(outcome.read_text()), "wall_time": float("nan")}))
    server, web = start_web(procs, queue.path)
    overview = web.json("/api/overview")
    assert [job["id"] for job in overview["queues"][0]["status"]["running"]] == [running]
    for path, shown in [
        (f"/api/job?queue=0&id={done}", done),
        (f"/api/job?queue=0&id={running}", running),
        ("/api/jobs?queue=0&state=done", done),
        ("/api/jobs?queue=0&state=claimed", running),
    ]:
        status, _, body = web.get(path)
        found = strict_json(body)  # whatever the store's readers make of the file: valid JSON
        assert status == 200 or (status == 503 and found["error"]), (path, status, body)  # 503: a reader refused it
        assert status != 200 or shown in body.decode(), (path, body)
    release.touch()
    wait_until(lambda: queue.counts()["done"] == 2, 15, "the running job finished")
    stop(procs, server)
    manager.terminate()
    assert procs.wait_exit(manager, 15, "the manager drained") == 0


def test_non_finite_numbers_become_null_and_the_rest_is_kept() -> None:
    document = {"a": float("nan"), "b": [1.5, float("inf"), {"c": -float("inf")}], 2.0: "key", "d": "NaN"}
    assert strict_json(web_module.encode_json(document)) == {
        "a": None,
        "b": [1.5, None, {"c": None}],
        "2.0": "key",
        "d": "NaN",
    }
    assert strict_json(web_module.encode_json({float("nan"): 1})) == {"nan": 1}


def test_whatever_a_reader_returns_every_json_answer_stays_json(queue: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store's readers refuse NaN and infinities; should one let one through (or a field
    be computed into one), the page still sends JSON, with null in its place. Here the
    page's readers are made lenient, in this process, and each JSON endpoint is asked."""
    job_id = queue.enqueue(sample_jobs.ok, "x")
    real_summary, real_document = snapshot.job_summary, snapshot.job_document
    monkeypatch.setattr(snapshot, "job_summary", lambda *args: {**real_summary(*args), "created": float("nan")})
    monkeypatch.setattr(
        snapshot, "job_document", lambda *args: {**real_document(*args), "result": {"x": float("inf"), "y": [1.5]}}
    )
    monkeypatch.setattr(web_module, "_totals", lambda tally: {"succeeded": float("-inf")})
    site = web_module.Site(web_module.Board([queue]), token=None, loopback=True)

    def answer(path: str) -> Any:
        request = web_module.parse_request(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
        response = site.answer(request, None)
        assert response.status == 200, response
        return strict_json(response.body)

    assert answer("/api/overview")["queues"][0]["totals"] == {"succeeded": None}
    assert answer("/api/jobs?queue=0&state=ready")["jobs"][0]["created"] is None
    assert answer(f"/api/job?queue=0&id={job_id}")["result"] == {"x": None, "y": [1.5]}
