"""An operator's terminal is not the queue's to write (issue 18, "escape sequences and
newlines in function names, error texts or host names are printed raw"): every human
line of the CLI escapes what came from the queue, `logs` writes a job's raw bytes only
to a pipe or with --raw, and the manager's log lines escape too."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
from pathlib import Path

from jobs import Queue, State, new_job_id
from jobs.job import ready_name
from tests.processes import REPO, Processes, forkvisor_command, wait_until

ESC = "\x1b"
HOSTILE = "evil\x1b[2J\x1b]0;owned\x07\nforged line\u202eevil"  # clear screen, set title, new line, bidi


def _cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*forkvisor_command(), *map(str, args)], capture_output=True, text=True, timeout=60, cwd=REPO, check=False
    )


def _dead_job(queue: Queue) -> str:
    """A job in dead/ whose function, error and events hold escape sequences (as a hostile
    job or a member can leave them)."""
    job_id = new_job_id()
    job_dir = queue.path / "dead" / job_id
    job_dir.mkdir()
    (job_dir / "job.json").write_text(json.dumps({"function": HOSTILE, "args": [HOSTILE]}))
    (job_dir / "error.json").write_text(json.dumps({"reason": HOSTILE, "message": HOSTILE}))
    (job_dir / "events").write_text(f"2026-11-24T00:00:00.000000Z {HOSTILE}\n")
    run = job_dir / "attempt-1"
    run.mkdir()
    (run / "outcome.json").write_text(json.dumps({"status": HOSTILE, "error": {"type": HOSTILE, "message": HOSTILE}}))
    (run / "stderr").write_text(f"out {HOSTILE}\n")
    return job_id


def _assert_escaped(text: str) -> None:
    assert ESC not in text, f"a raw escape reached the terminal: {text!r}"
    assert "\u202e" not in text
    assert "\\x1b[2J" in text, text


def test_list_show_and_errors_escape_what_came_from_the_queue(queue: Queue) -> None:
    job_id = _dead_job(queue)
    for args in (("list", queue.path), ("show", queue.path, job_id)):
        done = _cli(*args)
        assert done.returncode == 0, done
        _assert_escaped(done.stdout)
        assert not any(line.startswith("forged line") for line in done.stdout.splitlines()), "a line was forged"
    shown = _cli("show", queue.path, job_id, "--json")
    assert json.loads(shown.stdout)["function"] == HOSTILE, "JSON keeps the text exactly (json.dumps escapes it)"


def test_status_escapes_a_manager_s_host_and_functions(queue: Queue) -> None:
    owner_dir = queue.path / "claimed" / "host.1.abcdef"
    owner_dir.mkdir()
    owner = {"name": "host.1.abcdef", "host": HOSTILE, "pid": 1, "lease": 3600.0, "started": 0.0}
    (owner_dir / ".owner.json").write_text(json.dumps(owner))
    (owner_dir / ".functions.json").write_text(json.dumps({"functions": {HOSTILE: {}}}))
    queue.enqueue("unserved\x1b[31mred")
    done = _cli("status", queue.path)
    assert done.returncode == 0, done
    _assert_escaped(done.stdout)
    assert "unserved\\x1b[31mred" in done.stdout


def _on_a_terminal(*args: str | Path) -> bytes:
    """What `forkvisor ARGS` writes to a real pseudo-terminal."""
    controller, terminal = pty.openpty()
    process = subprocess.Popen([*forkvisor_command(), *map(str, args)], stdout=terminal, stderr=terminal, cwd=REPO)
    os.close(terminal)
    seen = b""
    while True:
        ready, _, _ = select.select([controller], [], [], 30)
        if not ready:
            break
        try:
            chunk = os.read(controller, 4096)
        except OSError:  # the terminal's other side closed: the command is done
            break
        if not chunk:
            break
        seen += chunk
    process.wait(30)
    os.close(controller)
    return seen


def test_logs_escapes_a_job_s_output_on_a_terminal_and_keeps_it_raw_otherwise(queue: Queue) -> None:
    job_id = _dead_job(queue)
    shown = _on_a_terminal("logs", queue.path, job_id, "--stderr").decode()
    _assert_escaped(shown)
    raw = _on_a_terminal("logs", queue.path, job_id, "--stderr", "--raw").decode()
    assert ESC in raw, "--raw writes the bytes as they are"
    piped = subprocess.run(
        [*forkvisor_command(), "logs", str(queue.path), job_id, "--stderr"], capture_output=True, cwd=REPO, timeout=30
    )
    assert piped.stdout == f"out {HOSTILE}\n".encode(), "into a pipe, the bytes as they are"


def test_the_manager_s_log_escapes_job_controlled_text(procs: Processes, queue: Queue) -> None:
    hostile = new_job_id()
    job_dir = queue.path / "ready" / ready_name(hostile, 0)
    job_dir.mkdir()
    (job_dir / "job.json").write_text(json.dumps({"function": HOSTILE}))
    fine = queue.enqueue("sample.ok", "after")
    manager = procs.run_manager(queue)
    wait_until(lambda: queue.job(fine).state is State.DONE, 20, "the manager ran the job after")
    wait_until(lambda: "leaving jobs of" in procs.log(manager), 20, "the manager logged the hostile name")
    manager.send_signal(signal.SIGTERM)
    assert procs.wait_exit(manager, 20, "the manager's drain") == 0
    log = procs.log(manager)
    assert ESC not in log, "a raw escape reached the manager's log"
    assert "evil\\x1b[2J" in log
