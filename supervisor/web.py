"""`forkvisor web`: a status page and Prometheus `/metrics` for one or several queues,
read from their folders (any number of managers on any hosts, or none running).

Read-only: it serves what `status`, `list` and `show` print, and never writes a queue.
The page is three static files with no build step; the server is a small loop of the
standard library's sockets and threads, made for a page a few people watch and a scrape.

Who may read what. What the page shows (every job's arguments, results and output) is as
private as the queues, and loopback is open to every user of the host, so:

- On TCP, every request for the queues' data (`/api/...`, `/metrics`) must carry the
  server's token (`Authorization: Bearer TOKEN`, or `?token=TOKEN`, which the page keeps
  in its tab's session), compared in constant time. The three static files are served
  without it: they are the package's own files and say nothing of any queue, and a
  browser fetches them without a header (a cookie would not do: browsers send a
  localhost cookie to every port, so to any other user's server there). Bound to
  loopback, a request must also name a loopback host (`Host:`), so a web page elsewhere
  cannot read it through DNS rebinding. The command makes, keeps and prints the token
  (supervisor/cli/observe.py).
- On a Unix socket, the kernel says who connects (SO_PEERCRED, SO_PEERGROUPS), and each
  queue is shown only to a user whose rights on its folder let them read it: no token.

Nothing a request carries names a file: a queue is an index into the list the server
was started with; a job id must be a job id (`is_job_id`) and is then looked up by the
store, through its folder handles; anything else is a 404. Responses carry a strict
Content-Security-Policy and the page writes queue text with `textContent` only.

What a client may cost. Idle connections cost no thread: the loop thread reads each
request's head (request line and headers, at most `HEAD_BYTES`, within `HEAD_SECONDS`
of the connection, however slowly it trickles) without blocking, and only a complete
request goes to one of `WORKERS` threads. At most `max_waiting` connections wait for
their head at once (half the descriptors the process may open, at most `MAX_WAITING`):
one more takes the place of the one that has waited longest, so an idle crowd cannot lock
a real request out. A request carries no body; each connection serves one request.

Every JSON document is valid JSON: a NaN or an infinity read from a queue's file (which
Python's json module reads, and would write as the invalid `NaN`) is sent as null.
"""

from __future__ import annotations

import collections
import errno
import hmac
import http.client
import io
import ipaddress
import json
import logging
import math
import os
import re
import resource
import selectors
import signal
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http import HTTPStatus
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from jobs import OUTCOMES, JobNotFound, JobsError, Queue, State, Tally, is_job_id
from supervisor import metrics, snapshot
from supervisor.errors import SupervisorError

log = logging.getLogger(__name__)
REFRESH = 2.0  # seconds a snapshot of the queues is served before it is read again
SAMPLE_EVERY = 10.0  # seconds between two points of the chart (twice the managers' stats writes: no aliasing)
HISTORY = 90  # points kept: 15 minutes
TAIL_BYTES = 16 * 1024  # of each run's stdout and stderr on a job's page
PAGE_MAX = 200
PAGE_EXAMINE = 5000  # entries a filtered page reads at most: a rare function is paged through, not scanned for

HEAD_BYTES = 16 * 1024  # a request line and its headers: a browser's are about 1 KiB
HEAD_SECONDS = 5.0  # from the connection to the end of its head, however it trickles
SEND_SECONDS = 10.0  # to send a response (a client that does not read it is dropped)
LINGER_SECONDS = 1.0  # reading what a client still sends after its answer, so closing does not reset it
WORKERS = 8  # threads answering complete requests (they read the queues one at a time anyway)
ADMITTED = 4 * WORKERS  # requests being answered or queued for a worker; beyond, a 503 at once
MAX_WAITING = 512  # connections waiting for their head (fewer if the descriptor limit is lower)
BACKLOG = 128

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
TOKEN_PATTERN = re.compile(r"[A-Za-z0-9._~+/=-]{1,1024}")  # safe in a header and, quoted, in a URL
SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)  # Linux 4.13+; Python does not name it
MISSING_TOKEN = (
    "a token is needed: open the URL `forkvisor web` printed when it started (it ends in ?token=...), "
    "or send Authorization: Bearer TOKEN (the token is in the file it named then)"
)


