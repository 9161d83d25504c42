"""The status page and the other users of the host (docs/SECURITY.md, "The status page").

Loopback is open to every local user. An outside review read the arguments, results,
output and events of another user's 0700 queue through `forkvisor web`'s `/api/job` and
`/metrics`, as that other user (fveve), because the page took no token by default. Here a
real server runs as the queue's owner (or as root), and each request is made by a real
user's process (setpriv): on TCP only the token opens the data, and it is in a file only
the owner may read; on the Unix socket each user sees only the queues their rights let
them read, as the kernel names them (SO_PEERCRED). What a local user may cost the page (300
idle connections held 300 threads) and where `metrics --textfile` writes (it once followed
a link planted beside its output) are attacked by real users too, each followed by the
conservation check on the queue."""

from __future__ import annotations

import grp
import json
import os
import pwd
import select
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobs import Queue
from supervisor import web as web_module
from tests import sample_jobs
from tests.conftest import wait_until
from tests.jobs_processes.invariants import check_invariants
from tests.processes import REPO, Processes
from tests.security.conftest import ALICE, BOB, EVE, OWNER, TEAM, as_root, as_user, python_as, run_as
from tests.supervisor.test_metrics import _samples
from tests.supervisor.test_web import start_web, stop

CLIENT = r"""
import json, socket, sys
where, paths = sys.argv[1], sys.argv[2:]

def get(path):
    if where.startswith("unix:"):
        sock = socket.socket(socket.AF_UNIX)
        sock.settimeout(20)
        sock.connect(where[len("unix:"):])
    else:
        sock = socket.create_connection(("127.0.0.1", int(where[len("tcp:"):])), timeout=20)
    with sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return [int(head.split()[1]), body.decode("utf-8", "replace")]

print(json.dumps([get(path) for path in paths]))
"""
"""GET each path through `where` (tcp:PORT or unix:PATH); print [status, body] for each."""

ENQUEUE = "import sys; from jobs import Queue; from tests import sample_jobs\n" + (
    "print(Queue(sys.argv[1], create=False).enqueue(sample_jobs.ok, sys.argv[2]))"
)


def fetch(user: str | None, where: str, *paths: str) -> list[tuple[int, str]]:
    """GET each of `paths` as `user` (None: root, as this process is)."""
    if user is None:
        done = subprocess.run(
            [sys.executable, "-c", CLIENT, where, *paths], capture_output=True, text=True, timeout=60, check=False
        )
    else:
        done = python_as(user, CLIENT, where, *paths)
    assert done.returncode == 0, done
    return [(status, body) for status, body in json.loads(done.stdout)]


def enqueue_as(user: str, queue: Path, secret: str) -> str:
    done = python_as(user, ENQUEUE, queue, secret)
    assert done.returncode == 0, done
    return done.stdout.strip()


def owners_folder(open_dir: Path, name: str) -> Path:
    """A folder of the owner's, 0700, to keep a queue or a runtime folder in."""
    folder = open_dir / name
    folder.mkdir(mode=0o700)
    os.chown(folder, pwd.getpwnam(OWNER).pw_uid, pwd.getpwnam(OWNER).pw_gid)
    return folder


def test_an_outsider_reads_nothing_of_a_private_queue_through_the_page(
    users: None, open_dir: Path, procs: Processes, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = open_dir / "owner"
    home.mkdir(mode=0o755)
    os.chown(home, pwd.getpwnam(OWNER).pw_uid, pwd.getpwnam(OWNER).pw_gid)
    queue = home / "queue"
    assert run_as(OWNER, "init", queue).returncode == 0
    assert stat.S_IMODE(queue.stat().st_mode) == 0o700
    job_id = enqueue_as(OWNER, queue, "the-owners-secret")
    runtime = owners_folder(open_dir, "runtime")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))  # the owner's session's
    server, web = start_web(procs, queue, prefix=tuple(as_user(OWNER)))
    assert web.token is not None
    kept = runtime / "forkvisor" / f"web-{web.port}.token"
    assert (kept.stat().st_uid, stat.S_IMODE(kept.stat().st_mode)) == (pwd.getpwnam(OWNER).pw_uid, 0o600)

    where = f"tcp:{web.port}"
    paths = ["/api/overview", "/api/jobs?queue=0&state=ready", f"/api/job?queue=0&id={job_id}", "/metrics"]
    for status, body in fetch(EVE, where, *paths, f"/metrics?token=not-{web.token[:8]}"):
        assert status in (401, 403), body
        assert "the-owners-secret" not in body
        assert str(queue) not in body
    peek = python_as(EVE, "import sys; print(open(sys.argv[1]).read())", kept)
    assert peek.returncode != 0
    assert "Permission denied" in peek.stderr
    [(status, body)] = fetch(OWNER, where, f"/api/job?queue=0&id={job_id}&token={web.token}")
    assert status == 200
    assert "the-owners-secret" in body  # the token opens it: the refusals above are the token's doing
    stop(procs, server)


