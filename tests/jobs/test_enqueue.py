"""Submitting jobs: by function or name, with options, in batches; what lands on disk."""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import time
import types
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import jobs.files
from jobs import (
    ArgumentNotSerializable,
    BadArguments,
    Call,
    InvalidJob,
    JobOptions,
    JobsError,
    Queue,
    Registry,
    State,
    is_job_id,
)
from jobs.job import MAX_PRIORITY, MIN_PRIORITY, new_job_id

from .conftest import Hand

ID_PATTERN = r"^\d{8}-\d{6}-\d{6}-[0-9a-f]{8}$"


def _spec_on_disk(queue: Queue, job_id: str) -> dict[str, Any]:
    path = queue.job(job_id).path / "job.json"
    result: dict[str, Any] = json.loads(path.read_text())
    return result


def _nothing_staged(hand: Hand) -> bool:
    return hand.names("tmp") == [] and hand.names(State.READY) == [] and hand.names(State.SCHEDULED) == []


# -- by function and by name --------------------------------------------------


def test_enqueue_decorated_function(queue: Queue, hand: Hand, samples: types.SimpleNamespace) -> None:
    job_id = queue.enqueue(samples.add, 2, b=3)
    assert hand.names(State.READY) == [f"100.{job_id}"]
    assert hand.names("tmp") == []
    spec = _spec_on_disk(queue, job_id)
    assert spec["function"] == f"{samples.add.__module__}.add"
    assert spec["args"] == [2]
    assert spec["kwargs"] == {"b": 3}
    assert spec["id"] == job_id
    assert spec["format"] == 1
    assert spec["priority"] == 0
    assert "max_attempts" not in spec, "not given: the claiming manager resolves it"
    assert "timeout" not in spec
    assert spec["metadata"] == {}
    job = queue.job(job_id)
    assert job.state is State.READY
    assert job.attempts == 0
    assert job.history == ()
    assert (job.path / "events").read_text().split()[1:] == ["enqueued"]


def test_enqueue_by_name(queue: Queue) -> None:
    job_id = queue.enqueue("sample.echo", "x", [1, 2], {"k": None}, flag=True)
    spec = queue.job(job_id).spec
    assert spec.function == "sample.echo"
    assert spec.args == ("x", [1, 2], {"k": None})
    assert spec.kwargs == {"flag": True}


def test_enqueue_registered_name_of_a_renamed_function(queue: Queue, samples: types.SimpleNamespace) -> None:
    job_id = queue.enqueue(samples.echo)
    assert queue.job(job_id).spec.function == "sample.echo"


def test_undecorated_function_is_refused_naming_the_decorator(
    queue: Queue, hand: Hand, samples: types.SimpleNamespace
) -> None:
    with pytest.raises(InvalidJob, match=r"undecorated is not registered: decorate it with @registry\.job"):
        queue.enqueue(samples.undecorated, 1)
    assert _nothing_staged(hand)


@pytest.mark.parametrize("name", ["", "   "])
def test_empty_function_name_is_refused(queue: Queue, hand: Hand, name: str) -> None:
    with pytest.raises(InvalidJob, match=r"function name is empty"):
        queue.enqueue(name)
    assert _nothing_staged(hand)


# -- per-job options -----------------------------------------------------------


def test_options_end_up_in_job_json(queue: Queue, samples: types.SimpleNamespace) -> None:
    submitter = queue.with_options(
        max_attempts=9, timeout=2.5, priority=7, memory_limit=1 << 20, metadata={"batch": "b1", "n": 3}
    )
    job_id = submitter.enqueue(samples.add, 1, 2)
    spec = _spec_on_disk(queue, job_id)
    assert spec["max_attempts"] == 9
    assert spec["timeout"] == 2.5
    assert spec["priority"] == 7
    assert spec["memory_limit"] == 1 << 20
    assert spec["metadata"] == {"batch": "b1", "n": 3}
    assert spec["args"] == [1, 2]
    assert (queue.path / "ready" / f"093.{job_id}").is_dir()


@pytest.mark.parametrize(
    ("priority", "prefix"),
    [(MAX_PRIORITY, "000"), (1, "099"), (0, "100"), (-1, "101"), (MIN_PRIORITY, "200")],
)
def test_priority_sets_the_ready_name(queue: Queue, priority: int, prefix: str) -> None:
    job_id = queue.with_options(priority=priority).enqueue("sample.echo")
    assert queue.job(job_id).path.name == f"{prefix}.{job_id}"
    assert queue.job(job_id).spec.priority == priority


