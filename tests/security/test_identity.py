"""Who submitted a job cannot be forged (issue 26, class "an identity that a hard link
forges"), and no job runs as root, or with the manager's secrets, unless the owner says so.

The attack that got through: a member hard-linked (or moved) a file of another user's that
they could write, in a team folder, as their submission; the submitter was taken from the
file's owner, so under --run-as-submitter the command ran as that user, or as root with a
root-owned 0666 file. Now who submitted is the owner of the folder the submission is in
(incoming/UID/, which only its owner and the owner group may write): these tests make the
links, moves and squats with real users and a real root manager, and check that nothing
ran as anyone but the member who made it. Each ends with the conservation check."""

from __future__ import annotations

import grp
import json
import os
import pwd
import subprocess
import time
from pathlib import Path

import pytest

from jobs import Queue, State, new_job_id
from tests.jobs_processes import invariants
from tests.processes import APP, APP_PATH, Processes, wait_until
from tests.security.conftest import ALICE, BOB, SUBMIT, SUBMIT_COMMAND, TEAM, as_root, as_user, python_as

LONELY = "fvlonely"  # a group with no member
RETRY = "import sys; from jobs import Queue; Queue(sys.argv[1], create=False).retry(sys.argv[2])"


@pytest.fixture
def team_folder(users: None, open_dir: Path) -> Path:
    """A team folder as teams keep them: the team's group may write it (no sticky bit)."""
    path = open_dir / "team"
    path.mkdir()
    os.chown(path, 0, grp.getgrnam(TEAM).gr_gid)
    os.chmod(path, 0o2770)
    return path


def _serve(queue: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return as_root("run", queue, "--app", APP, *APP_PATH, "--run-as-submitter", "--burst", *extra, env=env)


def _shell(user: str, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*as_user(user), "sh", "-c", script], capture_output=True, text=True, timeout=30)


def _uid(user: str) -> int:
    return pwd.getpwnam(user).pw_uid


def _ids(queue: Path) -> list[str]:
    """Every job id the queue holds, in any state (for the conservation check)."""
    found = []
    for state in State:
        found += [job.id for job in Queue(queue, create=False).jobs(state)]
    return found


def _notes(queue: Path) -> list[str]:
    folder = queue / "quarantine"
    return [(folder / name).read_text() for name in sorted(os.listdir(folder)) if name.endswith(".why")]


COMMAND = json.dumps({"function": "forkvisor.command", "args": ["sh", "-c", "id -u > /tmp/fv-forged-$$"]})


@pytest.mark.parametrize(
    "how",
    [
        "hard link of a team file",
        "hard link, then the original removed",
        "move of a team file",
        "hard link of a root-owned 0666 file",
    ],
)
def test_another_users_file_in_a_members_folder_lends_no_identity(
    roots_queue: Path, team_folder: Path, open_dir: Path, how: str
) -> None:
    """bob rewrites a file he may write but does not own, and makes it his submission: the
    manager never runs it as its owner; it refuses it, saying why."""
    if "root-owned" in how:
        victim = open_dir / "root-0666"
        victim.write_text("")
        os.chmod(victim, 0o666)
    else:
        victim = team_folder / "alices-notes.json"
        assert _shell(ALICE, f"umask 007 && : > {victim}").returncode == 0
        assert victim.stat().st_uid == _uid(ALICE)
    mine = roots_queue / "incoming" / str(_uid(BOB))
    job_id = new_job_id(time.time() + 5)
    verb = "mv" if how.startswith("move") else "ln"
    tail = f" && rm {victim}" if "removed" in how else ""
    script = f"mkdir -m 770 {mine} && printf '%s' '{COMMAND}' > {victim} && {verb} {victim} {mine}/{job_id}.json{tail}"
    made = _shell(BOB, script)
    assert made.returncode == 0, made.stderr
    before = set(os.listdir("/tmp"))
    served = _serve(roots_queue)
    assert served.returncode == 0, served.stderr
    assert not [name for name in set(os.listdir("/tmp")) - before if name.startswith("fv-forged-")], "nothing ran"
    assert Queue(roots_queue, create=False).counts()["done"] == 0
    [note] = _notes(roots_queue)
    assert "it is not its folder's owner's own file" in note or "has 2 names (a hard link)" in note, note
    invariants.check_invariants(roots_queue, _ids(roots_queue))


