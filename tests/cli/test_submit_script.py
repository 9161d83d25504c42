"""examples/submit.sh, the submitter with no Python: what it refuses, and that what it
publishes runs like any job."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from jobs import Queue, State
from tests.cli.conftest import burst, new_queue
from tests.processes import REPO

SCRIPT = REPO / "examples" / "submit.sh"


def _submit(*args: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ) if path is None else {**os.environ, "PATH": path}
    return subprocess.run(["sh", str(SCRIPT), *args], capture_output=True, text=True, timeout=30, env=env, check=False)


def test_without_arguments_it_prints_its_usage() -> None:
    done = _submit()
    assert done.returncode == 2
    assert done.stderr.startswith("usage: ")
    assert "QUEUE FUNCTION [JSON-ARGS-ARRAY] [PRIORITY]" in done.stderr


def test_its_example_names_a_function_that_exists() -> None:
    from examples.tasks import registry

    example = next(line for line in SCRIPT.read_text().splitlines() if line.startswith("#   e.g.:"))
    assert example.split()[4] in registry, example


@pytest.mark.parametrize(
    "args",
    ['["a.png", 320', "not json", '{"a": 1}', '"one"'],
    ids=["truncated", "bare-words", "an-object", "a-string"],
)
def test_arguments_that_are_not_a_json_array_are_refused(tmp_path: Path, args: str) -> None:
    queue = new_queue(tmp_path / "queue")
    done = _submit(str(queue), "examples.word_count", args)
    assert done.returncode == 2, done
    assert "ARGS must be a JSON array" in done.stderr
    assert os.listdir(queue / "ready") == []
    assert os.listdir(queue / "tmp") == [], "nothing half-written is left behind"


def test_a_function_name_with_quotes_is_written_as_a_json_string(tmp_path: Path) -> None:
    queue = new_queue(tmp_path / "queue")
    done = _submit(str(queue), 'odd"name\\x', "[]")
    assert done.returncode == 0, done
    assert Queue(queue, create=False).job(done.stdout.strip()).function == 'odd"name\\x'


@pytest.mark.skipif(shutil.which("jq") is None, reason="jq is not installed: the python3 check is used")
def test_it_checks_with_jq_when_there_is_one(tmp_path: Path) -> None:
    queue = new_queue(tmp_path / "queue")
    assert _submit(str(queue), "examples.word_count", "[1,").returncode == 2


def test_without_jq_or_python_it_publishes_unchecked_and_says_so(tmp_path: Path) -> None:
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in ("sh", "date", "od", "tr", "printf", "sed", "mkdir", "sync", "mv", "cat", "rm", "stat", "id"):
        found = shutil.which(tool)
        if found:
            (bare / tool).symlink_to(found)
    queue = new_queue(tmp_path / "queue")
    done = _submit(str(queue), "examples.word_count", '["a"]', path=str(bare))
    assert done.returncode == 0, done
    assert "neither jq nor python3 is installed: job.json was not checked" in done.stderr


def test_a_job_it_submits_runs(tmp_path: Path) -> None:
    queue = new_queue(tmp_path / "queue")
    done = _submit(str(queue), "sample.ok", '["from sh"]', "5")
    assert done.returncode == 0, done
    job_id = done.stdout.strip()
    assert os.listdir(queue / "ready") == [f"095.{job_id}"]
    burst(queue)
    found = Queue(queue, create=False).job(job_id)
    assert found.state is State.DONE
    assert found.result is not None
    assert found.result["value"] == "from sh"
