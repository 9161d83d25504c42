"""The chaos run's containment judge, on its own: a run that starts while a process of an
earlier run of its job lives leaves an OVERLAP record (`behaviours._one_run_at_a_time`),
and `run.judge_grandchildren` holds every grandchild to the bound, excusing only those
left when no manager lived on the host any more."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import psutil
import pytest

from tests.chaos import behaviours
from tests.chaos.behaviours import LONG_LIFETIME, OUTLIVED, Scratch
from tests.chaos.run import judge_grandchildren


def _start_run(queue: Path, run: int) -> tuple[int, int]:
    """Fork a process that runs the start of run `run` of job J, says so, and lives until
    told to end; its (pid, the descriptor that ends it)."""
    said, say = os.pipe()
    wait, end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        try:
            os.close(said)
            os.close(end)  # (else it would hold its own end open)
            os.environ.update(
                FORKVISOR_QUEUE=str(queue),
                FORKVISOR_JOB_ID="J",
                FORKVISOR_ATTEMPT=str(run),
                FORKVISOR_ATTEMPT_DIR=f"{queue}/claimed/owner/J/attempt-{run}",
                FORKVISOR_FUNCTION="chaos.succeed",
            )
            behaviours._one_run_at_a_time("t000001")
            os.write(say, b".")
            os.read(wait, 1)
        finally:
            os._exit(0)
    os.close(say)
    os.close(wait)
    assert os.read(said, 1) == b"."  # its lock is taken (or its overlap recorded)
    os.close(said)
    return pid, end


def _end(pid: int, end: int) -> None:
    os.close(end)
    os.waitpid(pid, 0)


def test_a_run_that_starts_while_an_earlier_run_lives_leaves_an_overlap(tmp_path: Path) -> None:
    queue = tmp_path / "queue"
    scratch = Scratch.beside(queue)
    scratch.create()
    first = _start_run(queue, 1)
    _end(*_start_run(queue, 2))  # the first still lives
    overlaps = [json.loads(path.read_text())["about"] for path in scratch.overlaps.iterdir()]
    assert len(overlaps) == 1
    assert "run 2 of job J" in overlaps[0]
    assert "run 1, pid" in overlaps[0]

    _end(*first)
    _end(*_start_run(queue, 3))  # nothing of an earlier run lives: no overlap
    assert len(list(scratch.overlaps.iterdir())) == 1


def _grandchild(scratch: Scratch, number: int, manager: int, witness: dict[str, float] | None, alive: bool) -> None:
    me = psutil.Process()
    pid, started = (me.pid, me.create_time()) if alive else (number, 0.0)  # (a pid not started then: dead)
    record = {"token": f"t{number}", "job": 1, "job_started": 0.0, "manager": manager}
    record.update(pid=pid, started=started, lifetime=LONG_LIFETIME)
    (scratch.grandchildren / str(number)).write_text(json.dumps(record))
    if witness is not None:
        (scratch.grandchildren / f"{number}{OUTLIVED}").write_text(json.dumps(witness))


@pytest.mark.parametrize(
    ("manager", "witness", "alive", "verdict"),
    [
        (10, {"job_ended": 100.0, "alive_at": 100.3}, False, "fine"),
        (10, {"job_ended": 100.0, "alive_at": 116.0}, False, "leaked"),  # beyond the bound
        (20, {"job_ended": 100.0, "alive_at": 116.0}, False, "fine"),  # within the bound of the successor's start
        (20, {"job_ended": 100.0, "alive_at": 130.0}, False, "leaked"),  # beyond it
        (30, {"job_ended": 300.0, "alive_at": 340.0}, False, "excused"),  # no manager lived after its own
        (10, {"job_ended": time.monotonic() - 1.0, "alive_at": 0.0}, True, "leaked"),  # alive, every manager gone
        (10, None, True, "leaked"),  # alive, and its job never ended
    ],
)
def test_the_judge_holds_grandchildren_to_the_bound(
    tmp_path: Path, manager: int, witness: dict[str, float] | None, alive: bool, verdict: str
) -> None:
    scratch = Scratch(tmp_path)
    scratch.create()
    _grandchild(scratch, 7, manager, witness, alive)
    kills = {20: 100.0, 30: 300.0}  # manager 20 was SIGKILLed at 100, manager 30 at 300
    lives = [(10, 0.0, 250.0), (20, 50.0, 100.0), (21, 110.0, 250.0), (30, 240.0, 300.0), (None, 250.0, 260.0)]

    found = judge_grandchildren(scratch, 14.5, kills, lives)

    assert found.recorded == 1
    assert (len(found.leaked), len(found.excused)) == {"fine": (0, 0), "leaked": (1, 0), "excused": (0, 1)}[verdict]
