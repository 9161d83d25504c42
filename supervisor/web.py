"""`forkvisor web`: a status page and Prometheus `/metrics` for one or several queues,
read from their folders (any number of managers on any hosts, or none running).

Read-only: it serves what `status`, `list` and `show` print, and never writes a queue.
The standard library's threaded HTTP server is enough for a page a few people watch and
a Prometheus scrape; the page is three static files with no build step.

What it trusts: nothing that comes with a request names a file. A queue is chosen by
its index in the list the server was started with; a job id must be a job id
(`check_job_id`) and is then looked up by the store, which reaches it through its
folder handles; anything else is a 404. Responses carry a strict Content-Security-Policy
and the page writes queue text with `textContent` only, so a hostile function name or
error message is shown, never run. Bound to loopback, a request must name a loopback
host (`Host:`), so a web page elsewhere cannot read it through DNS rebinding. With a
token, every request must carry it (`Authorization: Bearer`, or `?token=` once, which
the page keeps in its session).
"""

from __future__ import annotations

import collections
import hmac
import ipaddress
import json
import logging
import os
import signal
import stat
import threading
import time
from collections.abc import Callable, Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from jobs import OUTCOMES, JobNotFound, JobsError, Queue, State, Tally, is_job_id
from supervisor import metrics, snapshot

log = logging.getLogger(__name__)
REFRESH = 2.0  # seconds a snapshot of the queues is served before it is read again
SAMPLE_EVERY = 10.0  # seconds between two points of the chart (twice the managers' stats writes: no aliasing)
HISTORY = 90  # points kept: 15 minutes
TAIL_BYTES = 16 * 1024  # of each run's stdout and stderr on a job's page
PAGE_MAX = 200
PAGE_EXAMINE = 5000  # entries a filtered page reads at most: a rare function is paged through, not scanned for
STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/style.css": ("style.css", "text/css; charset=utf-8"),
}
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}


class NotFound(Exception):
    """What the request names is not there (or is not a thing this server serves)."""


class BadRequest(Exception):
    """A parameter is malformed; the message says which and how."""


class Board:
    """What the page shows, read from the queues; shared by the request threads (one lock:
    a queue's handles and caches are not for two threads at once)."""

    def __init__(self, queues: Sequence[Queue]) -> None:
        self.queues = list(queues)
        self._lock = threading.Lock()
        self._taken: list[metrics.Reading] = []
        self._taken_at = -REFRESH
        self._history: list[collections.deque[dict[str, float]]] = [
            collections.deque(maxlen=HISTORY) for _ in self.queues
        ]

    def overview(self) -> dict[str, Any]:
        with self._lock:
            readings = self._readings()
            return {
                "now": time.time(),
                "queues": [
                    {
                        "index": index,
                        "status": None if taken is None else taken.to_json(),
                        "totals": None if tally is None else _totals(tally),
                        "history": list(self._history[index]),
                    }
                    for index, (_, taken, tally) in enumerate(readings)
                ],
            }

    def exposition(self) -> bytes:
        with self._lock:
            readings = self._readings()
        return metrics.render(metrics.families(readings))

    def sample(self) -> None:
        """One point of each queue's chart: runs counted so far (the page plots the differences)."""
        with self._lock:
            now = time.time()
            for index, queue in enumerate(self.queues):
                try:
                    totals = _totals(queue.stats())
                except (OSError, JobsError):
                    continue
                self._history[index].append({"time": now, **totals})

    def jobs(self, index: int, state: str, function: str | None, after: str | None, limit: int) -> dict[str, Any]:
        try:
            wanted = State(state)
        except ValueError:
            raise BadRequest(f"state must be one of {', '.join(s.value for s in State)}") from None
        queue = self._queue(index)
        with self._lock:
            found = queue.page(wanted, limit, after or None, function or None, examine=PAGE_EXAMINE)
            served = snapshot.served(queue)
            rows = [
                {**snapshot.job_summary(job, snapshot.policy_of(queue, job, served)), "what": snapshot.describe(job)}
                for job in found.jobs
            ]
        return {"queue": str(queue.path), "jobs": rows, "next": found.next}

    def job(self, index: int, job_id: str) -> dict[str, Any]:
        queue = self._queue(index)
        if not is_job_id(job_id):
            raise NotFound(f"{job_id!r:.80} is not a job id")
        with self._lock:
            try:
                job = queue.job(job_id)
            except JobNotFound:
                raise NotFound(f"no job {job_id} in {queue.path}") from None
            events = queue.events(job.id)
            policy = snapshot.policy_of(queue, job, snapshot.served(queue))
            found = snapshot.job_document(job, policy, events)
            found["progress"] = queue.run_progress(job) if job.state is State.CLAIMED else None
            found["what"] = snapshot.describe(job)
            found["output"] = {
                str(run.number): {name: _tail(queue, job.id, run.number, name) for name in ("stdout", "stderr")}
                for run in job.history[-3:]
            }
        return found

    def _queue(self, index: int) -> Queue:
        if not 0 <= index < len(self.queues):
            raise NotFound(f"no queue {index}: this server shows {len(self.queues)}")
        return self.queues[index]

    def _readings(self) -> list[metrics.Reading]:
        """A snapshot of each queue, read again once it is `REFRESH` seconds old."""
        if time.monotonic() - self._taken_at >= REFRESH:
            self._taken = metrics.read(self.queues)
            self._taken_at = time.monotonic()
        return self._taken


def _totals(tally: Tally) -> dict[str, float]:
    per_outcome = collections.Counter[str]()
    for (_, outcome), count in tally.runs.items():
        per_outcome[outcome] += count
    return {outcome: per_outcome[outcome] for outcome in OUTCOMES}


