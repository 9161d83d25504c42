"""Fixtures of the security suite: real users and a group (`tests.users`: the suite runs as
root in CI; without root the tests that need them skip, saying why), and the fault suite's
and the process suite's fixtures, shared here by import."""

from __future__ import annotations

import grp
import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes import REPO, forkvisor_command
from tests.users import ALICE, BOB, EVE, MEMBERS, OWNER, TEAM, as_user, why_no_users

__all__ = ["ALICE", "BOB", "EVE", "MEMBERS", "OWNER", "TEAM", "as_user"]


@pytest.fixture
def users() -> None:
    why = why_no_users()
    if why is not None:
        pytest.skip(why)


def run_as(name: str, *args: str | Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """`forkvisor ARGS...` as user `name`, to its end."""
    return subprocess.run(
        [*as_user(name), *forkvisor_command(), *map(str, args)],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )


def python_as(name: str, code: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    """Python `code` run as user `name` (sys.argv[1:] are `args`)."""
    return subprocess.run(
        [*as_user(name), sys.executable, "-c", code, *map(str, args)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )


@pytest.fixture
def shared_queue(users: None, open_dir: Path) -> Path:
    """A shared queue of fvowner's, group fvteam, made with the CLI as its owner would."""
    home = open_dir / "owner"  # a folder of the owner's to make the queue in
    home.mkdir(mode=0o755)
    os.chown(home, pwd.getpwnam(OWNER).pw_uid, grp.getgrnam(TEAM).gr_gid)
    path = home / "queue"
    made = run_as(OWNER, "init", path, "--shared", "--group", TEAM, "--lease", "3")
    assert made.returncode == 0, made
    assert grp.getgrgid(path.stat().st_gid).gr_name == TEAM
    return path


SUBMIT = "import sys; from jobs import Queue; print(Queue(sys.argv[1], create=False).enqueue(sys.argv[2]))"
SUBMIT_COMMAND = (
    "import sys; from jobs import Queue; print(Queue(sys.argv[1], create=False).enqueue_command(sys.argv[2:]))"
)


def as_root(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`forkvisor ARGS...` as this process's user (root), to its end, with `env` added."""
    return subprocess.run(
        [*forkvisor_command(), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, **(env or {})},
        check=False,
    )


@pytest.fixture
def roots_queue(users: None, open_dir: Path) -> Path:
    """A shared queue of root's, group fvteam: what one system manager serves for several users."""
    path = open_dir / "queue"
    made = as_root("init", path, "--shared", "--group", TEAM, "--lease", "3")
    assert made.returncode == 0, made.stderr
    return path
