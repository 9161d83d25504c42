"""Bad input: each case is refused with the exit code documented in supervisor/cli/__init__.py
and ONE line on stderr starting with "forkvisor" (no traceback, no usage dump), and
leaves the queue as it was."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cli.conftest import UNKNOWN_ID, burst, cli, counts, new_queue, refused, submit
from tests.processes import APP, APP_PATH, REPO


@dataclass(frozen=True)
class Place:
    queue: Path
    done: str
    ready: str
    missing: Path
    not_a_queue: Path


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> Place:
    folder = tmp_path_factory.mktemp("bad-input")
    queue = new_queue(folder / "queue")
    done = submit(queue, "true")
    burst(queue, app=False)
    ready = submit(queue, "true")
    (folder / "plain").mkdir()
    (folder / "plain" / "notes.txt").write_text("not a queue\n")
    return Place(queue, done, ready, folder / "missing", folder / "plain")


CASES = [
    # the queue cannot be used: 111
    pytest.param(("status", "{missing}"), 111, "no such folder", id="status-missing-queue"),
    pytest.param(("submit", "{missing}", "--", "true"), 111, "no such folder", id="submit-missing-queue"),
    pytest.param(("list", "{not_a_queue}"), 111, "not a queue", id="list-not-a-queue"),
    pytest.param(("wait", "{not_a_queue}"), 111, "not a queue", id="wait-not-a-queue"),
    pytest.param(("init", "{not_a_queue}"), 111, "not empty", id="init-in-a-used-folder"),
    pytest.param(
        ("enqueue", "{queue}", "sample.ok", "--app", "tests.nowhere:registry", "--path", str(REPO)),
        111,
        "no module named 'tests.nowhere' on the search path",
        id="enqueue-bad-app",
    ),
    # no such job: 3
    pytest.param(("show", "{queue}", UNKNOWN_ID), 3, "no job", id="show-unknown-id"),
    pytest.param(("logs", "{queue}", UNKNOWN_ID), 3, "no job", id="logs-unknown-id"),
    pytest.param(("wait", "{queue}", UNKNOWN_ID), 3, "no job", id="wait-unknown-id"),
    pytest.param(("cancel", "{queue}", UNKNOWN_ID), 3, "no job", id="cancel-unknown-id"),
    pytest.param(("retry", "{queue}", UNKNOWN_ID), 3, "no job", id="retry-unknown-id"),
    # a job in a state that does not allow the action: 3
    pytest.param(("retry", "{queue}", "{done}"), 3, "only dead jobs can be retried", id="retry-a-done-job"),
    pytest.param(("cancel", "{queue}", "{done}"), 3, "already done", id="cancel-a-done-job"),
    pytest.param(("logs", "{queue}", "{ready}"), 3, "has not run yet", id="logs-of-a-job-not-run"),
    # not a job id: 2
    pytest.param(("show", "{queue}", "not-a-job-id"), 2, "is not a job id", id="show-invalid-id"),
    pytest.param(("wait", "{queue}", "../../etc"), 2, "is not a job id", id="wait-invalid-id"),
    pytest.param(("retry", "{queue}", "not-a-job-id"), 2, "is not a job id", id="retry-invalid-id"),
    pytest.param(("cancel", "{queue}", "not-a-job-id"), 2, "is not a job id", id="cancel-invalid-id"),
    # JSON: 2
    pytest.param(("enqueue", "{queue}", "sample.ok", "--args", "[1,"), 2, "not valid JSON", id="args-bad-json"),
    pytest.param(
        ("enqueue", "{queue}", "sample.ok", "--kwargs", "{value: 1}"), 2, "not valid JSON", id="kwargs-bad-json"
    ),
    pytest.param(
        ("enqueue", "{queue}", "sample.ok", "--args", '{"a": 1}'), 2, "must be a JSON array", id="args-an-object"
    ),
    pytest.param(("enqueue", "{queue}", "sample.ok", "--args", '"one"'), 2, "must be a JSON array", id="args-a-string"),
    pytest.param(
        ("enqueue", "{queue}", "sample.ok", "--kwargs", "[1]"), 2, "must be a JSON object", id="kwargs-an-array"
    ),
    # state names: 2
    pytest.param(("list", "{queue}", "--state", "finished"), 2, "not a state", id="list-unknown-state"),
    pytest.param(
        ("purge", "{queue}", "--state", "ready", "--older-than", "1d"), 2, "only done and dead", id="purge-a-live-state"
    ),
    pytest.param(
        ("purge", "{queue}", "--state", "gone", "--older-than", "1d"), 2, "not a state", id="purge-unknown-state"
    ),
    # durations: 2
    pytest.param(
        ("purge", "{queue}", "--state", "done", "--older-than", "a while"), 2, "not a duration", id="purge-bad-duration"
    ),
    pytest.param(
        ("submit", "{queue}", "--timeout", "5 minutes", "--", "true"), 2, "not a duration", id="submit-bad-timeout"
    ),
    pytest.param(("enqueue", "{queue}", "sample.ok", "--delay", "soon"), 2, "not a duration", id="enqueue-bad-delay"),
    pytest.param(("wait", "{queue}", "{ready}", "--timeout", "forever"), 2, "not a duration", id="wait-bad-timeout"),
    pytest.param(("config", "{queue}", "retention", "1 week"), 2, "not a duration", id="config-bad-duration"),
    pytest.param(("run", "{queue}", "--lease", "30 s", "--burst"), 2, "not a duration", id="run-bad-lease"),
    # other options and arguments: 2
    pytest.param(
        ("enqueue", "{queue}", "sample.nope", "--app", APP, *APP_PATH),
        2,
        "no function is registered as 'sample.nope'",
        id="enqueue-unknown-function",
    ),
    pytest.param(("enqueue", "{queue}", "sample.ok", "--priority", "101"), 2, "out of range", id="priority-too-high"),
    pytest.param(("enqueue", "{queue}", "sample.ok", "--meta", "novalue"), 2, "KEY=VALUE", id="meta-without-value"),
    pytest.param(("enqueue", "{queue}", "sample.ok", "--at", "next tuesday"), 2, "not a time", id="at-not-a-time"),
    pytest.param(("enqueue", "{queue}", "sample.ok", "--memory-limit", "lots"), 2, "not a size", id="bad-size"),
    pytest.param(("submit", "{queue}", "--max-attempts", "0", "--", "true"), 2, "max_attempts", id="no-attempts"),
    pytest.param(("submit", "{queue}", "--env", "NOEQUALS", "--", "true"), 2, "KEY=VALUE", id="env-without-value"),
    pytest.param(("submit", "{queue}"), 2, "no command", id="submit-without-command"),
    pytest.param(("submit", "{queue}", "--stdin", "--", "true"), 2, "not both", id="submit-stdin-and-command"),
    pytest.param(("list", "{queue}", "--", "true"), 2, "only `submit` and `schedule add`", id="double-dash-elsewhere"),
    pytest.param(("list", "{queue}", "--limit", "-1"), 2, "--limit", id="negative-limit"),
    pytest.param(("logs", "{queue}", "{done}", "--attempt", "7"), 2, "has no run 7", id="logs-no-such-run"),
    pytest.param(("config", "{queue}", "colour"), 2, "not a queue setting", id="config-unknown-key"),
    pytest.param(("retry", "{queue}", "{done}", "--dead"), 2, "not both", id="retry-ids-and-dead"),
    pytest.param(("wait", "{queue}", "-", "{ready}"), 2, "must be the only", id="wait-dash-and-ids"),
    pytest.param(("run", "{queue}", "--concurrency", "0"), 2, "concurrency", id="run-no-concurrency"),
    # durations that are not what they look like: 2
    pytest.param(
        ("submit", "{queue}", "--timeout", "-5s", "--", "true"),
        2,
        "'-5s' is negative: a duration must be positive",
        id="negative-timeout",
    ),
    pytest.param(("run", "{queue}", "--lease", "-3"), 2, "'-3' is negative", id="negative-lease"),
    pytest.param(
        ("enqueue", "{queue}", "sample.ok", "--delay", "99999d"),
        2,
        "'99999d' is too long a duration: at most 100 years",
        id="delay-too-long",
    ),
    pytest.param(
        ("submit", "{queue}", "--timeout", "5M", "--", "true"),
        2,
        "units are lowercase (5m is five minutes; M means MiB in sizes)",
        id="timeout-in-megabytes",
    ),
    pytest.param(
        ("submit", "{queue}", "--backoff", "often", "--", "true"), 2, "backoff 'often' is not one", id="backoff"
    ),
    pytest.param(
        ("enqueue", "{queue}", "sample.ok", "--app", APP, *APP_PATH, "--kwargs", '{"valeu": 1}'),
        2,
        "cannot enqueue sample.ok(value: 'Any' = None) -> 'dict[str, Any]': got an unexpected keyword argument 'valeu'",
        id="enqueue-misspelled-keyword",
    ),
    pytest.param(("cancel", "{queue}"), 2, "name the jobs to cancel, or give --function", id="cancel-nothing"),
    pytest.param(("frobnicate", "{queue}"), 2, "invalid choice", id="unknown-command"),
]


@pytest.mark.parametrize(("args", "code", "message"), CASES)
def test_bad_input_is_refused_in_one_line(place: Place, args: tuple[str, ...], code: int, message: str) -> None:
    before = counts(place.queue)
    placeholders = {f"{{{name}}}": str(value) for name, value in vars(place).items()}
    words = [placeholders.get(arg, arg) for arg in args]
    refused(cli(*words), code, message)
    assert counts(place.queue) == before, "a refused command changed the queue"
    assert list((place.queue / "tmp").iterdir()) == []


def test_wait_refuses_a_bad_id_read_from_stdin(place: Place) -> None:
    refused(cli("wait", place.queue, "-", stdin=f"{place.done}\nnot-an-id\n"), 2, "'not-an-id' is not a job id")