def _tail(queue: Queue, job_id: str, run: int, name: str) -> str | None:
    """The last `TAIL_BYTES` of a run's output, or None if it wrote none (or not a file)."""
    try:
        found = queue.open_output(job_id, run, name)
    except (OSError, JobsError):
        return None
    if found is None:
        return None
    with found:
        size = os.fstat(found.fileno())
        if not stat.S_ISREG(size.st_mode):
            return None
        found.seek(max(0, size.st_size - TAIL_BYTES))
        return found.read(TAIL_BYTES).decode("utf-8", "replace")


class Handler(BaseHTTPRequestHandler):
    """GET only: the page's files, its JSON, and `/metrics`."""

    server: Server
    server_version = "forkvisor-web"
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        params = {key: values[-1] for key, values in parse_qs(url.query).items()}
        refusal = self.server.refusal(self.headers.get("Host", ""), self.headers.get("Authorization", ""), params)
        if refusal is not None:
            self._error(*refusal)
            return
        try:
            self._route(url.path, params)
        except NotFound as exc:
            self._error(HTTPStatus.NOT_FOUND, str(exc))
        except BadRequest as exc:
            self._error(HTTPStatus.BAD_REQUEST, str(exc))
        except (OSError, JobsError) as exc:  # the queue cannot be read now (gone, unreadable, a full disk)
            self._error(HTTPStatus.SERVICE_UNAVAILABLE, f"cannot read the queue now: {exc}")
        except Exception:  # a bug: said in the log and to the page, and the server goes on
            log.exception("internal error serving %s: this is a bug in forkvisor, please report it", url.path)
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, "internal error: see the server's log")

    def _route(self, path: str, params: dict[str, str]) -> None:
        board = self.server.board
        if path in STATIC:
            name, kind = STATIC[path]
            self._send(HTTPStatus.OK, _static(name), kind)
        elif path == "/metrics":
            self._send(HTTPStatus.OK, board.exposition(), metrics.CONTENT_TYPE)
        elif path == "/api/overview":
            self._json(board.overview())
        elif path == "/api/jobs":
            limit = min(max(_number(params, "limit", 50), 1), PAGE_MAX)
            state, function, after = params.get("state", "ready"), params.get("function"), params.get("after")
            self._json(board.jobs(_number(params, "queue", 0), state, function, after, limit))
        elif path == "/api/job":
            self._json(board.job(_number(params, "queue", 0), params.get("id", "")))
        else:
            raise NotFound(f"nothing at {path[:80]}")

    def _error(self, status: HTTPStatus, words: str) -> None:
        self._send(status, json.dumps({"error": words}).encode(), "application/json")

    def _json(self, document: Any) -> None:
        self._send(HTTPStatus.OK, json.dumps(document, default=str).encode(), "application/json")

    def _send(self, status: HTTPStatus, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        for name, value in HEADERS.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _refuse_method(self) -> None:
        self._send(HTTPStatus.METHOD_NOT_ALLOWED, b'{"error": "read-only: GET only"}', "application/json")

    do_POST = do_PUT = do_DELETE = do_PATCH = _refuse_method

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)


def _number(params: dict[str, str], name: str, default: int) -> int:
    text = params.get(name)
    if text is None:
        return default
    if not text.isascii() or not text.lstrip("-").isdigit():
        raise BadRequest(f"{name} must be a whole number, not {text!r:.40}")
    return int(text)


def _static(name: str) -> bytes:
    return resources.files("supervisor").joinpath("static", name).read_bytes()


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, board: Board, bind: str, port: int, token: str | None) -> None:
        self.board = board
        self.token = token
        self.loopback = is_loopback(bind)
        super().__init__((bind, port), Handler)

    def refusal(self, host: str, authorization: str, params: dict[str, str]) -> tuple[HTTPStatus, str] | None:
        """Why a request is refused (status, words), None if it is served."""
        if self.loopback and _host_name(host) not in LOOPBACK_NAMES:
            return HTTPStatus.FORBIDDEN, "this server answers to localhost only (Host header)"
        if self.token is None:
            return None
        given = authorization.removeprefix("Bearer ").strip() if authorization.startswith("Bearer ") else ""
        given = given or params.get("token", "")
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            return HTTPStatus.UNAUTHORIZED, "a token is needed: Authorization: Bearer TOKEN, or ?token=TOKEN"
        return None


def _host_name(host: str) -> str:
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def is_loopback(bind: str) -> bool:
    try:
        return ipaddress.ip_address(bind).is_loopback
    except ValueError:
        return bind == "localhost"


def serve(
    queues: Sequence[Queue],
    bind: str = "127.0.0.1",
    port: int = 9810,
    token: str | None = None,
    ready: Callable[[Server], None] | None = None,
) -> None:
    """Serve until interrupted or SIGTERM; `ready` is called with the server once it listens."""
    signal.signal(signal.SIGTERM, _stop)
    board = Board(queues)
    server = Server(board, bind, port, token)
    stop = threading.Event()
    sampler = threading.Thread(target=_sample, args=(board, stop), name="forkvisor-web-sampler", daemon=True)
    sampler.start()
    try:
        if ready is not None:
            ready(server)
        server.serve_forever(poll_interval=0.5)
    finally:
        stop.set()
        server.server_close()


def _stop(signum: int, frame: object) -> None:
    raise SystemExit(0)  # out of serve_forever, through its finally


def _sample(board: Board, stop: threading.Event) -> None:
    while not stop.is_set():
        board.sample()
        stop.wait(SAMPLE_EVERY)
