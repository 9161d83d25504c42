"""Queue settings, durations, command job specs, and waiting for jobs, at the store level.

Jobs are finished here by hand (claim and complete or fail in this process),
so waiting is tested without a manager; tests/cli runs the same with one.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from jobs import (
    COMMAND,
    Command,
    InvalidJob,
    JobFailed,
    JobNotFound,
    NotFinished,
    Owner,
    Queue,
    QueueError,
    State,
    WaitTimeout,
    command_call,
    format_duration,
    parse_duration,
)

# -- durations ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("1.5", 1.5), ("500ms", 0.5), ("30s", 30), ("5m", 300), ("2h", 7200), ("7d", 604800),
     ("1w", 604800), ("1h30m", 5400), (" 2h ", 7200), ("0", 0)],
)  # fmt: skip
def test_durations_parse(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["5M", "2H", "30S", "1D"])
def test_units_of_durations_are_lowercase(text: str) -> None:
    """`5M` would be five minutes to one reader and 5 MiB to another (sizes use M)."""
    with pytest.raises(ValueError, match=r"units are lowercase \(5m is five minutes; M means MiB in sizes\)"):
        parse_duration(text)


@pytest.mark.parametrize("text", ["-5", "-5s", "-1h30m"])
def test_a_negative_duration_says_it_must_be_positive(text: str) -> None:
    with pytest.raises(ValueError, match=r"is negative: a duration must be positive"):
        parse_duration(text)


@pytest.mark.parametrize("text", ["", "5x", "m5", "-3", "1h 30m", "nan", "inf", "5mm", "1e999"])
def test_bad_durations_say_how_to_write_one(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


@pytest.mark.parametrize(("seconds", "text"), [(None, "none"), (45, "45s"), (300, "5m"), (7200, "2h"), (604800, "7d")])
def test_durations_format_exactly(seconds: float | None, text: str) -> None:
    assert format_duration(seconds) == text
    if seconds is not None:
        assert parse_duration(text) == seconds


# -- settings ----------------------------------------------------------------------------


BUILT_IN = {
    "max_attempts": 3,
    "timeout": None,
    "memory_limit": None,
    "output_limit": 8 << 20,
    "backoff": "exponential 1s 5m",
    "lease": 30.0,
    "retention": None,
    "root_jobs": False,
}


def test_a_new_queue_has_the_documented_settings(queue: Queue) -> None:
    assert queue.settings == BUILT_IN
    assert queue.stored_settings == {}


def test_configure_stores_checked_values_in_the_marker(queue: Queue) -> None:
    settings = queue.configure(
        max_attempts="5", timeout="5m", lease=12, retention="7d", memory_limit="512M", backoff="fixed 10s"
    )

    stored = {
        "max_attempts": 5,
        "timeout": 300.0,
        "memory_limit": 512 << 20,
        "backoff": "fixed 10s",
        "lease": 12.0,
        "retention": 604800.0,
    }
    assert settings == {**stored, "output_limit": 8 << 20, "root_jobs": False}
    assert json.loads((queue.path / "queue.json").read_text())["defaults"] == stored
    assert Queue(queue.path, create=False).settings == settings


def test_a_setting_can_be_unset_to_take_the_built_in_value_again(queue: Queue) -> None:
    queue.configure(max_attempts=5, backoff="30s")
    assert queue.configure(max_attempts=None)["max_attempts"] == 3
    assert queue.stored_settings == {"backoff": "fixed 30s"}


def test_settings_can_be_cleared_with_none(queue: Queue) -> None:
    queue.configure(timeout="5m", retention="1d")
    assert queue.configure(timeout="none", retention=None)["timeout"] is None
    assert queue.settings["retention"] is None


def test_new_jobs_record_no_default_and_claims_take_the_configured_ones(queue: Queue) -> None:
    queue.configure(max_attempts=6, timeout="2m")
    job_id = queue.enqueue("sample.echo")
    spec = queue.job(job_id).spec
    assert (spec.max_attempts, spec.timeout) == (None, None), "job.json records only what the submitter gave"
    owner = Owner.new()
    queue.serving.register_owner(owner)
    claim = queue.serving.claim(owner.name)
    assert claim is not None
    assert (claim.policy.max_attempts, claim.policy.timeout) == (6, 120.0)
    assert claim.policy.sources["max_attempts"] == "queue"


@pytest.mark.parametrize(
    ("changes", "message"),
    [({"colour": "red"}, "not a queue setting"), ({"max_attempts": 0}, "max_attempts"),
     ({"max_attempts": True}, "max_attempts"), ({"lease": "none"}, "lease"), ({"lease": 0}, "lease"),
     ({"timeout": "soon"}, "timeout"), ({"retention": -1}, "retention"), ({"memory_limit": "lots"}, "memory_limit"),
     ({"backoff": "sometimes"}, "backoff"), ({"max_attempts": None, "colour": None}, "not a queue setting")],
)  # fmt: skip
def test_bad_settings_are_refused_and_nothing_is_stored(queue: Queue, changes: dict[str, object], message: str) -> None:
    before = (queue.path / "queue.json").read_bytes()
    with pytest.raises(InvalidJob, match=message):
        queue.configure(**changes)
    assert (queue.path / "queue.json").read_bytes() == before


def test_a_hand_broken_setting_is_reported_when_opening(queue_path: Path) -> None:
    Queue(queue_path)
    marker = json.loads((queue_path / "queue.json").read_text())
    marker["defaults"]["lease"] = "soon"
    (queue_path / "queue.json").write_text(json.dumps(marker))

    with pytest.raises(QueueError, match=r"bad setting.*lease.*forkvisor config"):
        Queue(queue_path, create=False)


def test_unknown_stored_settings_are_ignored(queue_path: Path) -> None:
    """A newer forkvisor may add settings; this one must still open the queue."""
    Queue(queue_path)
    marker = json.loads((queue_path / "queue.json").read_text())
    marker["defaults"]["colour"] = "red"
    (queue_path / "queue.json").write_text(json.dumps(marker))
    assert "colour" not in Queue(queue_path, create=False).settings


# -- command jobs ------------------------------------------------------------------------


def test_a_command_job_is_an_ordinary_job_of_the_reserved_function(queue: Queue) -> None:
    job_id = queue.enqueue_command(["echo", "hi there"], cwd="/tmp", env={"A": "1"}, priority=5, max_attempts=2)

    job = queue.job(job_id)
    assert job.state is State.READY
    assert job.function == COMMAND
    assert job.spec.args == ("echo", "hi there")
    assert job.spec.kwargs == {"cwd": "/tmp", "env": {"A": "1"}}
    assert (job.spec.priority, job.spec.max_attempts) == (5, 2), "given, so recorded"
    assert Command.of(job.spec) == Command(("echo", "hi there"), "/tmp", {"A": "1"})


@pytest.mark.parametrize(
    ("argv", "kwargs", "message"),
    [([], {}, "needs a command"), ([""], {}, "empty"), (["ls", 3], {}, "argument 1"), (["a\0b"], {}, "NUL"),
     (["ls"], {"cwd": ""}, "cwd"), (["ls"], {"cwd": 5}, "cwd"),
     (["ls"], {"env": {"A=B": "1"}}, "env"), (["ls"], {"env": {"A": 1}}, "env"), (["ls"], {"env": ["A"]}, "env")],
)  # fmt: skip
def test_malformed_commands_are_refused_at_submit(
    queue: Queue, argv: list[object], kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidJob, match=message):
        command_call(argv, **kwargs)  # type: ignore[arg-type]  # wrong on purpose
    assert queue.counts()["ready"] == 0


@pytest.mark.parametrize(
    ("argv", "kwargs", "message"),
    [([], {}, "needs a command"), (["ls", 7], {}, "argument 1 must be a string"),
     (["ls"], {"shell": True}, "only cwd and env")],
)  # fmt: skip
def test_a_command_written_by_other_means_is_checked_when_read(
    queue: Queue, argv: list[object], kwargs: dict[str, object], message: str
) -> None:
    job_id = queue.enqueue(COMMAND, *argv, **kwargs)  # by name (like a shell script): not checked yet
    with pytest.raises(InvalidJob, match=message):
        Command.of(queue.job(job_id).spec)


# -- waiting and results -----------------------------------------------------------------


def finish(queue: Queue, owner: Owner, value: object = None, fail: bool = False) -> str:
    """Claim the next job and complete it with `value` (or fail it for good)."""
    claim = queue.serving.claim(owner.name)
    assert claim is not None
    if fail:
        queue.serving.fail(claim, {"type": "ValueError", "message": "bad input"}, permanent=True)
    else:
        claim.run_path.joinpath("result.json").write_text(json.dumps(value))
        queue.serving.complete(claim)
    return claim.job_id


def test_result_returns_the_value_of_a_done_job(queue: Queue, owner: Owner) -> None:
    job_id = queue.enqueue("sample.echo")
    finish(queue, owner, {"answer": 42})
    assert queue.result(job_id) == {"answer": 42}
    assert queue.result(job_id, wait=False) == {"answer": 42}


def test_result_of_a_dead_job_raises_job_failed_with_its_cause(queue: Queue, owner: Owner) -> None:
    job_id = queue.enqueue("sample.echo")
    finish(queue, owner, fail=True)
    with pytest.raises(JobFailed, match="bad input") as failed:
        queue.result(job_id)
    assert failed.value.job_id == job_id
    assert failed.value.error["reason"] == "cannot be completed"


def test_result_without_waiting_says_the_job_has_not_finished(queue: Queue) -> None:
    job_id = queue.enqueue("sample.echo")
    with pytest.raises(NotFinished, match="ready"):
        queue.result(job_id, wait=False)


def test_waiting_times_out_with_the_jobs_still_queued(queue: Queue) -> None:
    job_id = queue.enqueue("sample.echo")
    started = time.monotonic()
    with pytest.raises(WaitTimeout, match=job_id):
        queue.result(job_id, timeout=0.05)
    assert time.monotonic() - started < 5
    assert queue.job(job_id).state is State.READY


def test_wait_returns_when_another_process_finishes_the_jobs(queue: Queue, owner: Owner) -> None:
    ids = [queue.enqueue("sample.echo") for _ in range(3)]
    finisher = threading.Thread(target=lambda: [finish(queue, owner, n, fail=n == 1) for n in range(3)])
    finisher.start()  # a thread stands in for a manager: the waiter only looks at folders
    try:
        states = queue.wait(ids, timeout=30)
    finally:
        finisher.join()
    assert states == {ids[0]: State.DONE, ids[1]: State.DEAD, ids[2]: State.DONE}


def test_wait_with_no_ids_waits_for_the_jobs_unfinished_now(queue: Queue, owner: Owner) -> None:
    early = [queue.enqueue("sample.echo") for _ in range(2)]
    for _ in early:
        finish(queue, owner)
    pending = queue.enqueue("sample.echo")
    with pytest.raises(WaitTimeout, match="1 job"):
        queue.wait(timeout=0.05)
    finish(queue, owner)
    assert queue.wait(timeout=5) == {}  # nothing was unfinished any more
    assert queue.job(pending).state is State.DONE


def test_wait_accepts_one_id_as_a_string(queue: Queue, owner: Owner) -> None:
    job_id = queue.enqueue("sample.echo")
    finish(queue, owner)
    assert queue.wait(job_id) == {job_id: State.DONE}


def test_waiting_for_an_unknown_job_fails_at_once(queue: Queue) -> None:
    with pytest.raises(JobNotFound):
        queue.wait(["20260101-000000-000000-00000000"], timeout=60)


def test_progress_is_reported_until_everything_finished(queue: Queue, owner: Owner) -> None:
    ids = [queue.enqueue("sample.echo") for _ in range(2)]
    finish(queue, owner)
    seen: list[tuple[int, int]] = []
    finisher = threading.Timer(0.05, lambda: finish(queue, owner))
    finisher.start()
    try:
        queue.wait(ids, timeout=30, progress=lambda done, pending: seen.append((len(done), pending)))
    finally:
        finisher.join()
    assert seen[0] == (1, 1)
    assert seen[-1] == (2, 0)
