"""The enqueue fast paths keep their guarantees: the `enqueued` event is logged before
`job.json` (one journal commit fewer per durable enqueue), `job.json` holds exactly the
bytes `json.dumps(indent=1)` gives, and ids keep their time stamp across seconds."""

from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path
from typing import Any

import pytest

import jobs.files
from jobs import Call, JobSpec, Queue, new_job_id
from jobs.job import created_at, indented_json, spec_json


def test_the_enqueued_event_is_in_the_staging_folder_before_job_json(
    queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen_when_spec_written: list[list[str]] = []
    real_write_new = jobs.files.write_new

    def write_new(path: Any, data: bytes, **kwargs: Any) -> None:
        folder = kwargs["dir_fd"]  # the staging folder's handle: written through it
        seen_when_spec_written.append(sorted(os.listdir(folder)))  # the real folder, as it is now
        real_write_new(path, data, **kwargs)

    monkeypatch.setattr(jobs.files, "write_new", write_new)
    queue.enqueue("sample.echo")
    queue.enqueue_many([Call("sample.echo")])
    assert seen_when_spec_written == [["events"], ["events"]]


def test_the_enqueued_event_line_is_unchanged(queue: Queue) -> None:
    job_id = queue.submit(Call("sample.echo"), now=1795430400.5)
    (ready_job,) = (queue.path / "ready").iterdir()
    assert ready_job.name.endswith(job_id)
    assert (ready_job / "events").read_text() == "2026-11-23T10:40:00.500000Z enqueued\n"
    assert sorted(os.listdir(ready_job)) == ["events", "job.json"]


def _random_value(rng: random.Random, depth: int = 0) -> Any:
    scalars: list[Any] = [
        rng.randint(-(10**20), 10**20),
        rng.random() * 10 ** rng.randint(-10, 300),
        -0.0,
        None,
        True,
        False,
        "".join(rng.choice('aé"\\\n\t€𝄞 z') for _ in range(rng.randint(0, 8))),
        [],
        {},
    ]
    if depth < 3 and rng.random() < 0.4:
        if rng.random() < 0.5:
            return [_random_value(rng, depth + 1) for _ in range(rng.randint(1, 3))]
        return {f"k{i}é": _random_value(rng, depth + 1) for i in range(rng.randint(1, 3))}
    return rng.choice(scalars)


def test_spec_json_is_exactly_json_dumps_with_indent_1() -> None:
    rng = random.Random(20261123)
    for _ in range(2000):
        document = {f"field{i}": _random_value(rng) for i in range(rng.randint(0, 6))}
        assert spec_json(document) == json.dumps(document, indent=1, allow_nan=False).encode() + b"\n"


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), object(), [1, {2j: 3}], {"x": [float("-inf")]}])
def test_spec_json_refuses_what_json_dumps_refuses(bad: Any) -> None:
    with pytest.raises((TypeError, ValueError)):
        json.dumps({"args": bad}, indent=1, allow_nan=False)
    with pytest.raises((TypeError, ValueError)):
        spec_json({"args": bad})


@pytest.mark.parametrize(
    "document",
    [
        pytest.param({"run": 1, "status": "exited 0", "error": None, "stderr_tail": "é\n", "cpu": 0.01}, id="flat"),
        pytest.param({"error": {"type": "Crashed", "traceback": "a\nb"}, "signal": "SIGKILL"}, id="nested"),
        pytest.param({"wall_time": float("nan")}, id="nan"),
        pytest.param({"error": {"value": object}}, id="not-json"),
    ],
)
def test_records_are_written_as_json_dumps_with_indent_1_and_repr_would_write_them(document: dict[str, Any]) -> None:
    assert indented_json(document) == json.dumps(document, indent=1, default=repr).encode() + b"\n"


def test_an_enqueued_job_json_is_the_spec_s_own_encoding(queue: Queue, samples: Any) -> None:
    queue.with_options(
        priority=7, timeout="5m", metadata={"who": "me", "n": [1, 2.5], "deep": [None, True, "é"]}, key="k:1"
    ).enqueue(samples.resize, "a.png", width=320)
    (ready_job,) = (queue.path / "ready").iterdir()
    data = (ready_job / "job.json").read_bytes()
    spec = JobSpec.from_json(data, ready_job.name.split(".", 1)[1])
    assert data == spec.to_json()
    assert data == json.dumps(json.loads(data), indent=1).encode() + b"\n"
    assert (spec.args, spec.kwargs["width"], spec.max_attempts, spec.timeout) == (("a.png",), 320, None, 300.0)
    assert spec.priority == 7
    assert spec.metadata == {"who": "me", "n": [1, 2.5], "deep": [None, True, "é"]}
    assert spec.key == "k:1"


def test_an_argument_json_cannot_encode_is_still_named(queue: Queue) -> None:
    with pytest.raises(jobs.ArgumentNotSerializable, match="keyword argument 'when' is not JSON-encodable"):
        queue.enqueue("sample.echo", 1, when=object())
    with pytest.raises(jobs.ArgumentNotSerializable, match="argument 0 is not JSON-encodable"):
        queue.enqueue("sample.echo", float("nan"))
    assert os.listdir(queue.path / "tmp") == []
    assert os.listdir(queue.path / "ready") == []


def test_ids_carry_their_second_across_second_boundaries() -> None:
    # Ascending and ten seconds apart, so no id is pushed along by the one before it.
    for now in (1795430399.999999, 1795430409.5, 1795430419.0, 1795516799.999):
        for when in (now, now + 1.0, now + 1.0000005):
            job_id = new_job_id(when)
            assert re.fullmatch(r"\d{8}-\d{6}-\d{6}-[0-9a-f]{8}", job_id)
            assert abs(created_at(job_id) - when) < 2e-6, (job_id, when)
    assert new_job_id(86400.25).startswith("19700102-000000-250000-")  # back in time: a fresh stamp


def test_a_durable_enqueue_leaves_no_staging_entry(queue_path: Path) -> None:
    queue = Queue(queue_path, durable=True)
    ids = [queue.enqueue("sample.echo", i) for i in range(3)] + queue.enqueue_many(
        [Call("sample.echo", (i,)) for i in range(3)]
    )
    assert os.listdir(queue_path / "tmp") == []
    assert sorted(name.split(".", 1)[1] for name in os.listdir(queue_path / "ready")) == sorted(ids)
