"""The test helpers themselves: a wait that fails must say what never happened,
and teardown must find, kill and name a process a test left behind."""

from __future__ import annotations

import subprocess
import time

import pytest

from tests.processes import is_gone, reap_everything, wait_until


def test_wait_until_names_what_never_happened() -> None:
    started = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match="waiting until the moon turned blue"):
        wait_until(lambda: False, 0.05, "the moon turned blue")
    assert time.monotonic() - started < 1


def test_wait_until_returns_as_soon_as_the_condition_holds() -> None:
    calls = []
    wait_until(lambda: calls.append(1) or len(calls) >= 3, 5, "three polls")
    assert len(calls) == 3


def test_teardown_kills_and_names_a_leftover_process() -> None:
    leftover = subprocess.Popen(["sleep", "60"])
    try:
        problems = reap_everything(timeout=0.1)
        assert len(problems) == 1
        assert f"pid {leftover.pid} was still alive" in problems[0]
        assert "sleep 60" in problems[0]
        assert is_gone(leftover.pid)
    finally:
        if leftover.poll() is None:
            leftover.kill()
            leftover.wait()