class NotFound(SupervisorError):
    """What the request names is not there (or is not a thing this server serves)."""


class BadRequest(SupervisorError):
    """A parameter is malformed; the message says which and how."""


class BadHead(SupervisorError):
    """A request's line or headers cannot be taken; `status` says how it is refused."""

    def __init__(self, status: HTTPStatus, words: str) -> None:
        super().__init__(words)
        self.status = status


def is_valid_token(text: str) -> bool:
    """A token this server can take: 1 to 1024 letters, digits or `-._~+/=`."""
    return TOKEN_PATTERN.fullmatch(text) is not None


# -- who asks, on the Unix socket ----------------------------------------------------


@dataclass(frozen=True)
class Viewer:
    """Who is on the other end of a Unix socket, as the kernel said when they connected."""

    uid: int
    groups: frozenset[int]  # their group and supplementary groups

    def may_read(self, folder: str) -> bool:
        """Whether the folder's modes let this user list it and reach it: search (x) on every
        folder above it, read and search on it. Checked as the kernel checks them: the
        owner's bits for its owner, else the group's for a member, else the others'. Root
        may. A folder that cannot be looked at is not shown (ACLs are not consulted)."""
        if self.uid == 0:
            return True
        path = Path(folder)
        try:
            above = all(self._allowed(os.stat(parent), 0o1) for parent in path.parents)
            return above and self._allowed(os.stat(path), 0o5)
        except OSError:
            return False

    def _allowed(self, info: os.stat_result, wanted: int) -> bool:
        if info.st_uid == self.uid:
            bits = info.st_mode >> 6
        elif info.st_gid in self.groups:
            bits = info.st_mode >> 3
        else:
            bits = info.st_mode
        return bits & wanted == wanted


def peer_of(connection: socket.socket) -> Viewer:
    """The user and groups of the process that connected to our Unix socket."""
    _, uid, gid = struct.unpack("3i", connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return Viewer(uid, frozenset({gid, *_peer_groups(connection)}))


def _peer_groups(connection: socket.socket) -> list[int]:
    """The peer's supplementary groups; none if the kernel cannot say (then a group's
    queue is shown only to those whose own group it is: never more than they may read)."""
    for count in (256, 65536):  # NGROUPS_MAX is 65536; most users are in a handful
        try:
            raw = connection.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, 4 * count)
        except OSError as exc:
            if exc.errno == errno.ERANGE:
                continue  # more groups than that: ask again with room for all
            return []  # a kernel before 4.13
        return list(struct.unpack(f"{len(raw) // 4}I", raw))
    return []


# -- what the page shows ---------------------------------------------------------------