def test_delay_schedules_the_job(queue: Queue, hand: Hand) -> None:
    now = time.time() - 0.75  # an enqueue time in the past: ids never run ahead of the clock
    job_id = queue.submit(Call("sample.echo", options=JobOptions(delay=60, priority=5)), now=now)
    due_ms = math.ceil((now + 60) * 1000)
    assert hand.names(State.SCHEDULED) == [f"{due_ms:013d}.095.{job_id}"]
    assert hand.names(State.READY) == []
    job = queue.job(job_id)
    assert job.state is State.SCHEDULED
    assert job.spec.created == now


def test_delay_through_with_options_is_measured_from_created(queue: Queue, hand: Hand) -> None:
    job_id = queue.with_options(delay=3600).enqueue("sample.echo")
    created = queue.job(job_id).spec.created
    assert hand.names(State.SCHEDULED) == [f"{math.ceil((created + 3600) * 1000):013d}.100.{job_id}"]


def test_run_at_in_the_future_schedules_at_that_time(queue: Queue, hand: Hand) -> None:
    now = time.time()
    run_at = now + 86400.5
    job_id = queue.submit(Call("sample.echo", options=JobOptions(run_at=run_at)), now=now)
    assert hand.names(State.SCHEDULED) == [f"{math.ceil(run_at * 1000):013d}.100.{job_id}"]


@pytest.mark.parametrize(
    "options",
    [
        pytest.param(JobOptions(run_at=1_000_000_000.0), id="run_at-in-the-past"),
        pytest.param(JobOptions(delay=0), id="no-delay"),
        pytest.param(JobOptions(delay=-5), id="negative-delay"),
    ],
)
def test_due_now_or_before_goes_to_ready(queue: Queue, hand: Hand, options: JobOptions) -> None:
    job_id = queue.submit(Call("sample.echo", options=options), now=time.time())
    assert hand.names(State.READY) == [f"100.{job_id}"]
    assert hand.names(State.SCHEDULED) == []


def test_keywords_named_like_options_go_to_the_function(queue: Queue, hand: Hand) -> None:
    options = {"priority": 5, "delay": 60, "run_at": 1.0, "max_attempts": 0, "timeout": -1, "metadata": "m"}
    job_id = queue.enqueue("sample.echo", **options)
    spec = queue.job(job_id).spec
    assert spec.kwargs == options
    assert spec.priority == 0
    assert spec.max_attempts is None
    assert spec.timeout is None
    assert spec.metadata == {}
    assert hand.names(State.READY) == [f"100.{job_id}"]


def test_keywords_named_like_options_with_options_too(queue: Queue) -> None:
    job_id = queue.with_options(priority=1).enqueue("sample.echo", priority=99)
    spec = queue.job(job_id).spec
    assert spec.priority == 1
    assert spec.kwargs == {"priority": 99}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        pytest.param({"timeout": -1}, r"timeout must be positive \(or 0 for no limit\), got -1", id="negative-timeout"),
        pytest.param({"timeout": "-5s"}, r"timeout '-5s' is negative: a duration must be positive", id="neg-text"),
        pytest.param({"timeout": "5M"}, r"units are lowercase", id="megabyte-timeout"),
        pytest.param({"timeout": math.inf}, r"timeout must be a finite number", id="infinite-timeout"),
        pytest.param({"timeout": "soon"}, r"timeout 'soon' is not a duration", id="string-timeout"),
        pytest.param({"timeout": [5]}, r"timeout must be a finite number of seconds", id="list-timeout"),
        pytest.param({"run_at": datetime(2030, 1, 1)}, r"has no time zone", id="naive-run_at"),
        pytest.param({"run_at": "tomorrow"}, r"run_at must be epoch seconds or an aware datetime", id="text-run_at"),
        pytest.param({"memory_limit": "lots"}, r"memory_limit 'lots' is not a size", id="text-memory"),
        pytest.param({"backoff": "sometimes"}, r"backoff 'sometimes' is not one", id="bad-backoff"),
        pytest.param({"backoff": print}, r"a job's backoff must be text", id="callable-backoff"),
        pytest.param({"delay": 1, "run_at": 2.0}, r"either delay or run_at, not both", id="delay-and-run_at"),
        pytest.param({"delay": math.nan}, r"delay must be a finite number", id="nan-delay"),
        pytest.param({"priority": 101}, r"priority 101 is out of range: use -100\.\.100", id="priority-too-high"),
        pytest.param({"priority": -101}, r"priority -101 is out of range", id="priority-too-low"),
        pytest.param({"priority": 1.5}, r"priority must be an integer", id="float-priority"),
        pytest.param({"priority": True}, r"priority must be an integer", id="bool-priority"),
        pytest.param({"max_attempts": True}, r"max_attempts must be a whole number of at least 1", id="bool-max"),
        pytest.param({"max_attempts": 0}, r"max_attempts must be a whole number of at least 1, got 0", id="zero"),
        pytest.param({"max_attempts": 2.0}, r"max_attempts must be a whole number", id="float-max"),
        pytest.param({"memory_limit": -1}, r"memory_limit must be positive", id="negative-memory"),
        pytest.param({"metadata": ["a"]}, r"metadata must be a mapping, got list", id="list-metadata"),
    ],
)
def test_bad_options_are_refused(queue: Queue, hand: Hand, options: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidJob, match=message):
        queue.with_options(**options).enqueue("sample.echo")
    assert _nothing_staged(hand)


