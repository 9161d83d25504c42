"""Every reader of what others write into a queue, fed hostile documents (hypothesis).

The rule (docs/SECURITY.md, "Reading a queue"): whatever someone other than the queue's
managers wrote (a member's submission in `incoming/`, a job's own files in its run folder,
a `job.json` put in `ready/` by the owner's own script) is hostile input. Every reader of
it must not crash, must not block, must finish in bounded time, and must lose nothing,
whatever the content: numbers no float holds, nesting past any limit, wrong types, long
text, lone surrogates and terminal escapes, bad ids, links, fifos, sockets, devices,
folders where files belong, empty files, binary junk (the strategies: tests/security/hostile.py).

Each example makes a queue of its own, in a folder of its own, holding a live, a done and a
dead job (ids a document may name, as `depends_on` or a request's target), plants what the
strategies drew, and calls the real readers: `jobs.Queue` (take-in, claim, the job's view,
its run's pid and progress, counts, listings), the manager's own harvest of a run
(`supervisor.outcomes.Outcomes`, which reads `error.json` and `stderr`), a sweep, what
`forkvisor status` reads (`supervisor.snapshot`), the status page's JSON and `/metrics`
(`supervisor.web.Board` and `encode_json`, exactly what its routes send), and `forkvisor
status`, `list` and `show`, with and without `--json`, in a fresh process.

The tests, one per reader of others' writing (each property draws documents and what stands
in their place; each table puts every thing that is not a file at every name, every time):

1. a member's submission, `incoming/UID/ID.json`, taken in (`queue.serving.take_in`), beside a good
   one; and anything but a file as a submission (a table);
2. a member's request, `ID.cancel` or `ID.retry`, holding junk or being no file, naming
   a live, done or dead job, or none;
3. a job's own files in its run folder, read while it runs, by its manager's harvest or a
   sweep, and after; and anything but a file at each of their names (a table);
4. `forkvisor status`, `list` and `show` of such a queue, as text and as `--json`;
5. a `job.json` (and `attempts`) put in `ready/` by hand, claimed (`queue.serving.claim`), then
   failed through the manager's harvest (which computes its backoff); and a job in `ready/`
   whose id has the right form but names no moment, February 30th say (a table).

What is asserted:

- every call returns, within `READER_SECONDS`, under a watchdog that interrupts a blocking
  open (a fifo), and raises nothing;
- every JSON output parses strictly (no NaN or Infinity, valid UTF-8); every human line of
  the CLI is valid UTF-8 free of control and bidirectional characters; nothing from a file
  a link points to leaks out, and nothing outside the queue is read or written
  (`tests.faults.conftest.Outside`);
- every job is in exactly one state folder, every submission that is not is in
  `quarantine/` with a `.why` note (`tests/jobs_processes/invariants.py`), every job in
  `dead/` says why, and every job is listed and counted.

Run longer (the examples are derandomized: a longer run explores further, the same way
each time), for instance before a release:

    FORKVISOR_HYPOTHESIS_EXAMPLES=600 .venv/bin/pytest -q tests/security/test_hostile_documents.py

(the default is 50 per property; the CLI's, which starts a process per example, runs 30,
and at most 250.)

No example database is written (`database=None`): a failure prints its minimal example.
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from jobs import Claim, JobNotFound, Owner, Queue, State, Tally, is_job_id, new_job_id, run_folder, unknown_liveness
from jobs.incoming import MOST_AHEAD
from jobs.job import MAX_SPEC_BYTES, ready_name
from supervisor import snapshot, web
from supervisor.forking import EXIT_CANNOT_COMPLETE, ExitStatus
from supervisor.health import StoreHealth
from supervisor.outcomes import Outcomes
from supervisor.running import Running
from tests.faults.conftest import Outside, watchdog
from tests.jobs_processes.invariants import check_invariants
from tests.processes import REPO
from tests.security import hostile
from tests.security.hostile import (
    COUNTERS,
    DEAD,
    DONE,
    ERROR,
    JOB,
    JOB_EXTRA,
    JUNK,
    LIVE,
    OUTCOME,
    OUTPUTS,
    PIDS,
    POLICY,
    PROGRESS,
    RESULT,
    Planting,
    documents,
    files_only,
    plant,
    plantings,
    tainted_documents,
)

EXAMPLES = int(os.environ.get("FORKVISOR_HYPOTHESIS_EXAMPLES", "50"))  # per property (in-process ones)
READER_SECONDS = 5.0  # one reader's call, however hostile its input: generous for a loaded CI host
WATCHDOG_SECONDS = 60.0  # a whole example: past this, something blocks (a fifo opened for reading)
OVERSIZE = 2 * 1024 * 1024 + 1  # over every limit of the documents read here but result.json's
OVERSIZE_OUTPUT = 1 << 30  # a job's stdout of 1 GiB (sparse): only its tail may be read

HOSTILE = settings(
    max_examples=EXAMPLES,
    deadline=None,  # the bound is READER_SECONDS per call, measured; hypothesis's deadline is per example
    database=None,
    derandomize=True,
    report_multiple_bugs=False,  # the first bug found, shrunk: each shrink step of the CLI's costs a process
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],  # no "explain": it runs more examples
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)

GOOD_JOB = json.dumps({"function": "sample.echo", "args": ["good"]}).encode()
T = TypeVar("T")

# -- an example's queue -----------------------------------------------------------------------


@dataclass
class Example:
    """One example's queue and what surrounds it."""

    queue: Queue
    outside: Outside  # a secret, a job and a fifo outside the queue, that links point at
    ids: dict[str, str]  # placeholder name (LIVE, DONE, DEAD) -> the id of such a job

    @property
    def parents(self) -> list[str]:
        return list(self.ids.values())


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the examples' folders go (pytest's tmp_path is one per test, not per example)."""
    return tmp_path_factory.mktemp("hostile")


@contextmanager
def example(base: Path) -> Iterator[Example]:
    """A fresh queue with a live (scheduled), a done and a dead job, under a watchdog;
    afterwards, nothing outside the queue may have been read, listed or written."""
    folder = Path(tempfile.mkdtemp(prefix="example-", dir=base))
    queue = Queue(folder / "queue", create=True, durable=False)
    try:
        outside = Outside(folder / "outside")
        found = Example(queue, outside, _parents(queue))
        with watchdog(WATCHDOG_SECONDS, "a reader of a hostile file (opening a fifo?)"):
            yield found
        outside.check()
    finally:
        queue.close()
        shutil.rmtree(folder, ignore_errors=True)


def _parents(queue: Queue) -> dict[str, str]:
    owner = Owner.new(lease=60.0)
    queue.serving.register_owner(owner)
    ids = {"DONE": queue.enqueue("sample.echo", "done")}
    queue.serving.complete(_claimed(queue, owner, ids["DONE"]))
    ids["DEAD"] = queue.enqueue("sample.echo", "dead")
    queue.serving.fail(_claimed(queue, owner, ids["DEAD"]), {"message": "failed for the test"}, permanent=True)
    ids["LIVE"] = queue.with_options(delay=3600).enqueue("sample.echo", "live")
    queue.serving.retire_owner(owner.name)
    return ids


def _claimed(queue: Queue, owner: Owner, job_id: str) -> Claim:
    claim = queue.serving.claim(owner.name)
    assert claim is not None, f"job {job_id} was not claimed"
    assert claim.job_id == job_id, (claim.job_id, job_id)
    return claim


def mine(queue: Queue) -> Path:
    """This user's folder of incoming/ (a member's own; this user owns the queue too)."""
    folder = queue.path / "incoming" / str(os.geteuid())
    folder.mkdir(exist_ok=True)
    return folder


def quarantined(queue: Queue) -> dict[str, str]:
    """{quarantined entry: its .why note}; every entry has its note."""
    folder = queue.path / "quarantine"
    names = os.listdir(folder)
    entries = sorted(name for name in names if not name.endswith(".why"))
    assert sorted(name for name in names if name.endswith(".why")) == [f"{name}.why" for name in entries], names
    return {name: (folder / f"{name}.why").read_text(errors="replace") for name in entries}


def located(queue: Queue, job_id: str | None) -> State | None:
    """Where the queue says the job is; None if nowhere (or if what names it is no id)."""
    if job_id is None or not is_job_id(job_id):
        return None
    try:
        return timed(f"Queue.job({job_id})", partial(queue.job, job_id)).state
    except JobNotFound:
        return None


def says_why_dead(queue: Queue, job_id: str) -> None:
    error = queue.job(job_id).error
    assert isinstance(error, dict), f"dead job {job_id} has no error.json: {error!r}"
    assert isinstance(error.get("reason"), str), error
    assert error["reason"], error
    assert isinstance(error.get("message"), str), error
    assert error["message"], error


# -- bounds and strictness --------------------------------------------------------------------


def timed(what: str, call: Callable[[], T]) -> T:
    """`call()`, which must return within READER_SECONDS (the watchdog ends one that blocks)."""
    started = time.monotonic()
    result = call()
    took = time.monotonic() - started
    assert took < READER_SECONDS, f"{what} took {took:.1f}s (at most {READER_SECONDS:g}s)"
    return result


def strict_json(data: bytes, what: str) -> Any:
    """`data` parsed as JSON as any other parser would: UTF-8, no NaN, no Infinity."""

    def refuse(word: str) -> NoReturn:
        raise AssertionError(f"{what} holds {word}, which is not JSON: {data[:300]!r}")

    return json.loads(data.decode("utf-8"), parse_constant=refuse)


def as_printed(document: Any, what: str) -> Any:
    """`document` encoded as `forkvisor ... --json` prints it (`print_json`), parsed strictly."""
    return strict_json(json.dumps(document, indent=None, default=str).encode(), what)


def no_secret(data: bytes | str, what: str) -> None:
    text = data if isinstance(data, str) else data.decode("utf-8", "replace")
    assert Outside.SECRET.decode().strip() not in text, f"{what} shows the content of a file a link points to"


# -- the readers --------------------------------------------------------------------------------


def read_everything(queue: Queue, job_ids: Sequence[str]) -> None:
    """What operators, `status` and the page read: counts, listings, each job's view and its
    newest run's pid and progress, the status snapshot, the page's JSON and its metrics."""
    counts = timed("Queue.counts()", queue.counts)
    for state in State:
        listed = timed(f"Queue.jobs({state.value!r})", partial(queue.jobs, state))
        assert len(listed) == counts[state.value], f"{state.value}: counted {counts}, listed {listed}"
    for job_id in job_ids:
        job = timed(f"Queue.job({job_id})", partial(queue.job, job_id))
        check_pid(timed(f"queue.serving.run_pid of {job_id}", partial(queue.serving.run_pid, job)))
        check_progress(timed(f"queue.serving.run_progress of {job_id}", partial(queue.serving.run_progress, job)))
    taken = timed("snapshot.take (forkvisor status)", partial(snapshot.take, queue))
    no_secret(json.dumps(as_printed(taken.to_json(), "status --json")), "status --json")
    read_the_page(queue, job_ids)


def read_the_page(queue: Queue, job_ids: Sequence[str]) -> None:
    """Every JSON document of the status page, encoded as its routes send them, and /metrics."""
    board = web.Board([queue])
    answers: dict[str, Callable[[], dict[str, Any]]] = {"/api/overview": partial(board.overview, None)}
    for state in State:
        answers[f"/api/jobs?state={state.value}"] = partial(board.jobs, None, 0, state.value, None, None, web.PAGE_MAX)
    for job_id in job_ids:
        answers[f"/api/job?id={job_id}"] = partial(board.job, None, 0, job_id)
    for path, answer in answers.items():
        body = timed(f"GET {path}", partial(_encoded, answer))
        strict_json(body, f"the page's {path}")
        no_secret(body, f"the page's {path}")
    timed("GET /metrics", partial(board.exposition, None)).decode("utf-8")


def _encoded(answer: Callable[[], dict[str, Any]]) -> bytes:
    return web.encode_json(answer())


def check_pid(found: tuple[int, float] | None) -> None:
    if found is not None:
        pid, started = found
        assert type(pid) is int, found
        assert 1 < pid <= run_folder.PID_MAX, found
        assert math.isfinite(started), found


def _is_number(value: object) -> bool:
    return type(value) is int or (type(value) is float and math.isfinite(value))


def check_progress(found: dict[str, Any] | None) -> None:
    """A progress record as `run_folder.read_progress` promises it, or why it is unreadable."""
    if found is None:
        return
    if set(found) == {"unreadable"}:
        assert isinstance(found["unreadable"], str), found
        return
    assert set(found) == {"done", "total", "message", "at"}, found
    assert _is_number(found["done"]), found
    assert found["done"] >= 0, found
    assert found["total"] is None or (_is_number(found["total"]) and found["total"] > 0), found
    assert isinstance(found["message"], str), found
    assert len(found["message"]) <= run_folder.MAX_MESSAGE, found
    assert found["at"] is None or _is_number(found["at"]), found


def check_error(found: dict[str, Any] | None) -> None:
    """What `run_folder.read_error` promises: text of bounded length in known fields."""
    if found is None:
        return
    assert set(found) <= set(run_folder.ERROR_FIELDS), found
    for key, value in found.items():
        assert isinstance(value, str), (key, value)
        assert len(value) <= run_folder.ERROR_FIELDS[key], (key, value[:200])


# -- 1. a member's submission, taken in ----------------------------------------------------------

SUBMISSIONS = plantings(documents(JOB, JOB_EXTRA)).filter(lambda planting: planting.kind != "missing")
NOT_FILES = [kind for kind in hostile.NOT_FILES if kind != "missing"]  # what stands at a name, but a file
ID_KINDS = st.sampled_from(["ahead"] * 5 + ["behind", "far ahead", "impossible date", "odd name"])
IMPOSSIBLE = [
    "20260230-120000-000000-0badc0de",  # February 30th
    "20261123-256161-000000-0badc0de",  # 25:61:61
    "00000000-000000-000000-00000000",
    "99999999-999999-999999-ffffffff",
]
"""Ids that name no moment, as a writer that dates its ids itself may make: a day past its
month's end (an id: carried over), and what is no id at all (a month 13, an hour 25, a year 0)."""
IMPOSSIBLE_IDS = st.sampled_from(IMPOSSIBLE)
ODD_NAMES = st.text(max_size=40).map(lambda text: "x" + text.replace("/", "_").replace("\0", "_"))