class Board:
    """What the page shows, read from the queues; shared by the request threads (one lock:
    a queue's handles and caches are not for two threads at once). A `viewer` is who asks
    on a Unix socket; None (TCP, where the token decides) sees every queue."""

    def __init__(self, queues: Sequence[Queue]) -> None:
        self.queues = list(queues)
        self._folders = [os.path.realpath(queue.path) for queue in self.queues]  # as the store resolved them
        self._lock = threading.Lock()
        self._taken: list[metrics.Reading] = []
        self._taken_at = -REFRESH
        self._history: list[collections.deque[dict[str, float]]] = [
            collections.deque(maxlen=HISTORY) for _ in self.queues
        ]

    def overview(self, viewer: Viewer | None) -> dict[str, Any]:
        shown = self._shown(viewer)
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
                    if index in shown
                ],
            }

    def exposition(self, viewer: Viewer | None) -> bytes:
        shown = self._shown(viewer)
        with self._lock:
            readings = [reading for index, reading in enumerate(self._readings()) if index in shown]
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

    def jobs(
        self, viewer: Viewer | None, index: int, state: str, function: str | None, after: str | None, limit: int
    ) -> dict[str, Any]:
        try:
            wanted = State(state)
        except ValueError:
            raise BadRequest(f"state must be one of {', '.join(s.value for s in State)}") from None
        queue = self._queue(index, viewer)
        with self._lock:
            found = queue.page(wanted, limit, after or None, function or None, examine=PAGE_EXAMINE)
            served = snapshot.served(queue)
            rows = [
                {**snapshot.job_summary(job, snapshot.policy_of(queue, job, served)), "what": snapshot.describe(job)}
                for job in found.jobs
            ]
        return {"queue": str(queue.path), "jobs": rows, "next": found.next}

    def job(self, viewer: Viewer | None, index: int, job_id: str) -> dict[str, Any]:
        queue = self._queue(index, viewer)
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
            found["progress"] = queue.serving.run_progress(job) if job.state is State.CLAIMED else None
            found["what"] = snapshot.describe(job)
            found["output"] = {
                str(run.number): {name: _tail(queue, job.id, run.number, name) for name in ("stdout", "stderr")}
                for run in job.history[-3:]
            }
        return found

    def _shown(self, viewer: Viewer | None) -> set[int]:
        """The indexes of the queues `viewer` may see (checked at each request: a chmod counts at once)."""
        return {index for index, folder in enumerate(self._folders) if viewer is None or viewer.may_read(folder)}

    def _queue(self, index: int, viewer: Viewer | None) -> Queue:
        if index not in self._shown(viewer):  # one answer for "none" and "not yours": the list stays private
            raise NotFound(f"no queue {index} here")
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


def encode_json(document: Any) -> bytes:
    """`document` as JSON any parser takes. A queue's files may hold NaN or an infinity
    (Python's json reads them), which JSON has no words for: they are sent as null."""
    try:
        return json.dumps(document, default=str, allow_nan=False).encode()
    except ValueError:  # "Out of range float values are not JSON compliant"
        return json.dumps(_finite(document), default=str, allow_nan=False).encode()