def test_a_members_submission_runs_as_the_owner_of_its_folder_whatever_its_name(roots_queue: Path) -> None:
    """bob makes a folder named for alice's uid before she ever submits: what bob puts there
    runs as bob; alice's own submissions go to a folder of hers, and run as alice."""
    squat = roots_queue / "incoming" / str(_uid(ALICE))
    assert _shell(BOB, f"mkdir -m 770 {squat}").returncode == 0
    bobs = python_as(BOB, SUBMIT, roots_queue, "sample.whoami")
    assert bobs.returncode == 0, bobs.stderr
    document = json.dumps({"function": "sample.whoami"})
    planted = new_job_id(time.time() + 5)
    assert _shell(BOB, f"printf '%s' '{document}' > {squat}/{planted}.json").returncode == 0
    alices = python_as(ALICE, SUBMIT, roots_queue, "sample.whoami")
    assert alices.returncode == 0, alices.stderr
    assert (roots_queue / "incoming" / f"{_uid(ALICE)}.1").stat().st_uid == _uid(ALICE), "her own folder"
    served = _serve(roots_queue)
    assert served.returncode == 0, served.stderr
    queue = Queue(roots_queue, create=False)
    ran_as = {
        job_id: queue.job(job_id).result["uid"] for job_id in (bobs.stdout.strip(), planted, alices.stdout.strip())
    }
    assert ran_as == {bobs.stdout.strip(): _uid(BOB), planted: _uid(BOB), alices.stdout.strip(): _uid(ALICE)}
    invariants.check_invariants(roots_queue, list(ran_as))


def test_a_request_made_with_another_users_file_is_the_members_own(roots_queue: Path, team_folder: Path) -> None:
    """A hard link of alice's file as bob's `ID.cancel`: the request is bob's, and bob may not
    cancel alice's job."""
    alices = python_as(
        ALICE,
        "import sys; from jobs import Queue; "
        "print(Queue(sys.argv[1], create=False).with_options(delay=3600).enqueue('sample.whoami'))",
        roots_queue,
    )
    assert alices.returncode == 0, alices.stderr
    job_id = alices.stdout.strip()
    assert _serve(roots_queue).returncode == 0
    assert Queue(roots_queue, create=False).job(job_id).state is State.SCHEDULED
    victim = team_folder / "alices-request"
    assert _shell(ALICE, f"umask 007 && echo please > {victim}").returncode == 0
    mine = roots_queue / "incoming" / str(_uid(BOB))
    assert _shell(BOB, f"mkdir -m 770 {mine} && ln {victim} {mine}/{job_id}.cancel").returncode == 0
    assert _serve(roots_queue).returncode == 0
    assert Queue(roots_queue, create=False).job(job_id).state is State.SCHEDULED, "not cancelled"
    [note] = _notes(roots_queue)
    assert f"cancel of job {job_id} by {BOB}" in note
    assert f"it was submitted by {ALICE}" in note
    invariants.check_invariants(roots_queue, [job_id])


def test_members_cannot_list_incoming_nor_touch_each_others_folders(roots_queue: Path) -> None:
    alices = python_as(ALICE, SUBMIT, roots_queue, "sample.whoami").stdout.strip()
    hers = roots_queue / "incoming" / str(_uid(ALICE))
    for script in (
        f"ls {roots_queue}/incoming",
        f"ls {hers}",
        f"cat {hers}/{alices}.json",
        f"touch {hers}/{new_job_id(time.time() + 5)}.json",
        f"mv {hers} {roots_queue}/incoming/mine",
        f"rm -rf {hers}",
    ):
        done = _shell(BOB, script)
        assert done.returncode != 0, f"bob could: {script}"
    assert os.listdir(hers) == [f"{alices}.json"]