def test_unknown_option_is_refused(queue: Queue) -> None:
    with pytest.raises(TypeError, match=r"priorty"):
        queue.with_options(priorty=5)


# -- arguments that JSON cannot hold ------------------------------------------------


@pytest.mark.parametrize(
    ("args", "kwargs", "where"),
    [
        pytest.param((1, {2, 3}), {}, "argument 1", id="set-positional"),
        pytest.param((object(),), {}, "argument 0", id="object-positional"),
        pytest.param((), {"when": b"bytes"}, "keyword argument 'when'", id="bytes-keyword"),
        pytest.param((1.0, math.nan), {}, "argument 1", id="nan-positional"),
        pytest.param((), {"x": 1, "deep": {"list": [1, math.inf]}}, "keyword argument 'deep'", id="nested-inf"),
        pytest.param(({(1, 2): "tuple key"},), {}, "argument 0", id="tuple-key"),
    ],
)
def test_non_json_argument_is_refused_naming_it(
    queue: Queue, hand: Hand, args: tuple[Any, ...], kwargs: dict[str, Any], where: str
) -> None:
    with pytest.raises(ArgumentNotSerializable) as info:
        queue.enqueue("sample.echo", *args, **kwargs)
    assert f"cannot enqueue: {where} is not JSON-encodable" in str(info.value)
    assert isinstance(info.value, TypeError)
    assert isinstance(info.value, JobsError)
    assert _nothing_staged(hand)


def test_non_json_metadata_is_refused(queue: Queue, hand: Hand) -> None:
    with pytest.raises(ArgumentNotSerializable, match=r"metadata is not JSON-encodable"):
        queue.with_options(metadata={"when": object()}).enqueue("sample.echo")
    assert _nothing_staged(hand)


def test_argument_not_serializable_is_a_type_error(queue: Queue) -> None:
    with pytest.raises(TypeError):
        queue.enqueue("sample.echo", {1, 2})


MAX_DEPTH = 64  # levels of JSON a manager reads in job.json (docs/SECURITY.md)


def _nested(levels: int, kind: type = dict) -> Any:
    """ "x" inside `levels` dicts, lists or tuples."""
    value: Any = "x"
    for _ in range(levels):
        value = {"a": value} if kind is dict else kind([value])
    return value


def test_arguments_nested_as_deep_as_a_manager_reads_are_enqueued_and_read_back(queue: Queue) -> None:
    deepest = _nested(MAX_DEPTH - 2)  # job.json, then its kwargs: two levels already
    job_id = queue.enqueue("sample.echo", deep=deepest)
    assert queue.job(job_id).spec.kwargs == {"deep": deepest}  # read through the reader a claim uses


DEEP_ENQUEUES: dict[str, Callable[[Queue, Any], str]] = {
    "keyword": lambda queue, value: queue.enqueue("sample.echo", deep=value),
    "positional": lambda queue, value: queue.enqueue("sample.echo", value),
    "metadata": lambda queue, value: queue.with_options(metadata={"deep": value}).enqueue("sample.echo"),
}


