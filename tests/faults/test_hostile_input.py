"""Hostile or broken entries in a queue, met by a real manager and its sweeper.

Every state folder and job folder gets links out of the queue (to a secret
file, to a folder holding a well-formed job, to a fifo), fifos, files where
folders belong, names with control characters or bytes that are not UTF-8,
and job files that are broken, huge, of the wrong types or name functions
that are not registered. The manager keeps running; each bad entry ends in
`quarantine/` with a `.why` note, or in `dead/` with its cause; the good jobs
run; nothing outside the queue is read, listed, written or followed.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from jobs import JobsError, Owner, Queue, State, new_job_id
from jobs.job import MAX_SPEC_BYTES, ready_name, scheduled_name
from jobs.lease import OWNER_FILE
from tests.faults.conftest import GOOD, Outside, cli_manager, entry_path, plant_entry, start_manager, watchdog
from tests.processes import REPO, Processes, dump, wait_until


@dataclass
class Junkyard:
    """A queue full of hostile entries, and what should become of each."""

    queue: Queue
    outside: Outside
    sentinel: Path
    good: list[str] = field(default_factory=list)  # ids that must end in done/
    dead: dict[str, str] = field(default_factory=dict)  # id: words its error.json must hold
    left: list[str] = field(default_factory=list)  # jobs no manager here runs: left ready, untouched
    quarantined: int = 0  # how many entries must end in quarantine/
    ignored: list[Path] = field(default_factory=list)  # links in done/ and dead/: left alone, never followed

    def folder(self, name: str) -> Path:
        return self.queue.path / name

    def ready_job(self, spec: object, **extra: str) -> tuple[str, Path]:
        """A job directory in ready/ whose job.json holds `spec` (bytes as they are; None: no
        job.json), with `extra` entries planted inside (name: kind, see `plant_entry`)."""
        job_id = new_job_id()
        job_dir = self.folder("ready") / ready_name(job_id, 0)
        job_dir.mkdir()
        data = spec if isinstance(spec, bytes) else json.dumps(spec).encode()
        if spec is not None:
            (job_dir / "job.json").write_bytes(data)
        for name, plant in extra.items():
            plant_entry(job_dir / name, plant, self.outside)
        return job_id, job_dir

    def bad_entry(self, parent: str, name: str | bytes, kind: str) -> None:
        """An entry that is not a job: it must be quarantined."""
        plant_entry(entry_path(self.folder(parent), name), kind, self.outside)
        self.quarantined += 1


def huge_spec(job_dir: Path) -> None:
    with open(job_dir / "job.json", "wb") as file:  # sparse: no disk blocks, so it stays fast
        file.write(b'{"function": "fault.ok", "args": ["')
        file.truncate(MAX_SPEC_BYTES + 1)


def build_junkyard(queue: Queue, outside: Outside, sentinel: Path) -> Junkyard:
    yard = Junkyard(queue, outside, sentinel)
    _hostile_jobs(yard)
    _hostile_entries(yard)
    _hostile_owner(yard)
    _abandoned(yard)
    return yard


def _hostile_jobs(yard: Junkyard) -> None:
    """Well-named job folders with bad contents: to dead/ with the cause, or run safely."""
    bad_specs: list[tuple[object, str]] = [
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe\x00garbage", "not valid JSON"),
        (["fault.ok"], "must hold a JSON object"),
        ({"function": 7}, '"function" must be str'),
        ({"function": "fault.ok", "args": "x"}, '"args" must be list'),
        ({"function": "fault.ok", "max_attempts": "3"}, '"max_attempts" must be int'),
        ({"function": "fault.ok", "timeout": -1}, "timeout must be positive"),
        ({"function": "fault.ok", "backoff": "never"}, "backoff 'never' is not one"),
        ({"function": "forkvisor.command"}, "a command job needs a command"),
    ]
    for spec, words in bad_specs:
        job_id, _ = yard.ready_job(spec)
        yard.dead[job_id] = words
    not_here: list[object] = [  # a manager of another deploy may run them: never destroyed, never run here
        {"function": "../../etc/passwd"},
        {"function": "fault.ok\n\x1b[2J"},
        {"function": "os.system", "args": [f"touch {yard.sentinel}"]},
        {"function": "tests.faults.fault_jobs.ok"},  # importable, not registered
        {"function": "fault.ok", "format": 2},  # written by a newer forkvisor
    ]
    yard.left += [yard.ready_job(spec)[0] for spec in not_here]
    links: list[tuple[dict[str, str], str]] = [
        ({"job.json": "link-secret"}, "Too many levels of symbolic links"),
        ({"job.json": "link-fifo"}, "Too many levels of symbolic links"),
        ({"job.json": "fifo"}, "not a regular file"),
        ({"job.json": "folder"}, "not a regular file"),
        ({"attempts": "link-secret"}, "attempts counter"),
        ({"attempts": "fifo"}, "attempts counter"),
    ]
    for plants, words in links:
        job_id, _ = yard.ready_job(None if "job.json" in plants else GOOD, **plants)
        yard.dead[job_id] = words
    job_id, job_dir = yard.ready_job(None)
    huge_spec(job_dir)
    yard.dead[job_id] = f"larger than {MAX_SPEC_BYTES} bytes"
    # Good jobs with traps inside: links where the manager will write, files where folders go.
    trapped = {
        "attempt-1": "link-job",
        "result.json": "link-secret",
        ".result.json.link": "link-fifo",
        "events": "link-secret",
    }
    yard.good.append(yard.ready_job(GOOD, **trapped)[0])
    yard.good.append(yard.ready_job(GOOD, **{"attempt-1": "file", "attempt-2": "link-fifo"})[0])
    yard.good.append(yard.ready_job(GOOD)[0])


def _hostile_entries(yard: Junkyard) -> None:
    """Entries of the state folders that are not jobs at all: quarantined, never followed."""
    for kind in ("link-job", "link-secret", "link-fifo", "dangling", "fifo", "file"):
        yard.bad_entry("ready", ready_name(new_job_id(), 0), kind)
        yard.bad_entry("scheduled", scheduled_name(new_job_id(), 0, 1.0), kind)
    for name in ("100...", "100.\x1b[2J", b"100.\xff\xfe", "..100", "100.\n"):
        yard.bad_entry("ready", name, "folder")
    yard.bad_entry("scheduled", b"0000000001000.100.\xff", "folder")
    yard.bad_entry("claimed", "otherhost.1.abcdef", "link-job")
    yard.bad_entry("claimed", "otherhost.2.abcdef", "file")
    yard.bad_entry("claimed", "reaping.otherhost.3.abcdef", "link-job")
    for state in ("done", "dead"):
        link = yard.folder(state) / new_job_id()
        link.symlink_to(yard.outside.jobs, target_is_directory=True)
        yard.ignored.append(link)


def _hostile_owner(yard: Junkyard) -> None:
    """The folder of an owner long gone, with an owner file that is a fifo and links for jobs."""
    owner = yard.folder("claimed") / "otherhost.4.abcdef"
    owner.mkdir()
    os.mkfifo(owner / OWNER_FILE)
    plant_entry(owner / new_job_id(), "link-job", yard.outside)
    yard.quarantined += 1
    job_id = new_job_id()
    (owner / job_id).mkdir()
    plant_entry(owner / job_id / "job.json", "link-secret", yard.outside)
    yard.dead[job_id] = "Too many levels of symbolic links"
    os.utime(owner, (1, 1))  # registered in 1970: its lease ran out long ago


def _abandoned(yard: Junkyard) -> None:
    """Entries in tmp/ left by submitters that died, links and fifos among them."""
    for kind in ("link-job", "link-fifo", "fifo", "folder"):
        path = yard.folder("tmp") / new_job_id()
        plant_entry(path, kind, yard.outside)
        os.utime(path, (1, 1), follow_symlinks=False)
        yard.quarantined += 1


def assert_junkyard_settled(yard: Junkyard) -> None:
    queue = yard.queue
    for job_id in yard.good:
        found = queue.job(job_id)
        assert found.state is State.DONE, dump(found)
        assert found.result == "good"
    for job_id, words in yard.dead.items():
        found = queue.job(job_id)
        assert found.state is State.DEAD, dump(found)
        assert found.error is not None
        assert words in found.error.get("message", ""), dump(found)
    assert sorted(os.listdir(queue.path / "ready")) == sorted(ready_name(job_id, 0) for job_id in yard.left)
    for job_id in yard.left:
        found = queue.job(job_id)
        assert (found.attempts, found.history) == (0, ()), dump(found)
    assert os.listdir(queue.path / "scheduled") == []
    assert os.listdir(queue.path / "tmp") == []
    names = os.listdir(queue.path / "quarantine")
    entries = [name for name in names if not name.endswith(".why")]
    assert len(entries) == yard.quarantined, sorted(entries)
    assert sorted(f"{name}.why" for name in entries) == sorted(name for name in names if name.endswith(".why"))
    for link in yard.ignored:
        assert link.is_symlink(), f"{link} was moved or replaced"
    assert queue.counts() == {
        "incoming": 0,
        "ready": len(yard.left),
        "scheduled": 0,
        "waiting": 0,
        "claimed": 0,
        "done": len(yard.good),
        "dead": len(yard.dead),
    }
    assert len(queue.jobs()) == len(yard.good) + len(yard.dead) + len(yard.left)
    assert not yard.sentinel.exists(), "an unregistered function ran"


def test_manager_runs_on_through_a_junkyard_and_touches_nothing_outside(
    procs: Processes, tmp_path: Path, outside: Outside
) -> None:
    queue = Queue(tmp_path / "queue")
    yard = build_junkyard(queue, outside, tmp_path / "sentinel")
    with watchdog(30, "the manager (opening a fifo?)"):
        manager = start_manager(procs, queue, tmp_age=60.0)

        def settled() -> bool:
            leftover = [os.listdir(queue.path / name) for name in ("scheduled", "tmp")]
            claimed = set(os.listdir(queue.path / "claimed")) - {manager.owner.name}
            ready = len(os.listdir(queue.path / "ready")) == len(yard.left)
            return ready and not manager.running and not any(leftover) and not claimed

        wait_until(settled, 20, "every entry was claimed, buried or quarantined", manager=manager)
        assert_junkyard_settled(yard)
    outside.check()
    for job_id in yard.good[:2]:  # the two with traps inside
        job_dir = queue.job(job_id).path
        assert (job_dir / "result.json").is_file(), "result.json is the real result, not the planted link"
        assert not (job_dir / "result.json").is_symlink()
        assert (job_dir / "attempt-1").is_symlink() or (job_dir / "attempt-1").is_file(), "the trap was left alone"


# -- what a planted file or link must never do ------------------------------------------------------


def test_a_fifo_for_an_events_file_does_not_block_the_manager(procs: Processes, tmp_path: Path) -> None:
    queue = Queue(tmp_path / "queue")
    trapped = queue.with_options(priority=1).enqueue("fault.ok", "trapped")
    events = queue.job(trapped).path / "events"
    events.unlink()
    os.mkfifo(events)
    after = queue.enqueue("fault.ok", "after the trap")
    app = "tests.faults.fault_jobs:registry"
    with cli_manager(procs, queue, "--app", app, "--concurrency", "1", grace=1.0) as manager:
        wait_until(lambda: queue.job(after).state is State.DONE, 3, "the job after the trapped one ran")
        assert manager.poll() is None
    assert queue.job(trapped).state in (State.DONE, State.DEAD)


@pytest.mark.parametrize(
    ("function", "planted", "end"),
    [("fault.ok", "result.json", State.DONE), ("forkvisor.command", "error.json", State.DEAD)],
    ids=["result-folder", "error-folder"],
)
def test_a_folder_where_a_file_belongs_does_not_strand_the_job(
    procs: Processes, tmp_path: Path, function: str, planted: str, end: State
) -> None:
    queue = Queue(tmp_path / "queue")
    job_id = queue.enqueue(function)
    (queue.job(job_id).path / planted).mkdir()
    manager = start_manager(procs, queue)
    wait_until(lambda: queue.job(job_id).state.terminal, 3, f"the job with a {planted}/ folder ended", manager=manager)
    assert queue.job(job_id).state is end


def _link_clock(queue: Queue, outside: Outside) -> None:
    (queue.path / ".clock").symlink_to(outside.secret)
    queue.serving.filesystem_now()


def _link_heartbeat(queue: Queue, outside: Outside) -> None:
    owner = Owner.new()
    queue.serving.register_owner(owner)
    owner_file = queue.path / "claimed" / owner.name / OWNER_FILE
    owner_file.unlink()
    owner_file.symlink_to(outside.secret)
    queue.serving.heartbeat(owner.name)


@pytest.mark.parametrize("touch", [_link_clock, _link_heartbeat], ids=["clock", "heartbeat"])
def test_touching_a_clock_or_heartbeat_never_follows_a_link(
    tmp_path: Path, outside: Outside, touch: Callable[[Queue, Outside], None]
) -> None:
    queue = Queue(tmp_path / "queue")
    try:
        touch(queue, outside)
    except OSError:
        pass  # refusing the link is fine; following it is not
    outside.check()


@pytest.mark.parametrize("state", ["ready", "tmp"])
def test_a_state_folder_that_is_a_link_out_of_the_queue_is_not_used(tmp_path: Path, state: str) -> None:
    queue = Queue(tmp_path / "queue")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    planted = elsewhere / ready_name(new_job_id(), 0)
    planted.mkdir()
    (planted / "job.json").write_text(json.dumps(GOOD))
    before = os.stat(elsewhere).st_mtime_ns
    os.rmdir(queue.path / state)
    (queue.path / state).symlink_to(elsewhere, target_is_directory=True)
    try:
        reopened = Queue(queue.path, create=False)
        owner = Owner.new()
        reopened.serving.register_owner(owner)
        reopened.enqueue("fault.ok")
        reopened.serving.claim(owner.name)
    except (OSError, JobsError):
        pass  # refusing to use the queue is fine (a QueueError saying why would be best)
    assert os.listdir(elsewhere) == [planted.name], "a folder outside the queue was written"
    assert os.stat(elsewhere).st_mtime_ns == before
    assert json.loads((planted / "job.json").read_text()) == GOOD


# -- only registered functions, nothing unpickled ----------------------------------------------------------


def test_a_shared_queue_runs_no_command_job_unless_told(procs: Processes, tmp_path: Path) -> None:
    queue = Queue(tmp_path / "queue", shared=True)
    sentinel = tmp_path / "sentinel"
    job_id = new_job_id()
    job_dir = queue.path / "ready" / ready_name(job_id, 0)
    job_dir.mkdir()
    spec = {"function": "forkvisor.command", "args": ["touch", str(sentinel)]}
    (job_dir / "job.json").write_text(json.dumps(spec))  # by hand, as any group member could
    manager = start_manager(procs, queue)
    wait_until(lambda: manager.queue.serving.left_for_others, 10, "the command job was given back", manager=manager)
    manager.step(timeout=0.2)
    assert not sentinel.exists()
    found = queue.job(job_id)
    assert found.state is State.READY, dump(found)
    assert (found.attempts, found.history) == (0, ()), "left for a manager started with --commands"


FORBIDDEN_MODULES = {"pickle", "marshal", "shelve", "dill", "cloudpickle", "_pickle", "copyreg"}


def test_nothing_is_unpickled_and_functions_are_only_imported_by_the_operator() -> None:
    """The store and the manager never decode code: no pickle-like module, no eval or exec,
    and the only dynamic import is the operator's --app."""
    importers = []
    for path in sorted([*REPO.glob("jobs/**/*.py"), *REPO.glob("supervisor/**/*.py")]):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [alias.name for alias in node.names] + (
                    [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
                )
                assert not FORBIDDEN_MODULES & {name.split(".")[0] for name in names}, f"{path}: imports {names}"
            elif isinstance(node, ast.Call):
                called = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
                assert called not in {"eval", "exec", "__import__"}, f"{path}:{node.lineno}: {called}"
                if called == "import_module":
                    importers.append(path.relative_to(REPO).as_posix())
    assert importers, "the check found no import_module at all: is it still looking at the right files?"
    assert all(name.startswith("supervisor/cli/") for name in importers), importers


def test_a_job_names_only_registered_functions_even_when_importable(tmp_path: Path) -> None:
    """A job file naming a module path (importable, not registered) is refused by name, in a
    manager process whose registry holds nothing: no import, no call."""
    queue = Queue(tmp_path / "queue")
    sentinel = tmp_path / "sentinel"
    job_id = queue.enqueue("subprocess.call", ["touch", str(sentinel)])
    script = (
        "import sys; from jobs import Queue, Registry; from supervisor.manager import Manager\n"
        "Manager(Queue(sys.argv[1]), Registry(), commands=False, lease=3).run(burst=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(queue.path)], cwd=REPO, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    found = queue.job(job_id)
    assert found.state is State.READY, dump(found)
    assert (found.attempts, found.history) == (0, ())
    assert "leaving jobs of subprocess.call to managers that run it" in done.stderr.decode()
    assert not sentinel.exists()
