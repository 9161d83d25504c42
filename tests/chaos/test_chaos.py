"""The chaos run, small: ~200 jobs of every behaviour through three real managers,
with a couple of kills of each kind, judged from the queue folder alone.

The full-size run is `python -m tests.chaos.run --jobs 3000 --managers 3 --seed N`.
Set FORKVISOR_CHAOS_SEED to replay another seed here.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.chaos.run import Config, Kind, run_chaos

SEED = int(os.environ.get("FORKVISOR_CHAOS_SEED", "20261123"))


@pytest.mark.slow
def test_a_small_chaos_run_loses_nothing_and_explains_every_death(tmp_path: Path) -> None:
    config = Config(jobs=200, managers=3, seed=SEED, interval=0.15, quiesce_timeout=40.0)
    outcome = run_chaos(config, tmp_path / "chaos")
    summary = outcome.summary()
    print(summary)  # the figures, shown by pytest -s or on failure

    assert not outcome.violations, summary
    report = outcome.report
    assert report.enqueued == config.jobs, summary
    assert report.states["done"] + report.states["dead"] == config.jobs, summary
    assert outcome.quiesce_seconds is not None, summary
    assert all(outcome.performed[kind] >= 1 for kind in Kind), f"some kind of chaos never happened:\n{summary}"