@pytest.mark.parametrize(
    ("levels", "kind", "where"),
    [(MAX_DEPTH - 1, dict, "keyword"), (MAX_DEPTH - 1, tuple, "positional"), (5_000, list, "metadata")],
)
def test_arguments_nested_deeper_than_a_manager_reads_are_refused_at_enqueue(
    queue: Queue, hand: Hand, levels: int, kind: type, where: str
) -> None:
    """The claim would bury such a job as unreadable: the enqueue says so instead (and a
    very deep one is no RecursionError from the encoder)."""
    value = _nested(levels, kind)
    with pytest.raises(InvalidJob, match=f"nest JSON more than {MAX_DEPTH} levels deep"):
        DEEP_ENQUEUES[where](queue, value)
    assert _nothing_staged(hand)


def test_tuples_come_back_as_lists(queue: Queue) -> None:
    job_id = queue.enqueue("sample.echo", (1, 2), nested={"t": (3,)})
    spec = queue.job(job_id).spec
    assert spec.args == ([1, 2],)
    assert spec.kwargs == {"nested": {"t": [3]}}


# -- what the spec records ----------------------------------------------------------------


def test_the_spec_records_no_policy_the_submitter_did_not_give(queue: Queue, samples: types.SimpleNamespace) -> None:
    """The registration's policy applies when a manager claims the job (tests/jobs/test_policy.py),
    so a job enqueued by name or from the shell gets it too; the spec holds none of it."""
    queue.configure(max_attempts=7, timeout=12.5)
    for job_id in (queue.enqueue(samples.resize, "a.png"), queue.enqueue("sample.anything")):
        on_disk = _spec_on_disk(queue, job_id)
        assert {"max_attempts", "timeout", "memory_limit", "backoff"}.isdisjoint(on_disk), on_disk
        spec = queue.job(job_id).spec
        assert (spec.max_attempts, spec.timeout, spec.memory_limit, spec.backoff) == (None, None, None, None)


def test_the_spec_records_what_the_submitter_gave(queue: Queue, samples: types.SimpleNamespace) -> None:
    options = {"max_attempts": 2, "timeout": "1.5s", "memory_limit": "4k", "backoff": "exponential 2s 1m"}
    job_id = queue.with_options(**options).enqueue(samples.resize, "a.png")
    spec = queue.job(job_id).spec
    assert (spec.max_attempts, spec.timeout, spec.memory_limit, spec.backoff) == (2, 1.5, 4096, "exponential 2s 1m")
    on_disk = _spec_on_disk(queue, job_id)
    assert (on_disk["max_attempts"], on_disk["timeout"], on_disk["memory_limit"]) == (2, 1.5, 4096)


def test_no_limit_is_recorded_as_zero(queue: Queue) -> None:
    spec = queue.job(queue.with_options(timeout=0, memory_limit="0").enqueue("sample.echo")).spec
    assert (spec.timeout, spec.memory_limit) == (0, 0), "0: no limit, whatever the function or the queue say"


def test_python_takes_what_the_cli_takes(queue: Queue) -> None:
    when = datetime.now(UTC) + timedelta(hours=1)
    job_id = queue.with_options(timeout=timedelta(minutes=5), run_at=when, memory_limit="512M").enqueue("sample.echo")
    spec = queue.job(job_id).spec
    assert (spec.timeout, spec.memory_limit) == (300.0, 512 << 20)
    assert queue.job(job_id).state is State.SCHEDULED
    assert job_id in queue.job(job_id).path.name
    assert queue.job(job_id).path.name.startswith(f"{math.ceil(when.timestamp() * 1000):013d}.")


def test_a_registration_s_priority_places_a_job_enqueued_with_the_function(queue: Queue, hand: Hand) -> None:
    """Priority is part of the entry's name, so it is decided when the job is published:
    by the submitter, else by a registration the submitter knows."""
    registry = Registry()

    @registry.job(name="urgent", priority=20)
    def urgent() -> None:
        return None

    by_function = queue.enqueue(urgent)
    by_name = queue.enqueue("urgent")
    explicit = queue.with_options(priority=-5).enqueue(urgent)
    assert sorted(hand.names(State.READY)) == sorted([f"080.{by_function}", f"100.{by_name}", f"105.{explicit}"])


# -- arguments checked against the function ---------------------------------------------------


