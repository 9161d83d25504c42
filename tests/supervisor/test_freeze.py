"""`forkvisor pause QUEUE --job ID` freezes every process of one running job (the cgroup's
freezer, else SIGSTOP of its tree and of what left it), `resume --job` thaws them, and its
timeout counts only the time it ran. In both containment modes, with a real manager and a
job whose ticking processes include one that left its session (`setsid`)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from jobs import Queue, State
from tests.processes import Processes, wait_until
from tests.supervisor.test_containment import MODES

TICK = "while :; do echo x >> {0}; sleep 0.05; done"


def size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def ticking(path: Path) -> bool:
    """Whether what writes `path` still runs: it grows within half a second."""
    before = size(path)
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        if size(path) > before:
            return True
        time.sleep(0.02)
    return False


def cli(procs: Processes, *args: str) -> str:
    command = procs.forkvisor(*args, name=args[0])
    assert procs.wait_exit(command, 20, f"forkvisor {args[0]}") == 0, procs.log(command)
    return procs.log(command)


@pytest.mark.slow  # (12 s a mode: frozen past its whole timeout, then the rest of it)
@pytest.mark.parametrize("mode", MODES)
def test_a_frozen_job_stands_still_with_its_escapees_and_its_timeout_waits(
    procs: Processes, queue: Queue, tmp_path: Path, mode: str
) -> None:
    own, escaped = tmp_path / "own", tmp_path / "escaped"
    # a double fork: the escapee's parent exits at once, so it is nobody's descendant
    script = f"sh -c \"setsid sh -c '{TICK.format(escaped)}' &\"; {TICK.format(own)}"
    job_id = queue.enqueue_command(["sh", "-c", script], timeout="5s", max_attempts=1)
    manager = procs.run_manager(queue, "--commands", "--containment", mode, name="manager")
    wait_until(lambda: size(own) and size(escaped), 20, "the job and its escapee tick")
    started = time.monotonic()

    # (frozen first thing: on a loaded machine a command's start-up takes seconds of its timeout)
    assert "freezes it now" in cli(procs, "pause", str(queue.path), "--job", job_id)
    wait_until(lambda: not ticking(own) and not ticking(escaped), 5, "the job and its escapee are frozen")
    ran_at_most = time.monotonic() - started  # of its timeout, before it was frozen
    assert queue.job(job_id).frozen
    assert f"contains its runs by {mode}" in cli(procs, "status", str(queue.path))
    time.sleep(max(0.0, started + 5.5 - time.monotonic()))  # past its whole timeout: frozen time does not count
    assert queue.job(job_id).state is State.CLAIMED, "the timeout ran while the job was frozen"
    assert not ticking(own)
    assert not ticking(escaped)

    resumed = time.monotonic()
    cli(procs, "resume", str(queue.path), "--job", job_id)
    wait_until(lambda: ticking(own) and ticking(escaped), 5, "both tick again")
    assert not queue.job(job_id).frozen
    wait_until(lambda: queue.job(job_id).state is State.DEAD, 10, "the job ran out its timeout")
    assert time.monotonic() - resumed >= 5 - ran_at_most - 0.5, "its timeout counted its frozen time"
    assert queue.job(job_id).history[-1].outcome["limit"] == "timeout"
    wait_until(lambda: not ticking(escaped), 5, "its escapee ended with it")
    manager.send_signal(signal.SIGTERM)
    assert procs.wait_exit(manager, 10, "the manager") == 0, procs.log(manager)


def test_only_a_running_job_can_be_frozen(procs: Processes, queue: Queue) -> None:
    job_id = queue.enqueue("sample.ok")
    command = procs.forkvisor("pause", str(queue.path), "--job", job_id, name="pause")
    assert procs.wait_exit(command, 20, "forkvisor pause") == 3
    assert "only a running job can be" in procs.log(command)
