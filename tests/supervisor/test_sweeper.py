"""How often the sweeper applies the retention (the sweeps themselves are tested with real
processes in tests/cli/test_settings.py and tests/jobs), a sweeper whose queue is gone, and
one stopped in the middle of a sweep."""

from __future__ import annotations

import math
import os
import signal
from pathlib import Path

import pytest

from jobs import Functions, Queue
from supervisor import forking
from supervisor.sweeper import PURGE_EVERY_MAX, purge_interval, run
from tests.processes import Processes, wait_until


@pytest.mark.parametrize(
    ("retention", "interval", "expected"),
    [
        pytest.param(1.0, 0.5, 0.5, id="short-retention-every-sweep"),
        pytest.param(3600.0, 5.0, 180.0, id="a-twentieth-of-the-retention"),
        pytest.param(7 * 86400.0, 5.0, PURGE_EVERY_MAX, id="long-retention-capped"),
    ],
)
def test_retention_is_applied_every_twentieth_of_it_between_a_sweep_and_the_cap(
    retention: float, interval: float, expected: float
) -> None:
    assert purge_interval(retention, interval) == expected


def test_no_retention_never_purges() -> None:
    assert math.isinf(purge_interval(None, 5.0))


def test_a_sweeper_whose_queue_is_gone_says_so_in_one_line(tmp_path: Path) -> None:
    """Restarted after its queue folder was removed under the manager (which then stops): an
    exit status and a line in the log, not a traceback (which the manager's stop could cut
    after its first line, as a test of that removal once saw)."""
    stderr = tmp_path / "stderr"

    def sweeper_on_a_gone_queue() -> int:
        fd = os.open(stderr, os.O_WRONLY | os.O_CREAT, 0o600)
        os.dup2(fd, 2)
        return run(tmp_path / "gone", Functions(), durable=False, interval=1.0, tmp_age=60.0, retention=None)

    child = forking.start_child(sweeper_on_a_gone_queue)
    assert os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == forking.EXIT_FAILED
    assert "Traceback" not in stderr.read_text()


def test_a_sweeper_stopped_by_its_manager_finishes_the_step_at_hand(procs: Processes, queue: Queue) -> None:
    """SIGTERM, the manager's stop, waits for the end of the sweep under way: stopped half-way,
    a sweeper left a quarantine note empty (found in CI). Here a sweep quarantines 3,000
    submissions abandoned in tmp/ and is told to stop after its first: it ends them all first,
    each with its whole note."""
    abandoned = 3000
    for number in range(abandoned):
        (queue.path / "tmp" / f"abandoned-{number}").mkdir()
        os.utime(queue.path / "tmp" / f"abandoned-{number}", (1.0, 1.0))
    child = forking.start_child(
        lambda: run(queue.path, Functions(), durable=False, interval=60.0, tmp_age=1.0, retention=None)
    )
    wait_until(lambda: any(name.endswith(".why") for name in os.listdir(queue.path / "quarantine")), 10, "a sweep")
    os.kill(child, signal.SIGTERM)
    assert os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == -signal.SIGTERM  # (it died of it, once free)
    assert os.listdir(queue.path / "tmp") == []  # the sweep under way went to its end
    notes = [path for path in (queue.path / "quarantine").iterdir() if path.name.endswith(".why")]
    assert len(notes) == abandoned
    assert all(b"abandoned in tmp/" in path.read_bytes() for path in notes)
