"""systemd's notify protocol (issue 19), against a real datagram socket standing in
for systemd: READY=1 with the manager's pid once it serves, STATUS= lines, the
watchdog's pings at half its interval, STOPPING=1 when it drains; and no job
inherits the socket's address."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from jobs import Queue
from supervisor.notify import Notifier
from tests.processes import APP, APP_PATH, FAST_CLI, Processes, wait_until


@pytest.fixture
def systemd(tmp_path: Path) -> Iterator[socket.socket]:
    """The socket a unit's manager notifies (bound where $NOTIFY_SOCKET will say)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(tmp_path / "notify"))
        yield sock


def received_until(sock: socket.socket, done: Callable[[list[str]], bool], timeout: float, what: str) -> list[str]:
    """Every message received until `done(messages)` holds; fail naming `what` at the deadline."""
    messages: list[str] = []
    deadline = time.monotonic() + timeout
    while not done(messages):
        left = deadline - time.monotonic()
        if left <= 0:
            pytest.fail(f"timed out waiting until {what}; received {messages}")
        sock.settimeout(left)
        try:
            messages.append(sock.recv(4096).decode())
        except TimeoutError:
            continue
    return messages


def test_a_manager_under_systemd_says_ready_status_watchdog_and_stopping(
    procs: Processes, queue: Queue, barriers: Path, systemd: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", systemd.getsockname())
    monkeypatch.setenv("WATCHDOG_USEC", "300000")
    seen = barriers / "environment"  # a command job: what it execs gets the environment it was given
    queue.enqueue_command(["sh", "-c", f"env > {seen}.tmp && mv {seen}.tmp {seen} && exec sleep 60"])
    manager = procs.forkvisor("run", str(queue.path), "--app", APP, *APP_PATH, *FAST_CLI)

    said = received_until(systemd, lambda m: any("READY=1" in x for x in m), 20, "the manager said READY=1")
    assert f"MAINPID={manager.pid}" in next(x for x in said if "READY=1" in x)
    said = received_until(systemd, lambda m: any("STATUS=1/2 busy" in x for x in m), 10, "a status with the job")
    status = next(x for x in said if "STATUS=1/2 busy" in x)
    assert "ready 0" in status, status
    assert "claimed 1" in status, status
    pings = received_until(systemd, lambda m: m.count("WATCHDOG=1") >= 4, 5, "four watchdog pings")
    assert pings.count("WATCHDOG=1") >= 4

    wait_until(seen.exists, 10, "the job wrote its environment")
    environment = seen.read_text().splitlines()
    assert any(entry.startswith("FORKVISOR_JOB_ID=") for entry in environment)
    assert not any(entry.startswith(("NOTIFY_SOCKET=", "WATCHDOG_USEC=")) for entry in environment)

    manager.send_signal(signal.SIGTERM)
    received_until(systemd, lambda m: any("STOPPING=1" in x for x in m), 10, "the manager said STOPPING=1")
    manager.send_signal(signal.SIGTERM)  # the second one stops the blocking job
    assert procs.wait_exit(manager, 15, "the manager after SIGTERM") == 0, procs.log(manager)


def test_the_abstract_namespace_and_a_watchdog_meant_for_another_process() -> None:
    name = f"forkvisor-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        notifier = Notifier({"NOTIFY_SOCKET": "@" + name, "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"})
        assert notifier.watchdog == 0  # WATCHDOG_PID names another process: no pings from this one
        notifier.ready("serving")
        sock.settimeout(5)
        assert sock.recv(4096).decode() == f"READY=1\nMAINPID={os.getpid()}\nSTATUS=serving"


def test_without_systemd_nothing_is_sent_and_nothing_fails() -> None:
    notifier = Notifier({})
    assert not notifier.enabled
    notifier.ready("serving")
    notifier.tick(time.monotonic())
    assert notifier.next_deadline() == float("inf")
