"""Root never runs a job by accident (issue 18, class "a manager started as root on a user's
private queue runs that user's command jobs as root"): a root manager refuses a queue it
does not own, and with --user it becomes the owner before it touches the queue. With
--run-as-submitter, one root manager runs each member's job as that member, and nothing
such a job does redirects the manager's writes."""

from __future__ import annotations

import grp
import json
import os
import pwd
import subprocess
from pathlib import Path

import pytest

from jobs import Queue, State
from tests.faults.conftest import Outside
from tests.jobs_processes import invariants
from tests.processes import APP, APP_PATH, REPO, forkvisor_command
from tests.security.conftest import ALICE, BOB, EVE, OWNER, SUBMIT, SUBMIT_COMMAND, TEAM, python_as, run_as

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


# -- one root manager, each job run as its submitter -------------------------------------------------


def _submit(user: str, queue: Path, *command: str) -> str:
    code = SUBMIT_COMMAND if len(command) > 1 else SUBMIT
    done = python_as(user, code, queue, *command)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _serve_as_submitters(queue: Path, **env: str) -> tuple[int, str]:
    done = subprocess.run(
        [*forkvisor_command(), "run", str(queue), "--app", APP, *APP_PATH, "--run-as-submitter", "--burst"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, **env},
        check=False,
    )
    return done.returncode, done.stderr


def test_run_as_submitter_runs_each_members_job_as_that_member(roots_queue: Path) -> None:
    alices = _submit(ALICE, roots_queue, "sample.whoami")
    bobs = _submit(BOB, roots_queue, "sample.whoami")
    command = _submit(ALICE, roots_queue, "sh", "-c", 'echo "${SERVICE_SECRET:-no secret}"; id -u')
    roots = Queue(roots_queue, create=False).enqueue("sample.whoami")  # the owner's own job
    code, err = _serve_as_submitters(roots_queue, SERVICE_SECRET="the manager's")
    assert code == 0, err
    queue = Queue(roots_queue, create=False)
    team = grp.getgrnam(TEAM).gr_gid
    for job_id, user in ((alices, ALICE), (bobs, BOB)):
        job = queue.job(job_id)
        assert job.state is State.DONE, err
        account = pwd.getpwnam(user)
        assert job.result["uid"] == job.result["euid"] == account.pw_uid, job.result
        assert job.result["gid"] == account.pw_gid
        assert team in job.result["groups"]
        assert 0 not in job.result["groups"], "root's groups were dropped"
        assert (job.result["user"], job.result["home"]) == (user, account.pw_dir)
        run = job.history[-1].path
        assert os.stat(run / "stdout").st_uid == account.pw_uid, "the job's output is its submitter's"
        assert os.stat(run).st_uid == account.pw_uid, "so is its run's folder"
        assert os.stat(run / "outcome.json").st_uid == 0, "the manager's record is root's"
        assert os.stat(job.path).st_uid == 0, "the job's folder stays the owner's"
    refused = queue.job(roots)  # the owner's own job would run as root: only where the queue says so
    assert refused.state is State.DEAD
    assert "root_jobs yes" in refused.error["message"]
    ran = queue.job(command)
    assert ran.state is State.DONE, err
    stdout = (ran.history[-1].path / "stdout").read_text().split()
    assert stdout == ["no", "secret", str(pwd.getpwnam(ALICE).pw_uid)], "a command starts from a clean environment"


HOSTILE = """
cd "$FORKVISOR_ATTEMPT_DIR" || exit 9
ln -s "$1" outcome.json                       # the manager's record, redirected to a file of root's
ln -s "$1" ".outcome.json.$PPID.tmp"          # and the staging name it writes first (the manager's pid)
ln -s "$1" result.json
rm -f policy.json && echo '{"max_attempts": 99}' > policy.json  # its own attempt limit, raised
mv "$FORKVISOR_ATTEMPT_DIR" "$FORKVISOR_ATTEMPT_DIR.moved" 2>/dev/null && echo moved || echo cannot-move
"""


def test_a_job_run_as_its_submitter_cannot_redirect_the_managers_writes(roots_queue: Path, outside: Outside) -> None:
    job_id = _submit(ALICE, roots_queue, "sh", "-c", HOSTILE, "hostile", str(outside.secret))
    code, err = _serve_as_submitters(roots_queue)
    assert code == 0, err
    outside.check()  # root's file was neither written nor replaced
    job = Queue(roots_queue, create=False).job(job_id)
    assert job.state is State.DONE, err
    run = job.history[-1].path
    assert (run / "stdout").read_text().split() == ["cannot-move"], "a job's own folder is not the member's"
    record = run / "outcome.json"
    assert not record.is_symlink(), "the manager's record replaced the planted link, never followed it"
    assert record.lstat().st_uid == 0
    assert job.history[-1].outcome is not None
    assert job.result is None, "a link where the result belongs is no result"
    assert job.policy is None or job.policy.max_attempts != 99, "a policy.json the submitter wrote does not count"
    invariants.check_invariants(roots_queue, [job_id])


def test_a_job_whose_submitter_is_gone_dies_saying_so(roots_queue: Path) -> None:
    queue = Queue(roots_queue, create=False)
    job_id = queue.enqueue("sample.whoami")
    ready = next((roots_queue / "ready").iterdir())
    spec = json.loads((ready / "job.json").read_text())
    spec["submitted_by"] = {"uid": 4242424}  # written by a take-in for a user deleted since
    (ready / "job.json").write_text(json.dumps(spec))
    code, err = _serve_as_submitters(roots_queue)
    assert code == 0, err
    job = queue.job(job_id)
    assert job.state is State.DEAD
    assert "its submitter, uid 4242424, is not a user of this host" in job.error["message"]


@pytest.mark.parametrize(
    ("who", "extra", "words"),
    [
        (ALICE, [], "--run-as-submitter needs a manager started as root"),
        ("root", ["--user", OWNER], "--user and --run-as-submitter exclude each other"),
    ],
)
def test_run_as_submitter_is_refused_where_it_cannot_work(
    roots_queue: Path, who: str, extra: list[str], words: str
) -> None:
    args = ["run", roots_queue, "--run-as-submitter", "--burst", *extra]
    if who == "root":
        code, err = _root(*args)
    else:
        done = run_as(who, *args)
        code, err = done.returncode, done.stderr
    assert code == 2, err
    assert words in err
