"""What is declared is what runs: a registered function's policy is enforced by a real
manager however the job was submitted (Python with the function or its name, the CLI,
the shell script), a per-job option still wins, and the queue's settings apply to a
function that declares nothing. Each job sleeps 30 s, so only an enforced timeout ends it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from jobs import Job, Queue, State
from tests import sample_jobs
from tests.cli.conftest import burst, enqueue, new_queue, ok
from tests.processes import APP, APP_PATH, REPO, dump, outcome

DECLARED = {"max_attempts": 2, "timeout": 0.5, "backoff": "fixed 0.3s"}  # sample.declared's registration


def _by_shell(queue: Path, function: str, args: str) -> str:
    done = subprocess.run(
        ["sh", str(REPO / "examples" / "submit.sh"), str(queue), function, args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _policy_of_every_run(found: Job) -> list[dict[str, Any]]:
    assert found.history, dump(found)
    policies = []
    for attempt in found.history:
        recorded = (attempt.path / "policy.json").read_text()
        policies.append(json.loads(recorded))
    return policies


def _assert_enforced(found: Job, attempts: int, timeout: float, backoff: float, source: str) -> None:
    assert found.state is State.DEAD, dump(found)
    assert found.attempts == attempts, dump(found)
    assert len(found.history) == attempts, dump(found)
    for number in range(attempts):
        ran = outcome(found, number)
        assert ran["limit"] == "timeout", dump(found)
        assert ran["wall_time"] < 10, f"the job ran {ran['wall_time']}s: its timeout of {timeout}s was not enforced"
        assert ran["max_attempts"] == attempts
    for earlier, later in zip(found.history, found.history[1:], strict=False):
        gap = (later.outcome or {})["started"] - (earlier.outcome or {})["ended"]
        assert gap >= backoff - 0.01, f"retried {gap:.3f}s after the failure, before its backoff of {backoff}s"
    for policy in _policy_of_every_run(found):
        assert (policy["max_attempts"], policy["timeout"]) == (attempts, timeout)
        assert policy["sources"]["timeout"] == source


def test_every_way_to_submit_gets_the_registered_policy(tmp_path: Path) -> None:
    path = new_queue(tmp_path / "queue", max_attempts=5, timeout="1h", backoff="fixed 1m")  # below the function
    queue = Queue(path, create=False)
    submitted = {
        "function object": queue.enqueue(sample_jobs.declared, 30),
        "name": queue.enqueue("sample.declared", 30),
        "cli enqueue": enqueue(path, "sample.declared", "--args", "[30]"),
        "cli enqueue --app": enqueue(path, "sample.declared", "--args", "[30]", "--app", APP, *APP_PATH),
        "shell": _by_shell(path, "sample.declared", "[30]"),
    }
    explicit = enqueue(path, "sample.declared", "--args", "[30]", "--max-attempts", "1", "--timeout", "0.4s")
    burst(path, "--concurrency", "6", timeout=60)

    for how, job_id in submitted.items():
        found = queue.job(job_id)
        assert found.spec.max_attempts is None, f"{how}: the spec records only what the submitter gave"
        _assert_enforced(found, attempts=2, timeout=0.5, backoff=0.3, source="function")
    found = queue.job(explicit)
    _assert_enforced(found, attempts=1, timeout=0.4, backoff=0, source="job")


def test_the_queue_applies_to_a_function_that_declares_nothing(tmp_path: Path) -> None:
    path = new_queue(tmp_path / "queue")
    ok("config", path, "max_attempts", "2")
    ok("config", path, "timeout", "0.5s")
    ok("config", path, "backoff", "fixed 0.2s")
    queue = Queue(path, create=False)
    by_name = queue.enqueue("sample.nap", 30)
    by_shell = _by_shell(path, "sample.nap", "[30]")
    burst(path, timeout=60)
    for job_id in (by_name, by_shell):
        _assert_enforced(queue.job(job_id), attempts=2, timeout=0.5, backoff=0.2, source="queue")
    shown = ok("show", path, by_shell).out
    assert (
        "max_attempts 2 (queue)  timeout 0.5s (queue)  memory_limit none (default)  output_limit 8M (default)  "
        "backoff fixed 0.2s (queue)" in shown
    )


def test_show_and_list_say_what_applies_and_where_it_came_from(tmp_path: Path) -> None:
    path = new_queue(tmp_path / "queue")
    queue = Queue(path, create=False)
    job_id = queue.enqueue("sample.declared", 30)
    before = ok("show", path, job_id, "--json").json()
    assert before["policy"]["max_attempts"] == {"value": 3, "source": "default"}, "no manager runs: not known yet"
    assert "no running manager runs this function" in ok("show", path, job_id).out

    burst(path, timeout=60)
    after = ok("show", path, job_id, "--json").json()
    assert after["policy"] == {
        "max_attempts": {"value": 2, "source": "function"},
        "timeout": {"value": 0.5, "source": "function"},
        "memory_limit": {"value": None, "source": "default"},
        "output_limit": {"value": 8 << 20, "source": "default"},
        "backoff": {"value": "fixed 0.3s", "source": "function"},
    }
    assert after["max_attempts"] == 2
    [listed] = ok("list", path, "--json").json()
    assert listed["max_attempts"] == 2
    assert "  2/2  " in ok("list", path).out