def _finite(value: Any) -> Any:
    """`value` with every NaN and infinity made None (a dict key made its name)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {_finite_key(key): _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def _finite_key(key: Any) -> Any:
    return repr(key) if isinstance(key, float) and not math.isfinite(key) else key


# -- requests and responses ------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """A request's head, parsed: the method, the path, the query (last value of each
    name) and the headers (names in lower case)."""

    method: str
    path: str
    params: dict[str, str]
    headers: dict[str, str]

    @property
    def has_body(self) -> bool:
        return "transfer-encoding" in self.headers or self.headers.get("content-length", "0").strip() not in ("", "0")


def parse_request(head: bytes) -> Request:
    """The request in `head` (its line and headers, blank line included); BadHead if malformed."""
    line, _, rest = head.partition(b"\n")
    words = line.rstrip(b"\r").decode("latin-1").split(" ")
    if len(words) != 3 or words[2] not in ("HTTP/1.0", "HTTP/1.1"):
        raise BadHead(HTTPStatus.BAD_REQUEST, "the request line must be: METHOD /PATH HTTP/1.1")
    method, target, _ = words
    if not target.startswith("/"):
        raise BadHead(HTTPStatus.BAD_REQUEST, "the path must start with /")
    try:
        message = http.client.parse_headers(io.BytesIO(rest))
    except http.client.HTTPException as exc:  # over 100 header lines
        raise BadHead(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, f"too many headers: {exc}") from None
    url = urlsplit(target)
    params = {key: values[-1] for key, values in parse_qs(url.query).items()}
    return Request(method, url.path, params, {name.lower(): str(value) for name, value in message.items()})


@dataclass(frozen=True)
class Response:
    status: HTTPStatus
    body: bytes
    kind: str = "application/json"
    extra: tuple[tuple[str, str], ...] = ()

    def to_bytes(self) -> bytes:
        lines = [
            f"HTTP/1.1 {self.status.value} {self.status.phrase}",
            f"Content-Type: {self.kind}",
            f"Content-Length: {len(self.body)}",
            "Connection: close",  # one request per connection: no idle keep-alive to hold
            *(f"{name}: {value}" for name, value in HEADERS.items()),
            *(f"{name}: {value}" for name, value in self.extra),
        ]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + self.body


def error(status: HTTPStatus, words: str, *extra: tuple[str, str]) -> Response:
    return Response(status, encode_json({"error": words}), extra=extra)


class Site:
    """What each request gets: refused (method, body, Host, token), or routed to the board."""

    def __init__(self, board: Board, token: str | None, loopback: bool) -> None:
        self.board = board
        self.token = token
        self.loopback = loopback

    def answer(self, request: Request, viewer: Viewer | None) -> Response:
        if request.method != "GET":
            return error(HTTPStatus.METHOD_NOT_ALLOWED, "read-only: GET only", ("Allow", "GET"))
        if request.has_body:
            return error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "a GET carries no body: this server takes none")
        refusal = self.refusal(request)
        if refusal is not None:
            return refusal
        try:
            return self._route(request, viewer)
        except NotFound as exc:
            return error(HTTPStatus.NOT_FOUND, str(exc))
        except BadRequest as exc:
            return error(HTTPStatus.BAD_REQUEST, str(exc))
        except (OSError, JobsError) as exc:  # the queue cannot be read now (gone, unreadable, a full disk)
            return error(HTTPStatus.SERVICE_UNAVAILABLE, f"cannot read the queue now: {exc}")
        except Exception:  # a bug: said in the log and to the page, and the server goes on
            log.exception("internal error serving %s: this is a bug in forkvisor, please report it", request.path)
            return error(HTTPStatus.INTERNAL_SERVER_ERROR, "internal error: see the server's log")

    def refusal(self, request: Request) -> Response | None:
        """Why a request is refused, None if it is served."""
        if self.loopback and _host_name(request.headers.get("host", "")) not in LOOPBACK_NAMES:
            return error(HTTPStatus.FORBIDDEN, "this server answers to localhost only (Host header)")
        if self.token is None or request.path in STATIC:  # the static files are the package's: no queue's data
            return None
        authorization = request.headers.get("authorization", "")
        given = authorization[len("Bearer ") :].strip() if authorization.startswith("Bearer ") else ""
        given = given or request.params.get("token", "")
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            return error(HTTPStatus.UNAUTHORIZED, MISSING_TOKEN, ("WWW-Authenticate", 'Bearer realm="forkvisor"'))
        return None

    def _route(self, request: Request, viewer: Viewer | None) -> Response:
        path, params, board = request.path, request.params, self.board
        if path in STATIC:
            name, kind = STATIC[path]
            return Response(HTTPStatus.OK, _static(name), kind)
        if path == "/metrics":
            return Response(HTTPStatus.OK, board.exposition(viewer), metrics.CONTENT_TYPE)
        if path == "/api/overview":
            return Response(HTTPStatus.OK, encode_json(board.overview(viewer)))
        if path == "/api/jobs":
            limit = min(max(_number(params, "limit", 50), 1), PAGE_MAX)
            state, function, after = params.get("state", "ready"), params.get("function"), params.get("after")
            found = board.jobs(viewer, _number(params, "queue", 0), state, function, after, limit)
            return Response(HTTPStatus.OK, encode_json(found))
        if path == "/api/job":
            found = board.job(viewer, _number(params, "queue", 0), params.get("id", ""))
            return Response(HTTPStatus.OK, encode_json(found))
        raise NotFound(f"nothing at {path[:80]}")


def _number(params: dict[str, str], name: str, default: int) -> int:
    text = params.get(name)
    if text is None:
        return default
    if not text.isascii() or not text.lstrip("-").isdigit():
        raise BadRequest(f"{name} must be a whole number, not {text!r:.40}")
    return int(text)


def _static(name: str) -> bytes:
    return resources.files("supervisor").joinpath("static", name).read_bytes()


def _host_name(host: str) -> str:
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def is_loopback(bind: str) -> bool:
    try:
        return ipaddress.ip_address(bind).is_loopback
    except ValueError:
        return bind == "localhost"


# -- listening -------------------------------------------------------------------------


def listen_tcp(bind: str, port: int) -> socket.socket:
    """A listening TCP socket on `bind`:`port` (0: any free port)."""
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    return socket.create_server((bind, port), family=family, backlog=BACKLOG)


def listen_unix(path: Path) -> socket.socket:
    """A listening Unix socket at `path`, which every user may connect to: who sees what is
    decided per connection from the peer's credentials. A socket left there by a server
    that is gone is replaced; anything else there is refused (FileExistsError)."""
    _remove_stale_socket(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(os.fspath(path))
        os.chmod(path, 0o666)
        listener.listen(BACKLOG)
    except BaseException:
        listener.close()
        raise
    return listener


def _remove_stale_socket(path: Path) -> None:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise FileExistsError(errno.EEXIST, "it exists and is not a socket: remove it or choose another path")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(os.fspath(path))
        except ConnectionRefusedError:
            os.unlink(path)  # nobody listens: left by a server that was killed
            return
    raise OSError(errno.EADDRINUSE, "another server listens on it")


# -- the connection loop ---------------------------------------------------------------


@dataclass(eq=False)
class _Connection:
    """An accepted connection whose request head is being read."""

    sock: socket.socket
    who: str  # for the log: an address, or a uid
    viewer: Viewer | None
    since: float = field(default_factory=time.monotonic)
    head: bytearray = field(default_factory=bytearray)
    oversize: bool = False


class Server:
    """The loop that accepts connections and reads their heads (one thread, no blocking),
    and the workers that answer complete requests. See the module's docstring."""

    def __init__(self, site: Site, listener: socket.socket) -> None:
        self.site = site
        self.listener = listener
        self.address = listener.getsockname()
        self.max_waiting = _max_waiting()
        self._unix = listener.family == socket.AF_UNIX
        self._socket_file = os.stat(self.address).st_ino if self._unix else None
        self._waiting: dict[socket.socket, _Connection] = {}  # in the order they came: the oldest first
        self._selector = selectors.DefaultSelector()
        self._workers = ThreadPoolExecutor(WORKERS, thread_name_prefix="forkvisor-web")
        self._slots = threading.BoundedSemaphore(ADMITTED)
        listener.setblocking(False)
        self._selector.register(listener, selectors.EVENT_READ)

    def serve_forever(self, ready: Callable[[], None] = lambda: None) -> None:
        """Serve until SIGTERM (SIGINT raises KeyboardInterrupt); `ready` is called once a
        SIGTERM would stop it cleanly. Any thread may receive a signal, and Python runs its
        handler in the main thread only once that thread wakes: the signal's number is
        written to a socket this loop watches (a self-pipe), which wakes it, and the loop
        acts on it."""
        wakeup, signals = socket.socketpair()
        for end in (wakeup, signals):
            end.setblocking(False)
        previous = signal.set_wakeup_fd(signals.fileno(), warn_on_full_buffer=False)
        signal.signal(signal.SIGTERM, _record_only)
        self._selector.register(wakeup, selectors.EVENT_READ)
        try:
            ready()
            while not self._step(wakeup):
                pass
        finally:
            signal.set_wakeup_fd(previous)
            wakeup.close()
            signals.close()

    def _step(self, wakeup: socket.socket) -> bool:
        """Handle what is ready; True once told to stop."""
        for key, _ in self._selector.select(self._until_next_deadline()):
            if key.fileobj is wakeup:
                if signal.SIGTERM in wakeup.recv(256):
                    return True
            elif key.fileobj is self.listener:
                self._accept()
            elif key.data.sock in self._waiting:  # not closed by an earlier event of this batch
                self._read(key.data)
        self._drop_late()
        return False

    def close(self) -> None:
        for connection in list(self._waiting.values()):
            self._drop(connection)
        self._selector.close()
        self.listener.close()
        self._workers.shutdown(wait=False, cancel_futures=True)
        if self._unix:
            _unlink_if_same(self.address, self._socket_file)

    def _accept(self) -> None:
        for _ in range(BACKLOG):  # a burst at once, then back to the waiting ones
            try:
                sock, address = self.listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    log.warning("cannot accept a connection: %s; closing the one that has waited longest", exc)
                    self._drop_oldest()  # room for the next one
                    return
                continue  # this one was reset before we took it
            if len(self._waiting) >= self.max_waiting:
                self._drop_oldest()
            self._admit(sock, address)

    def _admit(self, sock: socket.socket, address: Any) -> None:
        sock.setblocking(False)
        viewer, who = None, f"{address[0]}:{address[1]}" if isinstance(address, tuple) else "?"
        if self._unix:
            try:
                viewer = peer_of(sock)
            except OSError as exc:
                log.warning("closing a connection whose peer the kernel cannot name: %s", exc)
                sock.close()
                return
            who = f"uid {viewer.uid}"
        connection = _Connection(sock, who, viewer)
        self._waiting[sock] = connection
        self._selector.register(sock, selectors.EVENT_READ, connection)

    def _read(self, connection: _Connection) -> None:
        try:
            chunk = connection.sock.recv(HEAD_BYTES + 1 - len(connection.head))
        except BlockingIOError:
            return
        except OSError:
            self._drop(connection)
            return
        if not chunk:  # gone before it asked anything
            self._drop(connection)
            return
        searched = max(0, len(connection.head) - 3)  # where a blank line could start, without scanning again
        connection.head += chunk
        end = _end_of_head(connection.head, searched)
        if end is not None:
            del connection.head[end:]  # a body or a second request: never read
            self._dispatch(connection)
        elif len(connection.head) > HEAD_BYTES:
            connection.oversize = True
            self._dispatch(connection)

    def _dispatch(self, connection: _Connection) -> None:
        self._forget(connection)
        if not self._slots.acquire(blocking=False):
            _send_now(connection.sock, error(HTTPStatus.SERVICE_UNAVAILABLE, "busy: try again in a moment"))
            connection.sock.close()
            return
        self._workers.submit(self._answer, connection)

    def _answer(self, connection: _Connection) -> None:
        """In a worker: answer the request, then close the connection."""
        sock = connection.sock
        try:
            sock.setblocking(True)
            sock.settimeout(SEND_SECONDS)  # for the whole response: sendall's timeout is its total
            response = self._response(connection)
            sock.sendall(response.to_bytes())
            log.debug("%s %r: %d", connection.who, _first_line(connection.head), response.status)
            _linger(sock)
        except OSError as exc:
            log.debug("%s went away: %s", connection.who, exc)
        except Exception:
            log.exception("internal error answering %s: this is a bug in forkvisor, please report it", connection.who)
        finally:
            sock.close()
            self._slots.release()

    def _response(self, connection: _Connection) -> Response:
        if connection.oversize:
            if b"\n" not in connection.head:
                return error(HTTPStatus.REQUEST_URI_TOO_LONG, f"the request line is over {HEAD_BYTES} bytes")
            return error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, f"the request's head is over {HEAD_BYTES} bytes")
        try:
            request = parse_request(bytes(connection.head))
        except BadHead as exc:
            return error(exc.status, str(exc))
        return self.site.answer(request, connection.viewer)

    def _until_next_deadline(self) -> float | None:
        if not self._waiting:
            return None  # nothing to drop: wait for a connection (a signal still wakes us)
        oldest = next(iter(self._waiting.values()))
        return max(0.0, oldest.since + HEAD_SECONDS - time.monotonic())

    def _drop_late(self) -> None:
        """Close the connections whose head did not arrive in time (the oldest come first)."""
        now = time.monotonic()
        while self._waiting:
            oldest = next(iter(self._waiting.values()))
            if now - oldest.since < HEAD_SECONDS:
                return
            log.debug("%s sent no request in %gs: closed", oldest.who, HEAD_SECONDS)
            self._drop(oldest)

    def _drop_oldest(self) -> None:
        if self._waiting:
            self._drop(next(iter(self._waiting.values())))

    def _drop(self, connection: _Connection) -> None:
        self._forget(connection)
        connection.sock.close()

    def _forget(self, connection: _Connection) -> None:
        del self._waiting[connection.sock]
        self._selector.unregister(connection.sock)


