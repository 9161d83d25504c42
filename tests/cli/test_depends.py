"""Dependencies from the shell: `--after ID...` (ids as printed by another submit, in one
word), `--allow-failure`, `submit --stdin --chain`; a real `forkvisor run --burst` runs a
chain in order, a fan-in after its group, and buries the dependents of a dead job."""

from __future__ import annotations

from pathlib import Path

from jobs import Queue, State
from tests.cli.conftest import cli, ok, refused
from tests.conftest import FAST_CLI


def submit(queue: Queue, *args: str, stdin: str | None = None) -> list[str]:
    return ok("submit", queue.path, *args, stdin=stdin).lines


def test_a_chain_and_a_fan_in_run_in_order_and_a_dead_job_kills_its_dependents(tmp_path: Path) -> None:
    queue = Queue(tmp_path / "q")
    log = tmp_path / "order"
    step = "echo {} >> " + str(log)
    chain = submit(queue, "--stdin", "--chain", stdin="".join(f"sh -c '{step.format(n)}'\n" for n in range(3)))
    group = submit(queue, "--stdin", stdin="true\ntrue\n")
    (merge,) = submit(queue, "--after", " ".join(group), "--", "sh", "-c", step.format("merged"))
    (broken,) = submit(queue, "--max-attempts", "1", "--", "false")
    (doomed,) = submit(queue, "--after", broken, "--after", chain[-1], "--", "true")
    (anyway,) = submit(queue, "--after", f"{broken},{merge}", "--allow-failure", "--", "true")
    assert [queue.job(job_id).state for job_id in chain] == [State.READY, State.WAITING, State.WAITING]
    assert "waiting 5" in ok("status", queue.path).out
    shown = ok("show", queue.path, anyway).out
    assert f"after     {broken} {merge}  (runs even if one is dead)" in shown

    ran = cli("run", queue.path, "--burst", *FAST_CLI, timeout=60)
    assert ran.code == 0, ran
    lines = log.read_text().split()
    assert sorted(lines) == ["0", "1", "2", "merged"]
    assert lines.index("0") < lines.index("1") < lines.index("2"), "the chain ran in order"
    assert queue.job(doomed).state is State.DEAD
    assert queue.job(doomed).error["reason"] == "dependency dead"
    assert queue.job(anyway).state is State.DONE
    counts = queue.counts()
    assert (counts["waiting"], counts["done"], counts["dead"]) == (0, 7, 2)
    listed = ok("list", queue.path, "--state", "dead", "--json").json()
    assert {row["id"] for row in listed} == {broken, doomed}


def test_bad_dependencies_from_the_shell(tmp_path: Path) -> None:
    queue = Queue(tmp_path / "q")
    refused(cli("submit", queue.path, "--after", "nope", "--", "true"), 2, "not a job id")
    missing = "20200101-000000-000000-0badc0de"
    refused(cli("submit", queue.path, "--after", missing, "--", "true"), 2, f"there is no job {missing}")
    refused(cli("submit", queue.path, "--chain", "--", "true"), 2, "--chain links the lines of --stdin")
    (parent,) = submit(queue, "--", "true")
    refused(cli("submit", queue.path, "--after", parent, "--delay", "5s", "--", "true"), 2, "no delay or run_at")
    assert queue.counts()["waiting"] == 0


def test_enqueue_takes_after_too(tmp_path: Path) -> None:
    queue = Queue(tmp_path / "q")
    (parent,) = submit(queue, "--", "true")
    (child,) = ok("enqueue", queue.path, "sample.ok", "--args", "[1]", "--after", parent).lines
    assert queue.job(child).spec.depends_on == (parent,)