def test_the_owners_own_jobs_run_as_root_only_if_the_queue_says_so(roots_queue: Path) -> None:
    queue = Queue(roots_queue, create=False)
    job_id = queue.enqueue("sample.whoami")  # root's own job on root's queue
    assert _serve(roots_queue).returncode == 0
    dead = queue.job(job_id)
    assert dead.state is State.DEAD
    assert "it would run as root" in dead.error["message"]
    assert "root_jobs yes" in dead.error["message"]
    assert as_root("config", roots_queue, "root_jobs", "yes").returncode == 0
    queue.retry(job_id)
    assert _serve(roots_queue).returncode == 0
    assert queue.job(job_id).result["uid"] == 0, "said on purpose, in a setting only the owner writes"
    invariants.check_invariants(roots_queue, [job_id])


def test_root_serves_members_as_root_only_when_told(roots_queue: Path) -> None:
    job_id = python_as(ALICE, SUBMIT, roots_queue, "sample.whoami").stdout.strip()
    refused = as_root("run", roots_queue, "--app", APP, *APP_PATH, "--burst")
    assert refused.returncode == 2, refused.stderr
    assert "would run as root" in refused.stderr
    assert "--run-as-submitter" in refused.stderr
    assert Queue(roots_queue, create=False).job(job_id).state is State.INCOMING, "nothing ran"
    told = as_root("run", roots_queue, "--app", APP, *APP_PATH, "--burst", "--members-as-root")
    assert told.returncode == 0, told.stderr
    assert "submit (fvalice" in told.stderr, "said at start, naming the members"
    assert "run as root: --members-as-root" in told.stderr
    assert Queue(roots_queue, create=False).job(job_id).result["uid"] == 0
    invariants.check_invariants(roots_queue, [job_id])


def test_a_forged_submitter_in_a_refused_submission_is_never_believed(roots_queue: Path) -> None:
    """Once: a submission refused for a bad run_at was buried with the member's text as its
    job.json, `submitted_by` included; bob's "alice" stood, and after root's retry, a
    manager --run-as-submitter ran bob's command as alice. Now the owner writes job.json
    (who submitted it, from the folder), the text is kept aside, and no one can retry it."""
    forged = {
        "function": "forkvisor.command",
        "args": ["id"],
        "run_at": "tomorrow",
        "submitted_by": {"uid": _uid(ALICE)},
    }
    mine = roots_queue / "incoming" / str(_uid(BOB))
    planted = new_job_id(time.time() + 5)
    script = f"mkdir -p -m 770 {mine} && cat > {mine}/.x && mv {mine}/.x {mine}/{planted}.json"
    planting = subprocess.run([*as_user(BOB), "sh", "-c", script], input=json.dumps(forged), text=True, timeout=30)
    assert planting.returncode == 0
    assert _serve(roots_queue, "--commands").returncode == 0
    queue = Queue(roots_queue, create=False)
    dead = queue.job(planted)
    assert dead.state is State.DEAD
    assert 'field "run_at"' in dead.error["message"]
    recorded = json.loads((dead.path / "job.json").read_text())
    assert recorded["submitted_by"]["uid"] == _uid(BOB), "the folder's owner, never the text"
    assert json.loads((dead.path / "submission.json").read_text()) == forged, "bob's text, kept aside"
    retry = as_root("retry", roots_queue, planted)
    assert retry.returncode != 0, "root cannot retry what never was a job"
    assert f"cannot retry job {planted}: job.json has no" in retry.stderr, retry.stderr
    asked = python_as(ALICE, RETRY, roots_queue, planted)
    assert asked.returncode == 0, "alice may ask (a member's retry is a request): refusing is the managers'"
    assert _serve(roots_queue, "--commands").returncode == 0
    assert queue.job(planted).state is State.DEAD, "nor does alice's request retry it"
    notes = [path.read_text() for path in (roots_queue / "quarantine").glob("*.why")]
    assert any(f"retry of job {planted} by {ALICE}" in note for note in notes), notes
    invariants.check_invariants(roots_queue, [planted])