def _end_of_head(head: bytearray, start: int) -> int | None:
    """Where the blank line that ends the headers ends (a bare LF too, as http.server takes)."""
    ends = [at + len(mark) for mark in (b"\r\n\r\n", b"\n\n") if (at := head.find(mark, start)) >= 0]
    return min(ends, default=None)


def _first_line(head: bytearray) -> str:
    return bytes(head[:200]).split(b"\n", 1)[0].rstrip(b"\r").decode("latin-1")


def _send_now(sock: socket.socket, response: Response) -> None:
    """From the loop thread: as much of a short answer as the socket takes without waiting."""
    try:
        sock.send(response.to_bytes())
    except OSError:
        pass  # a refusal: if it cannot be said at once, closing says enough


def _linger(sock: socket.socket) -> None:
    """After the answer: say we are done, and read (briefly) what the client still sends.
    Closing a socket with unread data makes the kernel send a reset, which can destroy the
    answer before the client has read it (a 405 or 413 to a request with a body)."""
    sock.shutdown(socket.SHUT_WR)
    deadline = time.monotonic() + LINGER_SECONDS
    for _ in range(16):  # at most 16 reads of 64 KiB: a client sending more is cut off
        left = deadline - time.monotonic()
        if left <= 0:
            return
        sock.settimeout(left)
        if not sock.recv(65536):
            return


