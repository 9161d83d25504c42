"""The harvest's decoding of a reaped child (`supervisor.harvest.run_end`), as a function of
a run's end: how it exited, why its manager stopped it, what it left in its run folder. Every
way of being "stopped but exited 0" included; the store's decision from the `RunEnd` is
`tests/jobs/test_finish.py`'s."""

from __future__ import annotations

import json
import os
import resource
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from jobs import COMMAND, Owner, Queue, RunEnd
from supervisor.forking import EXIT_CANNOT_COMPLETE, EXIT_CHILD_ERROR, EXIT_ORPHANED, ExitStatus
from supervisor.harvest import run_end
from supervisor.running import Running, Stop
from tests.faults.conftest import Tmpfs

USAGE = resource.getrusage(resource.RUSAGE_SELF)
ENDS = {  # how the child ended: (exit code, signal)
    "exit 0": (0, None),
    "exit 1": (1, None),
    "cannot complete": (EXIT_CANNOT_COMPLETE, None),
    "child error": (EXIT_CHILD_ERROR, None),
    "orphaned": (EXIT_ORPHANED, None),
    "SIGKILL": (None, signal.SIGKILL),
}
STOP_ERRORS = {
    Stop.TIMEOUT: "Timeout",
    Stop.MEMORY: "MemoryLimit",
    Stop.OUTPUT: "OutputLimit",
    Stop.CANCELLED: "Cancelled",
    Stop.DRAIN: "Released",
}
OWN_ERRORS = {
    "exit 1": "Crashed",
    "cannot complete": "Crashed",
    "child error": "ChildError",
    "orphaned": "Orphaned",
    "SIGKILL": "Crashed",
}


def _running(
    tmp_path: Path, function: str = "tests.sample_jobs.add", args: list[Any] | None = None, **options: Any
) -> Running:
    queue = Queue(tmp_path / "queue")
    if function == COMMAND:
        queue.enqueue_command(args or ["false"], **options)
    else:
        queue.with_options(**options).enqueue(function, 1, 2)
    owner = Owner.new()
    queue.serving.register_owner(owner)
    claim = queue.serving.claim(owner.name)
    assert claim is not None
    claim.run_path.mkdir(exist_ok=True)
    return Running(pid=4121, claim=claim, started=time.monotonic(), started_wall=time.time() - 2)


@pytest.mark.parametrize("ended", list(ENDS))
@pytest.mark.parametrize("stopped", [None, *Stop])
@pytest.mark.parametrize("left_result", [False, True])
def test_a_run_s_end_is_decoded_once_into_what_the_store_decides_from(
    tmp_path: Path, ended: str, stopped: Stop | None, left_result: bool
) -> None:
    running = _running(tmp_path)
    running.stopped = stopped
    if left_result:
        (running.claim.run_path / "result.json").write_text("3\n")
    code, killed = ENDS[ended]
    end = run_end(running, ExitStatus(4121, code, killed, USAGE), time.time())

    assert isinstance(end, RunEnd)
    assert end.exited_ok is (code == 0)
    assert end.stop == (stopped.value if stopped else None)
    assert end.cannot_complete is (code == EXIT_CANNOT_COMPLETE)
    # Only a run a drain stopped after it returned keeps its result: it is done, not released.
    assert end.has_result is (code == 0 and stopped is Stop.DRAIN and left_result)
    outcome = end.outcome
    assert (outcome["exit_code"], outcome["signal"]) == (code, killed.name if killed else None)
    assert outcome["limit"] == (stopped.value if stopped else None)
    assert (outcome["run"], outcome["attempt"]) == (running.claim.run, running.claim.attempt)
    assert outcome["wall_time"] == pytest.approx(outcome["ended"] - outcome["started"])
    assert outcome["wall_time"] >= 2
    want = STOP_ERRORS[stopped] if stopped else OWN_ERRORS.get(ended)
    if want is None:  # exited 0, not stopped: no error, and the end's error is only its status
        assert outcome["error"] is None
        assert end.error == {"message": "exited 0"}
    else:
        assert outcome["error"]["type"] == want
        assert end.error == outcome["error"]


@pytest.mark.parametrize("stopped", [None, Stop.TIMEOUT])
def test_the_error_a_child_recorded_is_its_attempt_s_unless_it_exited_0(tmp_path: Path, stopped: Stop | None) -> None:
    running = _running(tmp_path)
    running.stopped = stopped
    recorded = {"type": "ValueError", "message": "bad input", "traceback": "Traceback ..."}
    (running.claim.run_path / "error.json").write_text(json.dumps(recorded))
    failed = run_end(running, ExitStatus(4121, 1, None, USAGE), time.time())
    assert failed.error == recorded  # its own words, even when a limit stopped it
    ok = run_end(running, ExitStatus(4121, 0, None, USAGE), time.time())
    assert ok.outcome["error"] == ({"type": "Timeout", "message": ok.outcome["error"]["message"]} if stopped else None)


