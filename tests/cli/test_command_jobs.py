"""`forkvisor submit`: command jobs, exec'd in the job's forked child by `forkvisor run`."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest

from jobs import COMMAND, State, is_job_id
from tests.cli.conftest import (
    attempt_file,
    burst,
    cli,
    counts,
    enqueue,
    job,
    new_queue,
    ok,
    refused,
    spec_file,
    submit,
)
from tests.processes import Processes, dump, is_gone, outcome, read_pid, wait_until


def test_submit_prints_the_id_and_the_forked_child_execs_the_command(tmp_path: Path) -> None:
    queue = new_queue(tmp_path / "queue")
    work = tmp_path / "work"
    work.mkdir()
    script = 'echo "pid $$"; echo "cwd $(pwd)"; echo "greeting $GREETING"; env | grep ^FORKVISOR_ | sort; echo oops >&2'
    options = ("--max-attempts", "1", "--env", "GREETING=hello there")
    job_id = submit(queue, "sh", "-c", script, options=options, cwd=work)
    spec = spec_file(queue, job_id)
    assert spec["function"] == COMMAND
    assert spec["args"] == ["sh", "-c", script]
    assert spec["kwargs"] == {"cwd": str(work), "env": {"GREETING": "hello there"}}, "--cwd defaults to the submitter's"

    burst(queue, app=False)
    found = job(queue, job_id)
    assert found.state is State.DONE, dump(found)
    assert [attempt.number for attempt in found.history] == [1]
    lines = attempt_file(queue, job_id, "stdout").splitlines()
    said = dict(line.split(" ", 1) for line in lines[:3])
    env = dict(line.split("=", 1) for line in lines[3:])

    # one fork per job: the program the child exec'd is the child itself
    assert int(said["pid"]) == read_pid(found.history[0].path / "pid") == outcome(found)["pid"]
    assert os.path.realpath(said["cwd"]) == os.path.realpath(work)
    assert said["greeting"] == "hello there"
    assert env["FORKVISOR_JOB_ID"] == job_id
    assert env["FORKVISOR_ATTEMPT"] == "1"
    assert os.path.realpath(env["FORKVISOR_QUEUE"]) == os.path.realpath(queue)
    assert env["FORKVISOR_ATTEMPT_DIR"].startswith(f"{env['FORKVISOR_QUEUE']}/claimed/")
    assert env["FORKVISOR_ATTEMPT_DIR"].endswith(f"/{job_id}/attempt-1")
    assert attempt_file(queue, job_id, "stderr") == "oops\n"


def test_cwd_option_sets_the_folder_the_command_runs_in(tmp_path: Path) -> None:
    queue = new_queue(tmp_path / "queue")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    job_id = submit(queue, "pwd", options=("--max-attempts", "1", "--cwd", str(elsewhere)), cwd=tmp_path)
    burst(queue, app=False)
    assert job(queue, job_id).state is State.DONE, dump(job(queue, job_id))
    assert os.path.realpath(attempt_file(queue, job_id, "stdout").strip()) == os.path.realpath(elsewhere)


def test_relative_cwd_is_relative_to_the_submitters_folder(tmp_path: Path) -> None:
    queue = new_queue(tmp_path / "queue")
    (tmp_path / "sub").mkdir()
    job_id = submit(queue, "pwd", options=("--max-attempts", "1", "--cwd", "sub"), cwd=tmp_path)
    burst(queue, app=False)  # the manager runs in the repository root, as an operator's would run elsewhere
    found = job(queue, job_id)
    assert found.state is State.DONE, dump(found)
    assert os.path.realpath(attempt_file(queue, job_id, "stdout").strip()) == os.path.realpath(tmp_path / "sub")


def test_exit_status_decides_done_retry_or_dead(tmp_path: Path) -> None:
    queue = new_queue(tmp_path / "queue")
    succeeds = submit(queue, "sh", "-c", "exit 0", options=("--max-attempts", "2"))
    fails = submit(queue, "sh", "-c", 'echo "run $FORKVISOR_ATTEMPT" >&2; exit 3', options=("--max-attempts", "2"))
    hopeless = submit(queue, "sh", "-c", "exit 100", options=("--max-attempts", "3"))
    burst(queue, app=False)

    found = job(queue, succeeds)
    assert found.state is State.DONE, dump(found)
    assert found.attempts == 1

    found = job(queue, fails)
    assert found.state is State.DEAD, dump(found)
    assert found.attempts == 2
    assert [attempt.outcome and attempt.outcome["exit_code"] for attempt in found.history] == [3, 3]
    assert [attempt_file(queue, fails, "stderr", run) for run in (0, 1)] == ["run 1\n", "run 2\n"]
    assert found.error is not None
    assert found.error["reason"] == "attempts exhausted"
    assert found.error["type"] == "CommandFailed"
    assert "exited 3" in found.error["message"]

    found = job(queue, hopeless)
    assert found.state is State.DEAD, dump(found)
    assert found.attempts == 1, "exit 100 means the job cannot be completed: no retry"
    assert outcome(found)["exit_code"] == 100
    assert found.error is not None
    assert found.error["reason"] == "cannot be completed"


@pytest.mark.skipif(shutil.which("setsid") is None, reason="needs setsid(1)")
def test_timeout_kills_the_command_and_its_grandchildren(procs: Processes, tmp_path: Path, barriers: Path) -> None:
    queue = new_queue(tmp_path / "queue")
    script = "sleep 60 & echo $! > in-group; setsid sleep 61 & echo $! > own-session; wait"
    job_id = submit(queue, "sh", "-c", script, options=("--max-attempts", "1", "--timeout", "1"), cwd=barriers)
    burst(queue, app=False)

    found = job(queue, job_id)
    assert found.state is State.DEAD, dump(found)
    record = outcome(found)
    assert record["limit"] == "timeout"
    assert record["signal"] == "SIGTERM"
    assert record["error"]["type"] == "Timeout"
    grandchildren = [read_pid(barriers / "in-group"), read_pid(barriers / "own-session")]
    wait_until(lambda: all(map(is_gone, grandchildren)), 10, f"the command's grandchildren {grandchildren} were gone")


def test_a_missing_program_is_a_clear_error_with_exit_127(tmp_path: Path) -> None:
    queue = new_queue(tmp_path / "queue")
    job_id = submit(queue, "no-such-program-xyz", "--flag")
    burst(queue, app=False)

    found = job(queue, job_id)
    assert found.state is State.DEAD, dump(found)
    assert outcome(found)["exit_code"] == 127
    assert found.error is not None
    assert "cannot run 'no-such-program-xyz'" in found.error["message"]
    spawned, forked = "command not found", "No such file or directory"  # see supervisor/spawner.py
    assert spawned in found.error["message"] or forked in found.error["message"], found.error
    shown = ok("show", queue, job_id)
    assert "cannot run 'no-such-program-xyz'" in shown.out
    assert "exited 127" in shown.out


def test_the_exec_d_program_gets_the_default_sigpipe_disposition(tmp_path: Path) -> None:
    queue = new_queue(tmp_path / "queue")
    job_id = submit(queue, "sh", "-c", "yes | head -n 1; grep SigIgn /proc/$$/status")
    burst(queue, app=False)

    found = job(queue, job_id)
    assert found.state is State.DONE, dump(found)
    first, ignored = attempt_file(queue, job_id, "stdout").splitlines()
    assert first == "y"
    mask = int(ignored.split()[1], 16)
    assert not mask & (1 << (signal.SIGPIPE - 1)), f"the command inherited SIGPIPE ignored: {ignored}"
    assert attempt_file(queue, job_id, "stderr") == "", "`yes` saw EPIPE instead of dying of SIGPIPE"


def test_the_command_after_double_dash_keeps_its_own_options(tmp_path: Path) -> None:
    queue = new_queue(tmp_path / "queue")
    job_id = submit(queue, "printf", "%s|", "--json", "--", "--max-attempts", "9", options=("--max-attempts", "1"))
    spec = spec_file(queue, job_id)
    assert spec["args"] == ["printf", "%s|", "--json", "--", "--max-attempts", "9"]
    assert spec["max_attempts"] == 1
    burst(queue, app=False)
    assert attempt_file(queue, job_id, "stdout") == "--json|--|--max-attempts|9|"


COMMANDS = r"""# build the report
echo "hello world" 'single quoted'

   # an indented comment