def _max_waiting() -> int:
    """How many connections may wait for their head: half the descriptors this process may
    open (the rest are for the workers' reads), at most `MAX_WAITING`."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_WAITING
    return max(8, min(MAX_WAITING, soft // 2))


def _unlink_if_same(path: str, inode: int | None) -> None:
    """Remove our socket file, unless another has taken its place since."""
    try:
        if os.lstat(path).st_ino == inode:
            os.unlink(path)
    except FileNotFoundError:
        pass  # removed already


def serve(
    queues: Sequence[Queue],
    listener: socket.socket,
    token: str | None,
    loopback: bool,
    ready: Callable[[], None] = lambda: None,
) -> None:
    """Serve on `listener` until interrupted or SIGTERM; `ready` is called once it would
    stop cleanly. A `token` is needed on TCP, unless the operator said otherwise; on a Unix
    socket the peer's credentials decide."""
    board = Board(queues)
    server = Server(Site(board, token, loopback), listener)
    stop = threading.Event()
    sampler = threading.Thread(target=_sample, args=(board, stop), name="forkvisor-web-sampler", daemon=True)
    sampler.start()
    try:
        server.serve_forever(ready)
    finally:
        stop.set()
        server.close()


def _record_only(signum: int, frame: object) -> None:
    """SIGTERM's handler: nothing. The wakeup socket carries the signal to the loop."""


def _sample(board: Board, stop: threading.Event) -> None:
    while not stop.is_set():
        board.sample()
        stop.wait(SAMPLE_EVERY)