def test_on_a_unix_socket_each_user_sees_only_the_queues_they_may_read(
    users: None, open_dir: Path, shared_queue: Path, procs: Processes
) -> None:
    """One server run by root for everyone: fveve sees nothing, a member of fvteam its
    group's queues, the owner theirs too, root everything. fvowner is in fvteam only as a
    supplementary group, which the kernel gives with the peer's credentials."""
    private = owners_folder(open_dir, "private-home") / "queue"
    assert run_as(OWNER, "init", private).returncode == 0
    team = Queue(open_dir / "team").path  # root's, readable by its group
    os.chown(team, 0, grp.getgrnam(TEAM).gr_gid)
    team.chmod(0o750)
    queues = [private, shared_queue, team]
    secrets = ["private-secret", "shared-secret", "team-secret"]
    ids = [enqueue_as(OWNER, private, secrets[0]), enqueue_as(OWNER, shared_queue, secrets[1])]
    ids.append(Queue(team, create=False).enqueue(sample_jobs.ok, secrets[2]))
    sock = open_dir / "web.sock"
    server = procs.forkvisor("web", *map(str, queues), "--socket", str(sock), name="web")
    wait_until(lambda: str(sock) in procs.log(server).splitlines() or server.poll() is not None, 15, "it listens")
    assert server.poll() is None, procs.log(server)

    def visible(user: str | None) -> list[int]:
        paths = ["/api/overview", "/metrics", *(f"/api/job?queue={n}&id={job}" for n, job in enumerate(ids))]
        (_, overview), (_, exposition), *jobs = fetch(user, f"unix:{sock}", *paths)
        listed = [entry["index"] for entry in json.loads(overview)["queues"]]
        for n, (status, body) in enumerate(jobs):
            assert (status == 200) == (n in listed), (user, n, status, body)
            assert (secrets[n] in body) == (n in listed), (user, n, body)
            assert (f'queue="{queues[n]}"' in exposition) == (n in listed), (user, n)
        return listed

    assert visible(EVE) == []
    assert visible(ALICE) == [1, 2]
    assert visible(OWNER) == [0, 1, 2]
    assert visible(None) == [0, 1, 2]
    shared_queue.chmod(0o2700)  # the owner closes the shared queue: it is gone from the page at once
    assert visible(ALICE) == [2]
    server.terminate()
    assert procs.wait_exit(server, 10, "the web server stops") == 0
    assert not sock.exists()


CROWD = r"""
import json, socket, sys, time
port, head_seconds = int(sys.argv[1]), float(sys.argv[2])

def connect():
    return socket.create_connection(("127.0.0.1", port), timeout=10)

idle = []
for n in range(300):
    idle.append(connect())
    if n % 2:
        idle[-1].sendall(b"GET /api/overview HTTP/1.1\r\n")  # a request begun, never ended
slow = connect()  # the newest: only its own lateness may close it
slow.sendall(b"GET /api/overview HTTP/1.1\r\nX-Slow: ")
since = time.monotonic()
print("open", flush=True)
slow.settimeout(0.25)  # one byte a quarter second, however long the server lets it
dropped = None
while dropped is None and time.monotonic() - since < head_seconds + 5:
    try:
        got = slow.recv(1)
    except TimeoutError:
        try:
            slow.sendall(b"x")
        except (BrokenPipeError, ConnectionResetError):
            dropped = time.monotonic() - since
        continue
    except ConnectionResetError:
        got = b""
    dropped = time.monotonic() - since if got == b"" else "answered a request that never ended"
print(json.dumps(dropped), flush=True)
sys.stdin.read()  # the idle ones are held until the test has looked
"""
"""fveve's crowd: 300 connections to 127.0.0.1:PORT that never finish a request (half of
them begin one), then one that trickles its head; prints `open` once all are connected,
then how long the trickling one lasted (JSON: seconds, null if never closed)."""