@pytest.mark.parametrize(
    ("code", "kind", "says"),
    [(127, "CannotRun", "command not found"), (126, "CannotRun", "not executable"), (3, "CommandFailed", "exited 3")],
)
def test_a_command_s_exit_status_says_why_it_failed(tmp_path: Path, code: int, kind: str, says: str) -> None:
    running = _running(tmp_path, COMMAND, ["no-such-program"])
    end = run_end(running, ExitStatus(4121, code, None, USAGE), time.time())
    assert end.error["type"] == kind
    assert says in end.error["message"]


def test_a_memory_stop_names_the_kernel_s_peak_when_a_cgroup_counted_it(tmp_path: Path) -> None:
    running = _running(tmp_path, memory_limit="512M")
    running.stopped = Stop.MEMORY
    running.cost = {"peak_memory": 530 * 1024 * 1024, "oom_kills": 1}
    end = run_end(running, ExitStatus(4121, None, signal.SIGKILL, USAGE), time.time())
    assert end.error == {"type": "MemoryLimit", "message": "killed: memory limit 512M, peak 530M"}
    assert end.outcome["cost"] == running.cost
    running.cost = None
    end = run_end(running, ExitStatus(4121, None, signal.SIGKILL, USAGE), time.time())
    assert end.error["message"] == "used more than 512M RSS; killed by SIGKILL"
    assert end.outcome["cost"]["from"] == "wait4"


def test_a_run_whose_folder_is_gone_is_still_decoded(tmp_path: Path) -> None:
    running = _running(tmp_path)
    (running.claim.run_path / "result.json").write_text("3\n")
    running.stopped = Stop.DRAIN
    Queue(tmp_path / "queue", create=False).serving.sweep(time.time() + 10_000, lambda owner: False)  # reaped
    end = run_end(running, ExitStatus(4121, 0, None, USAGE), time.time())
    assert not end.has_result  # its folder is elsewhere now: nothing found through the claim's path
    assert end.outcome["stderr_tail"] == ""
    assert end.outcome["output_dropped"] == {}  # nothing to bound, and the record says so as it always does


def test_the_outcome_keeps_the_last_4_kib_of_stderr(tmp_path: Path) -> None:
    running = _running(tmp_path)
    (running.claim.run_path / "stderr").write_bytes(b"x" * 10_000 + b"y" * 4096)
    end = run_end(running, ExitStatus(4121, 1, None, USAGE), time.time())
    assert end.outcome["stderr_tail"] == "y" * 4096


def test_a_run_s_times_are_kept_to_the_microsecond_and_its_peak_in_bytes(tmp_path: Path) -> None:
    running = _running(tmp_path)
    end = run_end(running, ExitStatus(4121, 0, None, USAGE), running.started_wall + 2.123456789)
    assert end.outcome["wall_time"] == 2.123457
    assert end.outcome["cost"]["peak_memory"] == USAGE.ru_maxrss * 1024  # wait4 counts KiB


def test_decoding_a_run_closes_what_it_opened(tmp_path: Path) -> None:
    running = _running(tmp_path)
    (running.claim.run_path / "result.json").write_text("3\n")
    running.stopped = Stop.DRAIN
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        run_end(running, ExitStatus(4121, 0, None, USAGE), time.time())
    assert len(os.listdir("/proc/self/fd")) == before


def test_output_is_bounded_only_under_a_limit_and_a_full_disk_leaves_it_whole(tmp_path: Path, tmpfs: Tmpfs) -> None:
    unlimited = _running(tmp_path)
    (unlimited.claim.run_path / "stdout").write_bytes(b"x" * 100_000)
    assert run_end(unlimited, ExitStatus(4121, 0, None, USAGE), time.time()).outcome["output_dropped"] == {}
    limited = _running(tmpfs.path, output_limit="16K")
    (limited.claim.run_path / "stdout").write_bytes(b"x" * 100_000)
    filler = tmpfs.fill()
    end = run_end(limited, ExitStatus(4121, 0, None, USAGE), time.time())
    assert end.outcome["output_dropped"] == {}  # it could not be bounded: it stays as it was
    assert (limited.claim.run_path / "stdout").stat().st_size == 100_000
    filler.unlink()
    end = run_end(limited, ExitStatus(4121, 0, None, USAGE), time.time())
    assert end.outcome["output_dropped"] == {"stdout": 100_000 - 16 * 1024}