printf '%s\n' a\ b
sh -c 'exit 0'
"""


def test_submit_stdin_takes_one_command_per_line(tmp_path: Path) -> None:
    queue = new_queue(tmp_path / "queue")
    result = ok("submit", queue, "--stdin", "--max-attempts", "2", "--priority", "5", stdin=COMMANDS)
    ids = result.lines
    assert len(ids) == 3, result
    assert all(map(is_job_id, ids)), result
    assert ids == sorted(ids), "ids are printed in submission order"
    specs = [spec_file(queue, job_id) for job_id in ids]
    assert [spec["args"] for spec in specs] == [
        ["echo", "hello world", "single quoted"],
        ["printf", "%s\\n", "a b"],
        ["sh", "-c", "exit 0"],
    ]
    assert {(spec["max_attempts"], spec["priority"]) for spec in specs} == {(2, 5)}

    burst(queue, app=False)
    assert [job(queue, job_id).state for job_id in ids] == [State.DONE] * 3
    assert attempt_file(queue, ids[0], "stdout") == "hello world single quoted\n"
    assert attempt_file(queue, ids[1], "stdout") == "a b\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('echo one\necho "two\necho three\n', "line 2"),
        ("echo one\n# fine\necho 'three\n", "line 3"),
        ('echo one\n""\n', "empty"),
    ],
    ids=["unbalanced-double-quote", "unbalanced-single-quote", "empty-program"],
)
def test_submit_stdin_with_a_bad_line_submits_nothing(tmp_path: Path, text: str, message: str) -> None:
    queue = new_queue(tmp_path / "queue")
    refused(cli("submit", queue, "--stdin", stdin=text), 2, message)
    assert counts(queue) == {
        "incoming": 0,
        "ready": 0,
        "scheduled": 0,
        "waiting": 0,
        "claimed": 0,
        "done": 0,
        "dead": 0,
    }
    assert os.listdir(queue / "tmp") == []


def test_run_without_app_serves_command_jobs_only(tmp_path: Path) -> None:
    """As the README says: Python jobs are left ready, untouched, for managers with --app."""
    queue = new_queue(tmp_path / "queue")
    python_job = enqueue(queue, "sample.ok", "--args", '["x"]')
    command_job = submit(queue, "echo", "from a command")
    result = burst(queue, app=False)

    found = job(queue, command_job)
    assert found.state is State.DONE, dump(found)
    assert attempt_file(queue, command_job, "stdout") == "from a command\n"
    found = job(queue, python_job)
    assert found.state is State.READY, dump(found)
    assert (found.attempts, found.history) == (0, ()), "left untouched: no attempt used"
    assert "leaving jobs of sample.ok to managers that run it" in result.err
    assert "left ready the jobs this manager does not run: sample.ok (1)" in result.err

    burst(queue)  # a manager that knows the function
    assert job(queue, python_job).state is State.DONE
    assert job(queue, python_job).attempts == 1


def test_no_commands_leaves_command_jobs_for_a_manager_that_runs_them(tmp_path: Path) -> None:
    queue = new_queue(tmp_path / "queue")
    command_job = submit(queue, "true", options=("--max-attempts", "3"))
    python_job = enqueue(queue, "sample.ok", "--args", '["y"]')
    result = burst(queue, "--no-commands")

    assert job(queue, python_job).state is State.DONE
    found = job(queue, command_job)
    assert found.state is State.READY, dump(found)
    assert found.attempts == 0
    assert f"leaving jobs of {COMMAND} to managers that run it" in result.err
    burst(queue, "--commands", app=False)
    assert job(queue, command_job).state is State.DONE