def test_a_root_manager_runs_no_members_job_as_root_when_the_group_gained_members_since_its_start(
    procs: Processes, roots_queue: Path
) -> None:
    """The check at the start saw no member; a member joined (here: the queue's group became
    the team's) and submitted: the job is refused, saying how to run it, never run as root."""
    subprocess.run(["groupadd", "-f", LONELY], check=True)
    os.chown(roots_queue, 0, grp.getgrnam(LONELY).gr_gid)  # a group with no member: the manager starts
    queue = Queue(roots_queue, create=False)
    manager = procs.run_manager(queue)
    wait_until(lambda: os.listdir(roots_queue / "claimed") or manager.poll() is not None, 20, "it registered")
    assert manager.poll() is None, procs.log(manager)
    os.chown(roots_queue, 0, grp.getgrnam(TEAM).gr_gid)
    job_id = python_as(ALICE, SUBMIT, roots_queue, "sample.whoami").stdout.strip()
    wait_until(lambda: queue.job(job_id).state is State.DEAD, 20, "alice's job was refused")
    manager.terminate()
    assert procs.wait_exit(manager, 20, "the manager") == 0, procs.log(manager)
    error = queue.job(job_id).error
    assert "this manager runs as root" in error["message"], error
    assert "--run-as-submitter" in error["message"], error
    assert queue.job(job_id).result is None
    invariants.check_invariants(roots_queue, [job_id])


def test_jobs_get_none_of_the_managers_secrets(roots_queue: Path) -> None:
    """A root manager's FORKVISOR_* (a web token) and its service's secrets never reach a job
    run as its submitter, Python or command; the owner passes a variable on purpose."""
    python = python_as(ALICE, SUBMIT, roots_queue, "sample.environment").stdout.strip()
    command = python_as(ALICE, SUBMIT_COMMAND, roots_queue, "env").stdout.strip()
    secrets = {"FORKVISOR_WEB_TOKEN": "web-secret", "SERVICE_SECRET": "db-password", "TEAM_SETTING": "shared"}
    served = _serve(roots_queue, "--pass-env", "TEAM_SETTING", env=secrets)
    assert served.returncode == 0, served.stderr
    queue = Queue(roots_queue, create=False)
    seen = queue.job(python).result
    assert "FORKVISOR_WEB_TOKEN" not in seen, sorted(seen)
    assert "SERVICE_SECRET" not in seen, sorted(seen)
    assert seen["TEAM_SETTING"] == "shared", "what the owner passes"
    assert (seen["USER"], seen["FORKVISOR_JOB_ID"]) == (ALICE, python)
    printed = (queue.job(command).history[-1].path / "stdout").read_text()
    assert "web-secret" not in printed
    assert "db-password" not in printed
    assert "TEAM_SETTING=shared" in printed
    invariants.check_invariants(roots_queue, [python, command])


def test_an_owners_manager_keeps_its_own_variables_from_its_jobs(users: None, open_dir: Path) -> None:
    """Not root, not shared: still, the manager's FORKVISOR_* are its own, not its jobs'."""
    path = open_dir / "private"
    assert as_root("init", path).returncode == 0
    queue = Queue(path, create=False)
    job_id = queue.enqueue("sample.environment")
    served = as_root("run", path, "--app", APP, *APP_PATH, "--burst", env={"FORKVISOR_WEB_TOKEN": "web-secret"})
    assert served.returncode == 0, served.stderr
    seen = queue.job(job_id).result
    assert "FORKVISOR_WEB_TOKEN" not in seen
    assert seen["FORKVISOR_JOB_ID"] == job_id
    invariants.check_invariants(path, [job_id])


def test_an_owner_group_shared_with_members_is_refused(users: None, open_dir: Path) -> None:
    """incoming/ in a group members are in would let them write each other's folders: init
    refuses to use it, and a manager refuses a queue left so."""
    path = open_dir / "queue"
    made = as_root("init", path, "--shared", "--group", TEAM, "--owner-group", TEAM)
    assert made.returncode == 2, made.stderr
    assert "group fvteam has members besides the owner" in made.stderr
    os.chown(path / "incoming", -1, grp.getgrnam(TEAM).gr_gid)  # as an earlier forkvisor left it
    refused = as_root("run", path, "--burst", "--members-as-root")
    assert refused.returncode == 111, refused.stderr
    assert "who could write each other's submission folders" in refused.stderr
    assert as_root("init", path, "--shared").returncode == 0, "init sets it right"
    assert grp.getgrgid((path / "incoming").stat().st_gid).gr_name == "root"