def _submission_name(kind: str, impossible: str, odd: str) -> tuple[str, str | None]:
    """(file name, job id) of a submission whose id is of `kind`."""
    now = time.time()
    if kind == "odd name":
        return odd, None
    if kind == "impossible date":
        return f"{impossible}.json", impossible
    ahead = {"ahead": 5.0, "behind": -5.0, "far ahead": 2 * MOST_AHEAD}[kind]
    job_id = new_job_id(now + ahead)
    return f"{job_id}.json", job_id


@HOSTILE
@given(submission=SUBMISSIONS, id_kind=ID_KINDS, impossible=IMPOSSIBLE_IDS, odd=ODD_NAMES)
def test_a_members_submission_is_taken_in_or_quarantined_and_never_lost(
    base: Path, submission: Planting, id_kind: str, impossible: str, odd: str
) -> None:
    """`queue.serving.take_in()` of one hostile submission beside a good one: both leave incoming/;
    the good one is ready; the hostile one is a job in one state folder (dead saying why,
    if it is malformed) or in quarantine/ with its note, never both, never neither."""
    with example(base) as ex:
        name, job_id = _submission_name(id_kind, impossible, odd)
        take_in_beside_a_good_one(ex, name, job_id, submission)


@pytest.mark.parametrize("kind", NOT_FILES)
def test_anything_but_a_file_as_a_submission_is_quarantined(base: Path, kind: str) -> None:
    """Each thing that is not a regular file, at a submission's name (the property above
    draws them at random; here each one, every time)."""
    with example(base) as ex:
        job_id = new_job_id(time.time() + 5)
        take_in_beside_a_good_one(ex, f"{job_id}.json", job_id, Planting(kind, GOOD_JOB))
        assert located(ex.queue, job_id) is None, f"a {kind} was taken in as a job"


