"""The status page and the other users of the host (docs/SECURITY.md, "The status page").

Loopback is open to every local user. An outside review read the arguments, results,
output and events of another user's 0700 queue through `forkvisor web`'s `/api/job` and
`/metrics`, as that other user (fveve), because the page took no token by default. Here a
real server runs as the queue's owner (or as root), and each request is made by a real
user's process (setpriv): on TCP only the token opens the data, and it is in a file only
the owner may read; on the Unix socket each user sees only the queues their rights let
them read, as the kernel names them (SO_PEERCRED)."""

from __future__ import annotations

import grp
import json
import os
import pwd
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from jobs import Queue
from tests import sample_jobs
from tests.conftest import wait_until
from tests.processes import Processes
from tests.security.conftest import ALICE, EVE, OWNER, TEAM, as_user, python_as, run_as
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