def read_line(process: subprocess.Popen[bytes], timeout: float, what: str) -> str:
    """The next line `process` prints (unbuffered stdout), within `timeout` seconds."""
    assert process.stdout is not None
    deadline, line = time.monotonic() + timeout, b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([process.stdout], [], [], left)[0]:
            pytest.fail(f"timed out after {timeout:g}s waiting until {what}; read so far: {line!r}")
        byte = os.read(process.stdout.fileno(), 1)  # one at a time: nothing of the next line is taken
        if not byte:
            pytest.fail(f"{what}: the process ended first (exit {process.wait()}); read: {line!r}")
        line += byte
    return line.decode().strip()


def status_of(pid: int, field: str) -> str:
    """A field of /proc/PID/status (Threads, Uid...)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name == field:
            return value.strip()
    raise KeyError(field)


@pytest.mark.slow  # (8 s: the page must drop its slow client first)
@pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs prlimit (util-linux)")
def test_an_outsiders_idle_and_trickling_connections_hold_no_thread_and_never_lock_the_owner_out(
    shared_queue: Path, open_dir: Path, procs: Processes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fvowner serves its queue's page, with 256 descriptors (one thread and one descriptor
    for each of 300 connections would not fit); fveve opens 300 connections that never ask
    anything, then one that trickles its head. The owner's request is answered at once, not
    once the idle ones have timed out; the server's threads stay the loop and its workers;
    the trickling client is closed HEAD_SECONDS after it connected."""
    ids = [enqueue_as(OWNER, shared_queue, f"the owner's job {n}") for n in range(2)]
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(owners_folder(open_dir, "runtime")))
    for name in ("RUNTIME_DIRECTORY", "FORKVISOR_WEB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    server, web = start_web(procs, shared_queue, prefix=("prlimit", "--nofile=256:256", *as_user(OWNER)))
    assert status_of(server.pid, "Uid").split()[0] == str(pwd.getpwnam(OWNER).pw_uid)
    head_seconds = web_module.HEAD_SECONDS
    crowd = subprocess.Popen(
        [*as_user(EVE), sys.executable, "-c", CROWD, str(web.port), str(head_seconds)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        bufsize=0,
        cwd=REPO,
    )
    try:
        assert read_line(crowd, 30, "fveve's 300 connections are open") == "open"
        started = time.monotonic()
        [(status, body)] = fetch(OWNER, f"tcp:{web.port}", f"/api/overview?token={web.token}")
        answered = time.monotonic() - started
        threads = int(status_of(server.pid, "Threads"))  # once the owner's, the last to come, was taken
        descriptors = len(os.listdir(f"/proc/{server.pid}/fd"))
        dropped = json.loads(read_line(crowd, head_seconds + 10, "the trickling client is done"))
    finally:
        assert crowd.stdin is not None
        assert crowd.stdout is not None
        crowd.stdin.close()
        try:
            crowd.wait(10)
        finally:
            if crowd.poll() is None:
                crowd.kill()
                crowd.wait()
            crowd.stdout.close()
    assert status == 200, body
    assert answered < head_seconds  # not once the idle ones were given up on
    assert json.loads(body)["queues"][0]["status"]["counts"]["ready"] == 2
    assert threads <= web_module.WORKERS + 4, threads  # main, sampler, workers (+ slack): not one per connection
    assert descriptors <= 128 + web_module.WORKERS + 16, descriptors  # half its 256 for those who wait
    assert isinstance(dropped, float), dropped
    assert head_seconds - 1 <= dropped <= head_seconds + 2, dropped
    [(status, _)] = fetch(OWNER, f"tcp:{web.port}", f"/api/overview?token={web.token}")
    assert status == 200
    assert server.poll() is None, procs.log(server)
    stop(procs, server)
    check_invariants(shared_queue, ids)


PLANT = r"""
import errno, os, sys
how, victim, names = sys.argv[1], sys.argv[2], sys.argv[3:]
for name in names:
    try:
        os.unlink(name)
    except FileNotFoundError:
        pass
    if how == "hard":
        try:
            os.link(victim, name)
            print("linked")
            continue
        except PermissionError as exc:
            print(errno.errorcode[exc.errno])  # fs.protected_hardlinks: not a file of ours
    os.symlink(victim, name)
"""
"""A member's links: at each of NAMES, one to VICTIM (HOW: `soft`, or `hard` where the
kernel lets them, a symbolic one where it refuses, after printing why)."""


@pytest.mark.parametrize("writer", [None, OWNER], ids=["root", "owner"])
def test_a_members_links_at_the_textfiles_names_never_lend_the_writers_rights(
    shared_queue: Path, open_dir: Path, writer: str | None
) -> None:
    """The team's collector folder is writable by fvteam; fvbob plants links to a file only
    the writer (root, or the queue's owner) may write, at the textfile's path and at every
    name of a temporary file one could predict, then (once the textfile is there) a hard
    link at its path where the kernel allows one. The real `forkvisor metrics --textfile`
    follows none: the file is untouched, the textfile is the writer's and says what the
    queue holds, bob's links beside it are left as they were."""
    job_id = enqueue_as(OWNER, shared_queue, "counted")
    uid = 0 if writer is None else pwd.getpwnam(writer).pw_uid
    victim = open_dir / "victim"
    victim.write_text("only the writer may write this\n")
    os.chown(victim, uid, 0 if writer is None else pwd.getpwnam(writer).pw_gid)
    victim.chmod(0o600)
    touch = python_as(BOB, "import sys; open(sys.argv[1], 'a')", victim)
    assert "PermissionError" in touch.stderr, touch  # a file bob may not write himself
    collector = open_dir / "collector"
    collector.mkdir()
    os.chown(collector, 0, grp.getgrnam(TEAM).gr_gid)
    collector.chmod(0o775)  # the team's: its members and the owner write it
    out = collector / "forkvisor.prom"
    predictable = [f".{out.name}.tmp", f"{out.name}.tmp", f"{out.name}.new", f"{out.name}~", f".{out.name}.swp"]

    def write() -> None:
        args = ("metrics", shared_queue, "--textfile", out)
        done = as_root(*args) if writer is None else run_as(writer, *args)
        assert done.returncode == 0, done
        assert victim.read_text() == "only the writer may write this\n"
        assert (victim.stat().st_uid, stat.S_IMODE(victim.stat().st_mode)) == (uid, 0o600)
        assert not out.is_symlink()
        kept = out.stat()
        assert (kept.st_uid, kept.st_nlink, stat.S_IMODE(kept.st_mode)) == (uid, 1, 0o644)
        samples = _samples(out.read_text())
        assert samples[("forkvisor_queue_up", ())] == 1
        assert samples[("forkvisor_jobs", (("state", "ready"),))] == 1
        assert sorted(os.listdir(collector)) == sorted([*predictable, out.name])  # nothing else left behind
        assert all(os.readlink(collector / name) == str(victim) for name in predictable)  # untouched

    planted = python_as(BOB, PLANT, "soft", victim, *(collector / name for name in [*predictable, out.name]))
    assert planted.returncode == 0, planted
    write()
    planted = python_as(BOB, PLANT, "hard", victim, out)
    assert planted.returncode == 0, planted
    if Path("/proc/sys/fs/protected_hardlinks").read_text().strip() == "1":
        assert planted.stdout.split() == ["EPERM"]  # the kernel refuses it: bob's symbolic one instead
    else:
        assert planted.stdout.split() == ["linked"]
    write()
    check_invariants(shared_queue, [job_id])