def take_in_beside_a_good_one(ex: Example, name: str, job_id: str | None, submission: Planting) -> None:
    """Plant `submission` as `incoming/UID/name` beside a good one, take both in, and check
    that each is in exactly one place, and the queue reads whole."""
    queue = ex.queue
    good = new_job_id(time.time() + 5)
    plant(mine(queue) / f"{good}.json", Planting("file", GOOD_JOB), ex.outside, OVERSIZE)
    plant(mine(queue) / name, submission.bound(SELF=job_id or "", **ex.ids), ex.outside, MAX_SPEC_BYTES + 1)

    handled = timed("queue.serving.take_in()", queue.serving.take_in)

    assert handled == 2, f"took in {handled} of 2 submissions; set aside: {queue.serving.intake_skipped}"
    assert queue.serving.intake_skipped == ({}, 0), "a submission was set aside: it stays in incoming/ for ever"
    assert os.listdir(mine(queue)) == [], "something was left in the member's folder"
    assert queue.job(good).state is State.READY, "the good submission after (or before) it"
    state, notes = located(queue, job_id), quarantined(queue)
    if state is None:
        assert len(notes) == 1, f"the submission is neither a job nor quarantined: {notes}"
    else:
        assert notes == {}, f"job {job_id} is in {state.value}/ and quarantined too: {notes}"
        assert state in (State.READY, State.SCHEDULED, State.WAITING, State.DEAD), state
        if state is State.DEAD:
            says_why_dead(queue, job_id or "")
    taken = [good] + ([job_id] if job_id is not None and state is not None else [])
    check_invariants(queue.path, ex.parents + taken)
    read_everything(queue, taken)


