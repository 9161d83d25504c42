"""How often the sweeper applies the retention (the sweeps themselves are tested with real
processes in tests/cli/test_settings.py and tests/jobs), and a sweeper whose queue is gone."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from jobs import Functions
from supervisor import forking
from supervisor.sweeper import PURGE_EVERY_MAX, purge_interval, run


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