def test_a_misspelled_keyword_fails_at_enqueue_naming_the_function(
    queue: Queue, hand: Hand, samples: types.SimpleNamespace
) -> None:
    with pytest.raises(
        BadArguments, match=r"cannot enqueue .*resize\(path: .*got an unexpected keyword argument 'widht'"
    ):
        queue.enqueue(samples.resize, "a.png", widht=3)
    assert isinstance(BadArguments("x"), TypeError)
    assert _nothing_staged(hand)


@pytest.mark.parametrize(("args", "kwargs"), [((), {}), ((1, 2, 3), {}), ((1,), {"a": 2, "b": 3})])
def test_a_wrong_arity_fails_at_enqueue(
    queue: Queue, samples: types.SimpleNamespace, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    with pytest.raises(BadArguments, match=r"cannot enqueue .*add\(a: 'int', b: 'int'\) -> 'int': "):
        queue.enqueue(samples.add, *args, **kwargs)


def test_a_per_job_option_given_as_a_keyword_points_to_with_options(
    queue: Queue, samples: types.SimpleNamespace
) -> None:
    with pytest.raises(
        BadArguments, match=r"max_attempts is a per-job option.*queue\.with_options\(max_attempts=\.\.\.\)"
    ):
        queue.enqueue(samples.resize, "a.png", max_attempts=1)


def test_a_function_that_takes_any_keyword_gets_option_names_as_arguments(
    queue: Queue, samples: types.SimpleNamespace
) -> None:
    spec = queue.job(queue.enqueue(samples.echo, max_attempts=1)).spec
    assert (spec.kwargs, spec.max_attempts) == ({"max_attempts": 1}, None)


def test_a_batch_is_checked_before_anything_is_written(
    queue: Queue, hand: Hand, samples: types.SimpleNamespace
) -> None:
    with pytest.raises(BadArguments):
        queue.enqueue_many([Call(samples.add, (1, 2)), Call(samples.add, (1,))])
    assert hand.names(State.READY) == []
    assert _nothing_staged(hand)


# -- batches -----------------------------------------------------------------------------------


class _Counter:
    """Counts the file-system barriers a queue asks for: `files.sync_filesystem` (what it was
    given) and each folder fsync (the folder's path), calling them through."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
        self.calls: list[Any] = []
        if name == "fsync_dir":
            real_sync = jobs.files.sync_folder

            def sync_folder(fd: int) -> None:
                self.calls.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
                real_sync(fd)

            monkeypatch.setattr(jobs.files, "sync_folder", sync_folder)
            return
        real = getattr(jobs.files, name)

        def spy(target: Any) -> None:
            self.calls.append(target)
            real(target)

        monkeypatch.setattr(jobs.files, name, spy)


def test_enqueue_many_publishes_in_order_with_one_barrier(
    queue: Queue, hand: Hand, monkeypatch: pytest.MonkeyPatch, samples: types.SimpleNamespace
) -> None:
    syncs = _Counter(monkeypatch, "sync_filesystem")
    dir_syncs = _Counter(monkeypatch, "fsync_dir")
    calls = [
        Call(samples.add, (1, 2)),
        Call("sample.echo", kwargs={"priority": 3}),
        Call(samples.resize, ("a.png",), options=JobOptions(priority=5)),
        Call("sample.echo", options=JobOptions(delay=600)),
    ]
    ids = queue.enqueue_many(calls)
    assert len(ids) == 4
    assert ids == sorted(ids)
    assert [queue.job(job_id).spec.function for job_id in ids] == [
        f"{samples.add.__module__}.add",
        "sample.echo",
        f"{samples.resize.__module__}.resize",
        "sample.echo",
    ]
    assert hand.names(State.READY) == [f"095.{ids[2]}", f"100.{ids[0]}", f"100.{ids[1]}"]
    assert [name.split(".")[-1] for name in hand.names(State.SCHEDULED)] == [ids[3]]
    assert queue.job(ids[1]).spec.kwargs == {"priority": 3}
    assert queue.job(ids[1]).spec.priority == 0
    assert hand.names("tmp") == []
    assert syncs.calls == [queue.folder.root.fd]  # one barrier, for the queue's file system
    assert sorted(dir_syncs.calls) == sorted([queue.path / "ready", queue.path / "scheduled"])


def test_enqueue_many_with_one_bad_argument_publishes_nothing(queue: Queue, hand: Hand) -> None:
    calls = [Call("sample.echo", (1,)), Call("sample.echo", (2,)), Call("sample.echo", ({3},)), Call("sample.echo")]
    with pytest.raises(ArgumentNotSerializable, match=r"argument 0"):
        queue.enqueue_many(calls)
    assert _nothing_staged(hand)
    assert queue.counts() == {
        "incoming": 0,
        "ready": 0,
        "scheduled": 0,
        "waiting": 0,
        "claimed": 0,
        "done": 0,
        "dead": 0,
    }


def test_enqueue_many_with_an_unregistered_function_publishes_nothing(
    queue: Queue, hand: Hand, samples: types.SimpleNamespace
) -> None:
    with pytest.raises(InvalidJob, match=r"not registered"):
        queue.enqueue_many([Call(samples.add, (1, 2)), Call(samples.undecorated, (1,))])
    assert _nothing_staged(hand)


def test_enqueue_many_of_nothing(queue: Queue) -> None:
    assert queue.enqueue_many([]) == []


def test_enqueue_many_through_with_options(queue: Queue, hand: Hand) -> None:
    ids = queue.with_options(priority=4).enqueue_many(
        [Call("sample.echo", (1,)), Call("sample.echo", (2,), options=JobOptions(priority=-4))]
    )
    assert hand.names(State.READY) == [f"096.{ids[0]}", f"104.{ids[1]}"]


def test_not_durable_works_the_same(
    queue_path: Path, monkeypatch: pytest.MonkeyPatch, samples: types.SimpleNamespace
) -> None:
    syncs = _Counter(monkeypatch, "sync_filesystem")
    dir_syncs = _Counter(monkeypatch, "fsync_dir")
    Queue(queue_path)  # created durably; the counting starts with the non-durable queue
    syncs.calls.clear()
    dir_syncs.calls.clear()
    queue = Queue(queue_path, durable=False)
    hand = Hand(queue)
    one = queue.enqueue(samples.add, 1, 2)
    batch = queue.enqueue_many([Call("sample.echo", (1,)), Call("sample.echo", options=JobOptions(delay=60))])
    later = queue.with_options(delay=60).enqueue("sample.echo")
    assert hand.names(State.READY) == [f"100.{one}", f"100.{batch[0]}"]
    assert sorted(name.split(".")[-1] for name in hand.names(State.SCHEDULED)) == sorted([batch[1], later])
    assert queue.job(one).spec.args == (1, 2)
    assert hand.names("tmp") == []
    assert syncs.calls == []
    assert dir_syncs.calls == []


# -- ids ------------------------------------------------------------------------------------------


def test_ids_are_strictly_increasing_and_well_formed(queue: Queue) -> None:
    live = [queue.enqueue("sample.echo", n) for n in range(20)]
    live += queue.enqueue_many([Call("sample.echo", (n,)) for n in range(20)])
    past = queue.enqueue_many([Call("sample.echo", (n,)) for n in range(20)], now=1_000_000_000.0)
    later = queue.enqueue("sample.echo", 0)
    for ids in (live, past):
        assert all(is_job_id(job_id) for job_id in ids)
        assert [job_id for job_id in ids if not re.match(ID_PATTERN, job_id)] == []
        assert all(a < b for a, b in itertools.pairwise(ids))
    assert past[0].startswith("20010909-")  # an explicit `now` is used as given...
    assert later > live[-1]  # ...and drags nothing: ids from the clock keep going
    assert len(set(live + past)) == len(live + past)


def test_id_carries_the_utc_enqueue_time() -> None:
    before = time.time()
    job_id = new_job_id()
    stamp = datetime.strptime(job_id[:22], "%Y%m%d-%H%M%S-%f").replace(tzinfo=UTC).timestamp()
    assert before - 1e-6 <= stamp <= time.time() + 1, (job_id, before)


@pytest.mark.parametrize(
    "text",
    ["", "20261123-103300-123456-a1b2c3d", "20261123-103300-123456-A1B2C3D4", "../20261123-103300-123456-a1b2c3d4"],
)
def test_is_job_id_rejects_near_misses(text: str) -> None:
    assert not is_job_id(text)


def test_submit_returns_after_the_job_is_on_disk(queue: Queue) -> None:
    job_id = queue.submit(Call("sample.echo", (1,)))
    path = queue.path / "ready" / f"100.{job_id}"
    assert json.loads((path / "job.json").read_text())["args"] == [1]
    assert os.stat(path / "job.json").st_size > 0