# -- 1b. a member's requests --------------------------------------------------------------------

REASONS = st.one_of(JUNK, st.just(b"x" * 70_000))
TARGETS = st.sampled_from([LIVE, DONE, DEAD, "20200101-000000-000000-0badc0de", "20260230-120000-000000-0badc0de"])


@pytest.mark.parametrize("kind", ["file", *NOT_FILES])
@settings(HOSTILE, max_examples=max(3, EXAMPLES // 5))  # for each kind
@given(reason=REASONS, action=st.sampled_from(["cancel", "retry"]), target=TARGETS)
def test_a_members_request_is_done_or_quarantined_whatever_it_holds(
    base: Path, kind: str, reason: bytes, action: str, target: str
) -> None:
    """`ID.cancel` and `ID.retry` holding junk (or being a fifo, a link, a folder...), naming
    a live, done or dead job or none: done (a file's, whatever it holds), or quarantined with
    its note (anything but a file: a request is one regular file); the jobs stay whole."""
    request = Planting(kind, reason)
    with example(base) as ex:
        queue = ex.queue
        job_id = ex.ids.get(target.strip("@"), target)
        before = {name: queue.job(parent).state for name, parent in ex.ids.items()}
        plant(mine(queue) / f"{job_id}.{action}", request, ex.outside, OVERSIZE)

        timed("queue.serving.take_in()", queue.serving.take_in)

        assert queue.serving.intake_skipped == ({}, 0), "a request was set aside: it stays in incoming/ for ever"
        assert os.listdir(mine(queue)) == [], "something was left in the member's folder"
        after = {name: queue.job(parent).state for name, parent in ex.ids.items()}
        changed = {name for name in before if before[name] is not after[name]}
        notes = quarantined(queue)
        if changed:
            assert notes == {}, f"{action} of {job_id} was done and quarantined too: {notes}"
            assert changed == {target.strip("@")}, (before, after)
        else:
            assert len(notes) == 1, f"{action} of {job_id} was neither done nor quarantined: {notes}"
        done_by = {("cancel", LIVE): ("LIVE", State.DEAD), ("retry", DEAD): ("DEAD", State.READY)}
        if kind == "file" and (action, target) in done_by:
            name, state = done_by[(action, target)]
            assert after[name] is state, f"{action} of its own {name} job was not done: {notes}"
        check_invariants(queue.path, ex.parents)
        read_everything(queue, ex.parents)


# -- 2. a job's own files in its run folder -------------------------------------------------------


def run_folders(documents_of: Callable[[hostile.Fields], SearchStrategy[bytes]]) -> SearchStrategy[dict[str, Planting]]:
    """Some of the files a job writes in its run folder, each a document of its kind
    (`documents_of(its valid form)`) or anything else standing at its name."""
    return st.fixed_dictionaries(
        {},
        optional={
            "progress.json": plantings(documents_of(PROGRESS)),
            "result.json": plantings(documents_of(RESULT)),
            "error.json": plantings(documents_of(ERROR)),
            "outcome.json": plantings(documents_of(OUTCOME)),
            "policy.json": plantings(documents_of(POLICY)),
            "pid": plantings(PIDS),
            "stdout": plantings(OUTPUTS),
            "stderr": plantings(OUTPUTS),
        },
    )


RUN_FOLDERS = run_folders(documents)
ENDINGS = st.sampled_from(["running", "exit 0", "exit 1", "cannot complete", "SIGKILL", "reaped"])


@dataclass
class Run:
    """A claimed job whose run folder holds what the strategies drew."""

    job_id: str
    claim: Claim


def planted_run(ex: Example, run_files: dict[str, Planting]) -> Run:
    """Enqueue a job, claim it as a manager of this host would, and plant its run's files."""
    queue = ex.queue
    owner = Owner.new(lease=60.0)  # this process: a live manager of this host
    queue.serving.register_owner(owner)
    job_id = queue.enqueue("sample.echo", "hostile run")
    claim = _claimed(queue, owner, job_id)
    for name, planting in run_files.items():
        size = OVERSIZE_OUTPUT if name in run_folder.OUTPUT_FILES else OVERSIZE
        plant(claim.run_path / name, planting.bound(**ex.ids), ex.outside, size)
    return Run(job_id, claim)


def end_run(queue: Queue, run: Run, ending: str) -> None:
    """End the run as its manager would (its harvest: `Outcomes.harvest`, which reads the run's
    error.json and stderr and writes its outcome), or as a sweep would after its manager died."""
    if ending == "running":
        return
    if ending == "reaped":
        timed(
            "queue.serving.sweep", partial(queue.serving.sweep, queue.serving.filesystem_now() + 3600, unknown_liveness)
        )
        return
    code, killed = {"exit 0": (0, None), "exit 1": (1, None), "cannot complete": (EXIT_CANNOT_COMPLETE, None)}.get(
        ending, (None, signal.SIGKILL)
    )
    # The status a reaped child would have: what the harvest reads is in the run's folder, so
    # no child needs to run (the pid is only logged).
    status = ExitStatus(4121, code, killed, resource.getrusage(resource.RUSAGE_CHILDREN))
    running = Running(pid=4121, claim=run.claim, started=time.monotonic(), started_wall=time.time())
    health = StoreHealth()
    outcomes = Outcomes(queue, health, Tally())
    timed("the manager's harvest", partial(outcomes.harvest, running, status, False))
    assert outcomes.unrecorded() == set(), f"the harvest of job {run.job_id} is stranded: {health.last_failure}"


@HOSTILE
@given(run_files=RUN_FOLDERS, ending=ENDINGS)
def test_a_jobs_own_files_never_stop_a_reader_nor_leak_into_its_output(
    base: Path, run_files: dict[str, Planting], ending: str
) -> None:
    """progress.json, result.json, error.json, outcome.json, policy.json, pid, stdout and
    stderr, written by the job (or links, fifos, folders in their place): read while it runs,
    by its harvest or a sweep, and after it ended; the job ends somewhere, saying why."""
    with example(base) as ex:
        queue = ex.queue
        run = planted_run(ex, run_files)
        opened = run_folder.open_run(run.claim.place, run.claim.run)
        try:
            check_error(timed("run_folder.read_error", partial(run_folder.read_error, opened)))
            timed("run_folder.tail", partial(run_folder.tail, opened, "stderr", 4096))
        finally:
            os.close(opened)
        read_everything(queue, [*ex.parents, run.job_id])

        end_run(queue, run, ending)

        state = queue.job(run.job_id).state
        expected = {
            "running": {State.CLAIMED},
            "exit 0": {State.DONE},
            "exit 1": {State.SCHEDULED, State.READY},
            "cannot complete": {State.DEAD},
            "SIGKILL": {State.SCHEDULED, State.READY},
            "reaped": {State.READY, State.DEAD},  # dead if its policy.json said it was the last attempt
        }[ending]
        assert state in expected, f"after {ending}, job {run.job_id} is in {state.value}/"
        if state is State.DEAD:
            says_why_dead(queue, run.job_id)
        check_invariants(queue.path, [*ex.parents, run.job_id])
        read_everything(queue, [*ex.parents, run.job_id])


RUN_FILE_NAMES = [
    "progress.json",
    "result.json",
    "error.json",
    "outcome.json",
    "policy.json",
    "pid",
    "stdout",
    "stderr",
]


@pytest.mark.parametrize("kind", hostile.NOT_FILES)
@pytest.mark.parametrize("name", RUN_FILE_NAMES)
def test_anything_but_a_file_at_a_run_files_name(base: Path, name: str, kind: str) -> None:
    """Each thing that is not a regular file, at each name of a run's folder (the property
    above draws them at random; here each one at each name, every time), read while the job
    runs and after its manager harvested it (or, for policy.json, after a sweep took it back)."""
    with example(base) as ex:
        run = planted_run(ex, {name: Planting(kind, b'{"done": 1}')})
        read_everything(ex.queue, [run.job_id])
        end_run(ex.queue, run, {"result.json": "exit 0", "policy.json": "reaped"}.get(name, "exit 1"))
        check_invariants(ex.queue.path, [*ex.parents, run.job_id])
        read_everything(ex.queue, [run.job_id])


# -- 3. the CLI: status, list, show --------------------------------------------------------------

RUNNING_MOSTLY = st.sampled_from(["running"] * 4 + ["exit 0", "exit 1", "cannot complete", "SIGKILL", "reaped"])
CONTROLS = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


@dataclass(frozen=True)
class Printed:
    """One command's run in the CLI driver."""

    argv: list[str]
    code: int
    seconds: float
    out: bytes
    err: bytes

    def __str__(self) -> str:
        return (
            f"`forkvisor {' '.join(self.argv)}` exited {self.code} after {self.seconds:.2f}s\n"
            f"stdout: {self.out[:2000]!r}\nstderr: {self.err.decode('utf-8', 'replace')[-3000:]}"
        )


def forkvisor(commands: list[list[str]]) -> list[Printed]:
    """Run `forkvisor` commands in one fresh process (`hostile.CLI_DRIVER`), their output piped."""
    done = subprocess.run(
        [sys.executable, "-c", hostile.CLI_DRIVER, str(WATCHDOG_SECONDS), json.dumps(commands)],
        capture_output=True,
        cwd=REPO,
        timeout=2 * WATCHDOG_SECONDS + 30,
        check=False,
        env={name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"},  # as in a shell
    )
    assert done.returncode == 0, done.stderr.decode("utf-8", "replace")[-3000:]
    return [
        Printed(
            found["argv"],
            found["code"],
            found["seconds"],
            base64.b64decode(found["out"]),
            base64.b64decode(found["err"]),
        )
        for found in json.loads(done.stdout)
    ]


def check_printed(printed: Printed) -> None:
    """Exit 0 within the bound, nothing on stderr; JSON strict, lines safe for a terminal."""
    assert printed.code == 0, str(printed)
    assert printed.err == b"", str(printed)
    assert printed.seconds < READER_SECONDS, str(printed)
    no_secret(printed.out, str(printed))
    if "--json" in printed.argv:
        strict_json(printed.out, str(printed))
        return
    try:
        text = printed.out.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise AssertionError(f"not UTF-8 ({exc}): {printed}") from None
    unsafe = CONTROLS.search(text)
    assert unsafe is None, f"a raw {unsafe[0]!r} reaches the terminal: {printed}"


# A process per example, nearly half a second each: at most 250 (about 110 s), under pytest's
# faulthandler_timeout of 120 s, which would dump every thread's stack.
@pytest.mark.slow  # (16 s: every reader as a process, for each example)
@settings(HOSTILE, max_examples=min(max(5, EXAMPLES * 3 // 5), 250))
@given(run_files=run_folders(tainted_documents), ending=RUNNING_MOSTLY, submission=files_only(tainted_documents(JOB)))
def test_status_list_and_show_print_strict_json_and_safe_lines(
    base: Path, run_files: dict[str, Planting], ending: str, submission: Planting
) -> None:
    """`forkvisor status`, `list` and `show`, as text and `--json`, of a queue holding a job
    with hostile run files (running or ended), a hostile submission taken in, and another
    one still waiting in incoming/. The documents here are of the right shape, with hostile
    values (the malformed ones end in dead/ or unreadable, which the other properties try):
    what the commands print and compute with."""
    with example(base) as ex:
        queue = ex.queue
        run = planted_run(ex, run_files)
        end_run(queue, run, ending)
        taken = new_job_id(time.time() + 5)
        plant(mine(queue) / f"{taken}.json", submission.bound(SELF=taken, **ex.ids), ex.outside, OVERSIZE)
        timed("queue.serving.take_in()", queue.serving.take_in)
        waiting = new_job_id(time.time() + 5)
        plant(mine(queue) / f"{waiting}.json", submission.bound(SELF=waiting, **ex.ids), ex.outside, OVERSIZE)
        shown = [run.job_id, waiting] + ([taken] if located(queue, taken) is not None else [])
        path = str(queue.path)
        commands = [["status", path, "--json"], ["status", path], ["list", path, "--json"], ["list", path]]
        commands += [["show", path, job_id, *json_flag] for job_id in shown for json_flag in (["--json"], [])]

        for printed in forkvisor(commands):
            check_printed(printed)


# -- 4. a job.json put in ready/ by hand, claimed -------------------------------------------------

COUNTER_FILES = st.one_of(st.just(Planting("missing")), st.just(Planting("missing")), plantings(COUNTERS))


@HOSTILE
@given(spec=plantings(documents(JOB, JOB_EXTRA)), counter=COUNTER_FILES)
def test_a_job_json_in_ready_is_claimed_or_buried_saying_why(base: Path, spec: Planting, counter: Planting) -> None:
    """The owner's own script (any language) writes `ready/RRR.ID/job.json`: a claim returns a
    claim whose policy a manager can run by, or moves the job on (dead saying why; back to
    ready/ for a newer format; waiting/ for a live dependency); never raises. A claimed job
    then fails its attempt through the manager's harvest, which reads its backoff."""
    with example(base) as ex:
        queue = ex.queue
        job_id = new_job_id()
        job_dir = queue.path / "ready" / ready_name(job_id, 0)
        job_dir.mkdir()
        plant(job_dir / "job.json", spec.bound(SELF=job_id, **ex.ids), ex.outside, OVERSIZE)
        plant(job_dir / "attempts", counter, ex.outside, OVERSIZE)
        owner = Owner.new(lease=60.0)
        queue.serving.register_owner(owner)

        claim = timed("queue.serving.claim", partial(queue.serving.claim, owner.name))

        state = queue.job(job_id).state
        if claim is not None:
            assert claim.job_id == job_id, claim
            assert state is State.CLAIMED, state
            check_policy(claim)
            end_run(queue, Run(job_id, claim), "exit 1")
            state = queue.job(job_id).state
            assert state in (State.SCHEDULED, State.READY, State.DEAD), state
        elif state is State.READY:
            assert queue.serving.left_for_others, f"job {job_id} is back in ready/ but not given back"
        else:
            assert state in (State.DEAD, State.WAITING), f"claim returned None, job {job_id} is in {state.value}/"
        if state is State.DEAD:
            says_why_dead(queue, job_id)
        assert quarantined(queue) == {}, "a well-named job folder was quarantined"
        check_invariants(queue.path, [*ex.parents, job_id])
        read_everything(queue, [*ex.parents, job_id])


@pytest.mark.parametrize("job_id", IMPOSSIBLE)
def test_an_id_that_names_no_moment_in_ready_stops_no_reader(base: Path, job_id: str) -> None:
    """The owner's own script dates its ids itself. `ready/100.20260230-...` is a job's name
    (a day past its month's end is carried over); a month 13, an hour 25 or a year 0 is not
    an id at all, and the next claim quarantines it with its note. Read before and after a
    claim, no reader computes with its date and fails."""
    with example(base) as ex:
        queue = ex.queue
        job_dir = queue.path / "ready" / ready_name(job_id, 0)
        job_dir.mkdir()
        (job_dir / "job.json").write_bytes(GOOD_JOB)
        if is_job_id(job_id):
            read_everything(queue, [job_id])  # `status` reads how long the oldest ready job waits
        owner = Owner.new(lease=60.0)
        queue.serving.register_owner(owner)

        timed("queue.serving.claim", partial(queue.serving.claim, owner.name))

        state = located(queue, job_id)
        if state is None:
            assert len(quarantined(queue)) == 1, f"job {job_id} is neither a job nor quarantined"
        check_invariants(queue.path, [*ex.parents, *([job_id] if state is not None else [])])
        read_everything(queue, [job_id] if state is not None else [])


def check_policy(claim: Claim) -> None:
    """The policy a manager runs the job by: numbers it can add to a time and wait for."""
    policy = claim.policy
    assert type(policy.max_attempts) is int, policy
    assert policy.max_attempts >= 1, policy
    assert policy.timeout is None or (_is_number(policy.timeout) and policy.timeout >= 0), policy
    assert policy.memory_limit is None or (type(policy.memory_limit) is int and policy.memory_limit >= 0), policy
    delay = timed("Policy.delay", partial(policy.delay, claim.attempt))
    assert type(delay) is float, (policy, delay)
    assert math.isfinite(delay), (policy, delay)
    assert delay >= 0, (policy, delay)
    assert math.isfinite(time.time() + (policy.timeout or 0.0)), policy
