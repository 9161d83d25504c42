"""How often the sweeper applies the retention (the sweeps themselves are tested with real
processes in tests/cli/test_settings.py and tests/jobs)."""

from __future__ import annotations

import math

import pytest

from supervisor.sweeper import PURGE_EVERY_MAX, purge_interval


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
