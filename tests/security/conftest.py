"""Fixtures of the security suite: real users and a group made with `useradd` (the suite
runs as root in CI; without root the tests that need them skip, saying why), and the
fault suite's and the process suite's fixtures, shared here by import.

    fvowner   owns the queue and runs its managers: its own group fvowner (the owner group
              of incoming/), and a member of fvteam
    fvalice   a member of the queue's group fvteam (their own group: fvteam)
    fvbob     another member, the one who attacks
    fveve     no member: another local user
"""

from __future__ import annotations

import functools
import grp
import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.processes import REPO, forkvisor_command

TEAM, OWNER, ALICE, BOB, EVE = "fvteam", "fvowner", "fvalice", "fvbob", "fveve"
MEMBERS = (OWNER, ALICE, BOB)


def _run(command: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(command), capture_output=True, text=True, timeout=60, check=False)


@functools.cache
def _why_no_users() -> str | None:
    """Why real users cannot be used here (None when they can)."""
    if os.geteuid() != 0:
        return "needs root to create users and groups with useradd"
    if not (shutil.which("useradd") and shutil.which("groupadd") and shutil.which("setpriv")):
        return "needs useradd, groupadd and setpriv"
    for group in (TEAM, OWNER):
        made = _run(["groupadd", "-f", group])
        if made.returncode != 0:
            return f"groupadd {group} failed: {made.stderr.strip()}"
    for name in (*MEMBERS, EVE):
        try:
            pwd.getpwnam(name)
            continue
        except KeyError:
            pass
        group = ["-g", TEAM] if name in MEMBERS else []
        made = _run(["useradd", "-M", "-N", *group, "-s", "/usr/sbin/nologin", name])
        if made.returncode != 0:
            return f"useradd {name} failed: {made.stderr.strip()}"
    # The owner in a group of its own (most systems give every user one), a member of the team:
    made = _run(["usermod", "-g", OWNER, "-G", TEAM, OWNER])
    if made.returncode != 0:
        return f"usermod {OWNER} failed: {made.stderr.strip()}"
    probe = _run([*as_user(ALICE), sys.executable, "-c", "import jobs, supervisor, tests.sample_jobs"])
    if probe.returncode != 0:
        return f"{ALICE} cannot run this Python or read the repository: {probe.stderr.strip()[-300:]}"
    return None


def as_user(name: str) -> list[str]:
    """A command prefix that runs the rest as `name`, with their groups and none of root's rights."""
    return ["setpriv", f"--reuid={name}", f"--regid={pwd.getpwnam(name).pw_gid}", "--init-groups"]


@pytest.fixture
def users() -> None:
    why = _why_no_users()
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
