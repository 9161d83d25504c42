"""Root never runs a job by accident (issue 18, class "a manager started as root on a user's
private queue runs that user's command jobs as root"): a root manager refuses a queue it
does not own, and with --user it becomes the owner before it touches the queue."""

from __future__ import annotations

import grp
import os
import pwd
import subprocess
from pathlib import Path

import pytest

from jobs import Queue, State
from tests.security.conftest import EVE, OWNER, TEAM, python_as, run_as
from tests.supervisor.conftest import REPO, forkvisor_command

SUBMIT_ID = "import sys; from jobs import Queue; print(Queue(sys.argv[1], create=False).enqueue_command(['id', '-u']))"


@pytest.fixture
def owners_queue(users: None, open_dir: Path) -> Path:
    """fvowner's private queue, holding one command job of theirs: `id -u`."""
    home = open_dir / "owner"
    home.mkdir(mode=0o755)
    os.chown(home, pwd.getpwnam(OWNER).pw_uid, grp.getgrnam(TEAM).gr_gid)
    path = home / "queue"
    assert run_as(OWNER, "init", path, "--lease", "3").returncode == 0
    return path


def _root(*args: str | Path) -> tuple[int, str]:
    done = subprocess.run(
        [*forkvisor_command(), *map(str, args)], capture_output=True, text=True, timeout=60, cwd=REPO, check=False
    )
    return done.returncode, done.stderr


def test_a_root_manager_refuses_a_users_queue(owners_queue: Path) -> None:
    job_id = python_as(OWNER, SUBMIT_ID, owners_queue).stdout.strip()
    code, err = _root("run", owners_queue, "--burst")
    assert code == 111, err
    assert f"belongs to uid {pwd.getpwnam(OWNER).pw_uid}, not to this manager's uid 0" in err
    assert "--user NAME" in err
    assert Queue(owners_queue, create=False).job(job_id).state is State.READY, "nothing ran, nothing moved"


def test_with_user_root_becomes_the_owner_before_anything_runs(owners_queue: Path) -> None:
    job_id = python_as(OWNER, SUBMIT_ID, owners_queue).stdout.strip()
    code, err = _root("run", owners_queue, "--user", OWNER, "--burst", "--lease", "3")
    assert code == 0, err
    job = Queue(owners_queue, create=False).job(job_id)
    assert job.state is State.DONE
    ran_as = (job.history[-1].path / "stdout").read_text().strip()
    assert ran_as == str(pwd.getpwnam(OWNER).pw_uid), "the job ran as the queue's owner, not as root"
    assert os.stat(job.path / "attempt-1" / "outcome.json").st_uid == pwd.getpwnam(OWNER).pw_uid


@pytest.mark.parametrize(
    ("who", "user", "words"),
    [("root", "no-such-user-here", "no such user"), (EVE, OWNER, "only root may become another user")],
)
def test_user_is_refused_when_it_cannot_be_done(owners_queue: Path, who: str, user: str, words: str) -> None:
    if who == "root":
        code, err = _root("run", owners_queue, "--user", user, "--burst")
    else:
        done = run_as(who, "run", owners_queue, "--user", user, "--burst")
        code, err = done.returncode, done.stderr
    assert code == 2, err
    assert words in err
