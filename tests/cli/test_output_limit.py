"""A run keeps at most its output limit of stdout and of stderr, the head and the tail:
while a chatty job runs its file's blocks stay bounded, `logs` of it says what was
dropped, and its end leaves head, one line, tail; `show` says so. Real managers, real
jobs (Python and command), real files."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from jobs import State
from tests.cli.conftest import burst, cli, enqueue, job, new_queue, ok, stop_manager, submit
from tests.processes import APP, APP_PATH, FAST_CLI, Processes, forkvisor_command, wait_until

MIB = 1 << 20


def run_file(queue: Path, job_id: str, name: str) -> Path:
    return job(queue, job_id).history[0].path / name


def blocks(path: Path) -> int:
    return path.stat().st_blocks * 512 if path.exists() else 0


def numbered(start: int, size: int) -> bytes:
    """What sample.chatty writes from byte `start` (each line says its own offset)."""
    first = start // 23 * 23
    data = b"".join(b"%015d chatty\n" % offset for offset in range(first, start + size, 23))
    return data[start - first : start - first + size]


def test_a_chatty_job_keeps_its_head_and_tail_while_it_runs_and_after(procs: Processes, tmp_path: Path) -> None:
    queue = new_queue(tmp_path / "queue")
    written, release = tmp_path / "written", tmp_path / "release"
    job_id = enqueue(
        queue, "sample.chatty", "--output-limit", "1M", "--args", json.dumps([40, str(written), str(release)])
    )
    manager = procs.forkvisor("run", str(queue), "--app", APP, *APP_PATH, *FAST_CLI)
    wait_until(written.exists, 30, "the job wrote its 40 MiB")
    size = int(written.read_text())
    stdout = run_file(queue, job_id, "stdout")
    wait_until(lambda: blocks(stdout) <= 2 * MIB, 10, "the manager gave back what is past the limit")
    assert stdout.stat().st_size == size  # the job's offset is untouched: its next write lands at the end

    logs = subprocess.run([*forkvisor_command(), "logs", str(queue), job_id], capture_output=True, timeout=30)
    assert logs.returncode == 0, logs
    assert logs.stdout.startswith(numbered(0, 512 << 10)), "the head of a running job's output"
    assert logs.stdout.endswith(numbered(size - (512 << 10), 512 << 10)), "and its tail"
    assert b"bytes of stdout dropped here]" in logs.stdout
    assert len(logs.stdout) < 2 * MIB

    release.touch()
    wait_until(lambda: job(queue, job_id).state is State.DONE, 30, "the job is done")
    kept = run_file(queue, job_id, "stdout").read_bytes()
    line = f"\n[forkvisor: {size - MIB} bytes of stdout dropped here (output_limit 1M: ".encode()
    assert kept.startswith(numbered(0, 512 << 10) + line)
    assert kept.endswith(numbered(size - (512 << 10), 512 << 10))
    assert len(kept) < MIB + 200
    outcome = json.loads(run_file(queue, job_id, "outcome.json").read_text())
    assert outcome["output_dropped"] == {"stdout": size - MIB}
    assert f"stdout: {size - MIB} bytes dropped from its middle" in ok("show", queue, job_id).out
    stop_manager(procs, manager)


def test_a_command_jobs_output_is_bounded_by_the_queues_setting_or_its_own(tmp_path: Path) -> None:
    queue = new_queue(tmp_path / "queue", output_limit="64K")
    loud = "head -c 3000000 /dev/zero | tr '\\0' x; head -c 100000 /dev/zero | tr '\\0' y >&2"
    by_queue = submit(queue, "sh", "-c", loud)
    by_job = submit(queue, "sh", "-c", loud, options=("--max-attempts", "1", "--output-limit", "0"))
    burst(queue, "--commands")
    stdout = run_file(queue, by_queue, "stdout").read_bytes()
    assert stdout.startswith(b"x" * (32 << 10) + b"\n[forkvisor: ")
    assert stdout.endswith(b"x" * (32 << 10))
    assert run_file(queue, by_queue, "stderr").read_bytes().endswith(b"y" * (32 << 10))
    outcome = json.loads(run_file(queue, by_queue, "outcome.json").read_text())
    assert outcome["output_dropped"] == {"stdout": 3000000 - (64 << 10), "stderr": 100000 - (64 << 10)}
    assert run_file(queue, by_job, "stdout").read_bytes() == b"x" * 3000000  # 0: no limit
    assert "output_limit 64k (queue)" in cli("show", queue, by_queue).out
    assert "output_limit none (job)" in cli("show", queue, by_job).out
