"""Judge a queue after a chaos run from its folder alone.

Like `tests/jobs_processes/invariants.py` (which `check` also runs, as a second
opinion on conservation), nothing here goes through `Queue`: the store is
judged by what `ls` and `cat` show. What is checked, per docs/FORMAT.md:

- conservation: every published job is in exactly one state folder, and
  after the run in done/ or dead/ (nothing lost, duplicated or stuck), with
  nothing in claimed/ and nothing quarantined;
- attempts: the `attempts` counter never exceeds `max_attempts`, and neither
  does the number of runs that counted (runs not given back by a shutdown);
  `max_attempts` is what the runs recorded in `attempt-N/policy.json`, and
  every run recorded what the job and its function's registration declare
  (the policy is resolved by the claiming manager, jobs/policy.py);
  a counter that differs from the counted runs must be explained by a claim
  that was reverted (its owner died between counting and running);
- every run has an `outcome.json`, and its signature (`signature`) is either
  the job's own behaviour (`behaviours.BEHAVIOURS`) or something done to it
  from outside: lost with its manager, SIGKILLed, released by a shutdown;
- a done job has a `done:` event, a `result.json` that is a hard
  link to the result of its last run, whose outcome says it succeeded, and
  that result carries the job's own token;
- a dead job has an `error.json` with its reason, a `dead:` event,
  no result, an outcome per counted attempt, and, when its attempts are
  exhausted, a counter at the limit. A job that would have succeeded but
  died is allowed only if every failure was done to it from outside; those
  are listed as "dead by chaos", since a lost attempt counts (by design:
  attempts are counted before the fork, so crash loops converge).

Known issues are listed apart (`Report.known`) so that a run still fails on
anything new; `check(..., strict=True)` counts them as violations:

- a done or dead job whose `events` has its `done:` or `dead:` line twice:
  the line is written just before the rename (so that the story never lacks
  its end), and a mover SIGKILLed between the two leaves a line for a move
  that a sweeper then redid.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobs.job import State, is_job_id, parse_ready_name, parse_scheduled_name
from tests.chaos.behaviours import BY_NAME, Behaviour
from tests.chaos.behaviours import registry as REGISTRY
from tests.jobs_processes import invariants

DEFAULT_MAX_ATTEMPTS = 3  # jobs/config.py's built-in value: the chaos queue sets none
LOST, RELEASED, SUCCEEDED = "lost", "released", "succeeded"
KILLED_FROM_OUTSIDE = "killed by SIGKILL Crashed"  # a chaos SIGKILL of the job's child
COUNTED_THEN_LOST = (  # events saying a claim's owner died after counting its attempt (jobs/sweep.py, jobs/store.py)
    "ready: claim reverted",
    "dead: attempts exhausted: attempt",
    "dead: attempts exhausted: all",
)
_ATTEMPT_RE = re.compile(r"^attempt-([1-9][0-9]*)$")
_EVENT_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z (.+)$")
_MISSING = object()


@dataclass(frozen=True)
class Run:
    """One `attempt-N/` folder."""

    number: int
    outcome: dict[str, Any] | None
    result_inode: int | None  # of attempt-N/result.json
    stdout_size: int
    policy: dict[str, Any] | None  # attempt-N/policy.json: what its claimer resolved

    @property
    def signature(self) -> str:
        return signature(self.outcome)

    @property
    def counted(self) -> bool:
        """Did this run use up an attempt? A run an operator's shutdown stopped gave it back."""
        return not (self.outcome or {}).get("released", False)


@dataclass(frozen=True)
class JobFolder:
    """One job directory, as read from disk."""

    job_id: str
    state: State
    path: Path
    spec: dict[str, Any]
    attempts: int
    runs: tuple[Run, ...]
    events: tuple[str, ...]  # the texts, without their time stamps
    error: dict[str, Any] | None
    result: Any  # _MISSING when there is no result.json
    result_inode: int | None

    @property
    def declared_max_attempts(self) -> int:
        """What the job, else its function's registration, else the built-in value says."""
        registered = REGISTRY.lookup(str(self.spec.get("function")))
        return int(self.spec.get("max_attempts") or (registered and registered.max_attempts) or DEFAULT_MAX_ATTEMPTS)

    @property
    def max_attempts(self) -> int:
        """The limit the newest run that recorded its policy was started under."""
        recorded = [run.policy["max_attempts"] for run in self.runs if run.policy]
        return int(recorded[-1]) if recorded else self.declared_max_attempts

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.spec.get("kwargs") or {})

    def counted_runs(self) -> list[Run]:
        return [run for run in self.runs if run.counted]

    def events_starting(self, prefix: str) -> int:
        return sum(1 for text in self.events if text.startswith(prefix))


@dataclass
class Report:
    """What the folder says after the run: figures, explained oddities, violations."""

    enqueued: int = 0
    states: Counter[str] = field(default_factory=Counter)
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    quarantined: list[str] = field(default_factory=list)
    owner_folders: list[str] = field(default_factory=list)
    runs: Counter[str] = field(default_factory=Counter)  # by signature
    max_counter: int = 0
    dead_by_chaos: list[str] = field(default_factory=list)
    temporaries: list[str] = field(default_factory=list)  # .NAME.PID.tmp files a killed writer left in a job
    explained: list[str] = field(default_factory=list)
    known: list[str] = field(default_factory=list)  # known issues (module docstring), not failures
    violations: list[str] = field(default_factory=list)


def signature(outcome: dict[str, Any] | None) -> str:
    """A run's outcome in a few words: "lost", "released", "succeeded", or
    "[LIMIT: ]STATUS ERRORTYPE" (e.g. "timeout: killed by SIGTERM Timeout")."""
    if outcome is None:
        return "no outcome"
    if outcome.get("lost"):
        return LOST
    if outcome.get("released"):
        return RELEASED
    if outcome.get("succeeded"):
        return SUCCEEDED
    error = outcome.get("error")
    kind = error.get("type", "?") if isinstance(error, dict) else "?"
    limit = f"{outcome['limit']}: " if outcome.get("limit") else ""
    return f"{limit}{outcome.get('status', '?')} {kind}"


# -- the whole queue ---------------------------------------------------------------


def check(
    queue_path: str | os.PathLike[str],
    published: Iterable[str],
    strict: bool = False,
    killed_pids: Iterable[int] = (),
) -> Report:
    """Read the queue folder and judge it; the run is good when `violations` is empty.
    With `strict`, known issues count as violations too. `killed_pids`, the job children
    chaos SIGKILLed, is the one thing not in the folder: a SIGKILL landing just after the
    manager's timeout SIGTERM looks like a job that ignored SIGTERM, unless we know."""
    killed = frozenset(killed_pids)
    root = Path(queue_path)
    published_ids = set(published)
    report = Report(enqueued=len(published_ids))
    places = _places(root, report)
    _check_conservation(report, places, published_ids)
    _second_opinion(report, root, published_ids)
    ended: dict[str, JobFolder] = {}
    for job_id, found in sorted(places.items()):
        state, path = found[0]
        report.states[state.value] += 1
        if state.terminal and len(found) == 1:
            ended[job_id] = read_job(job_id, state, path)
    for job in ended.values():
        _check_job(report, job, killed, ended)
    report.quarantined = invariants.entries(root / "quarantine")
    for name in report.quarantined:
        report.violations.append(f"quarantine/{name}: something was quarantined")
    if strict:
        report.violations += report.known
    return report


def _places(root: Path, report: Report) -> dict[str, list[tuple[State, Path]]]:
    """job id -> every place it is in; entries that are not jobs are violations."""
    places: dict[str, list[tuple[State, Path]]] = {}
    for state, parent in _state_folders(root, report):
        for entry in _scan(parent):
            if state is State.CLAIMED and entry.name.startswith("."):
                continue  # .owner.json and its write-then-rename temporaries
            job_id = _id_in(state, entry.name)
            where = os.path.relpath(entry.path, root)
            if job_id is None or entry.is_symlink() or not entry.is_dir():
                report.violations.append(f"{where}: not a job directory")
            else:
                places.setdefault(job_id, []).append((state, Path(entry.path)))
    return places


def _state_folders(root: Path, report: Report) -> list[tuple[State, Path]]:
    folders: list[tuple[State, Path]] = [(state, root / state.value) for state in State if state is not State.CLAIMED]
    for owner in _scan(root / State.CLAIMED.value):
        report.owner_folders.append(owner.name)
        folders.append((State.CLAIMED, Path(owner.path)))
    return folders


def _id_in(state: State, name: str) -> str | None:
    if state is State.READY:
        ready = parse_ready_name(name)
        return ready[0] if ready else None
    if state is State.SCHEDULED:
        scheduled = parse_scheduled_name(name)
        return scheduled[0] if scheduled else None
    return name if is_job_id(name) else None


def _check_conservation(report: Report, places: dict[str, list[tuple[State, Path]]], published: set[str]) -> None:
    for job_id in sorted(published - set(places)):
        report.lost.append(job_id)
        report.violations.append(f"job {job_id} is lost: in no state folder")
    for job_id, found in sorted(places.items()):
        listed = ", ".join(f"{state.value}:{path.name}" for state, path in found)
        if job_id not in published:
            report.violations.append(f"job {job_id} was never published but is in {listed}")
        if len(found) > 1:
            report.duplicated.append(job_id)
            report.violations.append(f"job {job_id} is in {len(found)} places: {listed}")
        elif not found[0][0].terminal:
            report.stuck.append(job_id)
            report.violations.append(f"job {job_id} is stuck in {listed} after the run quiesced")


def _second_opinion(report: Report, root: Path, published: set[str]) -> None:
    """The conservation check the store's own process tests use, on the same folder."""
    try:
        invariants.check_invariants(root, published)
    except AssertionError as exc:
        report.violations.append(f"invariants.check_invariants: {exc}")


# -- one job --------------------------------------------------------------------------


def read_job(job_id: str, state: State, path: Path) -> JobFolder:
    """Everything the checker looks at in one job directory."""
    result, result_inode = _read_result(path / "result.json")
    return JobFolder(
        job_id=job_id,
        state=state,
        path=path,
        spec=_read_json(path / "job.json") or {},
        attempts=invariants.read_attempts(path),
        runs=tuple(sorted(_runs(path), key=lambda run: run.number)),
        events=_read_events(path / "events"),
        error=_read_json(path / "error.json"),
        result=result,
        result_inode=result_inode,
    )


def _runs(job_dir: Path) -> Iterable[Run]:
    for entry in _scan(job_dir):
        match = _ATTEMPT_RE.match(entry.name)
        if match and entry.is_dir(follow_symlinks=False):
            folder = Path(entry.path)
            outcome, policy = _read_json(folder / "outcome.json"), _read_json(folder / "policy.json")
            yield Run(int(match[1]), outcome, _inode(folder / "result.json"), _size(folder), policy)


def _check_job(report: Report, job: JobFolder, killed: frozenset[int], ended: dict[str, JobFolder]) -> None:
    behaviour = BY_NAME.get(str(job.spec.get("function")))
    if behaviour is None:
        report.violations.append(f"job {job.job_id}: unknown function {job.spec.get('function')!r} in job.json")
        return
    report.max_counter = max(report.max_counter, job.attempts)
    report.temporaries += [f"{job.job_id}/{name}" for name in _temporaries(job.path)]
    problems = _attempt_problems(report, job) + _run_problems(report, job, behaviour, killed)
    if job.state is State.DONE:
        problems += _done_problems(job, behaviour)
    else:
        problems += _dead_problems(report, job, behaviour)
    about = f"job {job.job_id} ({behaviour.name}, {job.state.value})"
    problems += _terminal_event_missing(job) + _dependency_problems(job, ended)
    report.known += [f"{about}: {text}" for text in _terminal_event_repeated(job)]
    report.violations += [f"{about}: {text}" for text in problems]


def _terminal_event_missing(job: JobFolder) -> list[str]:
    prefix = "done:" if job.state is State.DONE else "dead:"
    if job.events_starting(prefix) == 0:
        return [f"events has no '{prefix}' line"]
    return []


def _terminal_event_repeated(job: JobFolder) -> list[str]:
    """Known issue (module docstring): a mover killed between the line and the rename."""
    prefix = "done:" if job.state is State.DONE else "dead:"
    found = job.events_starting(prefix)
    return [f"events has {found} '{prefix}' lines (a mover killed between logging and moving)"] if found > 1 else []


def _attempt_problems(report: Report, job: JobFolder) -> list[str]:
    counted = len(job.counted_runs())
    problems = [
        f"run {run.number} recorded max_attempts {run.policy['max_attempts']}, "
        f"but the job and its registration declare {job.declared_max_attempts}"
        for run in job.runs
        if run.policy and run.policy.get("max_attempts") != job.declared_max_attempts
    ]
    if job.attempts > job.max_attempts:
        problems.append(f"attempts counter {job.attempts} is above max_attempts {job.max_attempts}")
    if counted > job.max_attempts:
        problems.append(f"{counted} runs used up an attempt, above max_attempts {job.max_attempts}")
    if job.attempts < counted:
        problems.append(f"attempts counter {job.attempts} is below the {counted} runs that used up an attempt")
    elif job.attempts > counted:
        if any(job.events_starting(prefix) for prefix in COUNTED_THEN_LOST):
            report.explained.append(
                f"job {job.job_id}: counter {job.attempts} > {counted} counted runs: an attempt was counted "
                "and its owner died before the run folder was made or before a shutdown gave it back"
            )
        else:
            problems.append(f"attempts counter {job.attempts} is above the {counted} counted runs, unexplained")
    return problems


def _run_problems(report: Report, job: JobFolder, behaviour: Behaviour, killed: frozenset[int]) -> list[str]:
    problems = []
    own = behaviour.failure(job.kwargs) if behaviour.failure else None
    for run in job.runs:
        found = run.signature
        report.runs[found] += 1
        allowed = {LOST, RELEASED, KILLED_FROM_OUTSIDE, own} | ({SUCCEEDED} if behaviour.succeeds else set())
        if found not in allowed and not _killed_at_a_limit(run, killed):
            problems.append(f"run {run.number} ended {found!r}; expected {own or SUCCEEDED!r} or a chaos kill")
    for text in job.events:
        if text.startswith("malformed:"):
            problems.append(f"events line {text[len('malformed:') :]!r} has no time stamp")
    return problems


def _killed_at_a_limit(run: Run, killed: frozenset[int]) -> bool:
    """A chaos SIGKILL that hit the child while the manager was stopping it at a limit."""
    outcome = run.outcome or {}
    return outcome.get("signal") == "SIGKILL" and outcome.get("pid") in killed


def _done_problems(job: JobFolder, behaviour: Behaviour) -> list[str]:
    problems = _event_count_problems(job, done=1, dead=0)
    if not behaviour.succeeds:
        problems.append("a job that never succeeds ended in done/")
    if _own_failures(job, behaviour) > behaviour.own_failures:
        problems.append(f"failed by its own doing {_own_failures(job, behaviour)} times before succeeding")
    if job.result is _MISSING:
        return [*problems, "done/ without result.json"]
    if not isinstance(job.result, dict) or job.result.get("token") != job.kwargs.get("token"):
        problems.append(f"result.json {job.result!r:.100} is not this job's (token {job.kwargs.get('token')!r})")
    return problems + _winner_problems(job)


def _winner_problems(job: JobFolder) -> list[str]:
    """result.json must be a hard link to the result of the last run, which succeeded."""
    winners = [run for run in job.runs if run.result_inode is not None and run.result_inode == job.result_inode]
    if len(winners) != 1:
        return [f"result.json is a link to the result of {len(winners)} runs, not exactly one"]
    winner, last = winners[0], job.runs[-1]
    problems = []
    if winner is not last:
        problems.append(f"the completing run {winner.number} is not the last run ({last.number})")
    if winner.signature != SUCCEEDED:
        problems.append(f"the completing run {winner.number} has outcome {winner.signature!r}")
    expected_bytes = job.result.get("bytes") if isinstance(job.result, dict) else None
    if expected_bytes is not None and winner.stdout_size != expected_bytes:
        problems.append(f"run {winner.number} stdout holds {winner.stdout_size} bytes, the job wrote {expected_bytes}")
    return problems


def _dead_problems(report: Report, job: JobFolder, behaviour: Behaviour) -> list[str]:
    problems = _event_count_problems(job, done=0, dead=1)
    reason = (job.error or {}).get("reason")
    if job.result is not _MISSING:
        problems.append("dead/ with a result.json")
    if any(run.outcome is None for run in job.runs):
        problems.append("a run has no outcome.json, so its cause is unknown")
    if reason == "attempts exhausted":
        if job.attempts != job.max_attempts:
            problems.append(f"buried as exhausted with attempts {job.attempts}/{job.max_attempts}")
        problems += _exhausted_problems(report, job, behaviour)
    elif reason == "dependency dead":
        pass  # judged with its parents (`_dependency_problems`)
    elif reason == "cannot be completed":
        own = behaviour.failure(job.kwargs) if behaviour.failure else None
        if not behaviour.permanent or not job.runs or job.runs[-1].signature != own:
            problems.append("buried as 'cannot be completed' without its last run raising CannotComplete")
    else:
        problems.append(f"error.json gives reason {reason!r}")
    return problems


def _dependency_problems(job: JobFolder, ended: dict[str, JobFolder]) -> list[str]:
    """A job that depends on others ran only after all had ended, done (or dead, with
    allow_failure); one buried for a dependency has a dead one and never ran."""
    parents = job.spec.get("depends_on") or []
    died_for_one = (job.error or {}).get("reason") == "dependency dead"
    if not parents:
        return ["buried for a dependency it does not have"] if died_for_one else []
    allow = job.spec.get("allow_failure") is True
    dead = [parent for parent in parents if parent in ended and ended[parent].state is State.DEAD]
    if died_for_one:
        problems = (
            [] if dead and not allow else [f"buried for a dependency, though dead are {dead} (allow_failure {allow})"]
        )
        return problems + (["ran though a job it depends on is dead"] if job.runs else [])
    if not job.runs:
        return []
    started = min(run.outcome["started"] for run in job.runs if run.outcome and "started" in run.outcome)
    problems = []
    for parent in parents:
        other = ended.get(parent)
        if other is None:
            problems.append(f"ran, but job {parent} it depends on did not end")
            continue
        if other.state is State.DEAD and not allow:
            problems.append(f"ran though job {parent} it depends on is dead")
        finished = [run.outcome["ended"] for run in other.runs if run.outcome and "ended" in run.outcome]
        if finished and started < max(finished):
            problems.append(f"started at {started:.3f}, before job {parent} it depends on ended at {max(finished):.3f}")
    return problems


def _exhausted_problems(report: Report, job: JobFolder, behaviour: Behaviour) -> list[str]:
    """A job that would have ended otherwise may die of exhaustion only if chaos spent its attempts."""
    if not (behaviour.succeeds or behaviour.permanent):
        return []
    if _own_failures(job, behaviour) > behaviour.own_failures:
        return [f"ran out of attempts by its own doing ({[run.signature for run in job.runs]})"]
    report.dead_by_chaos.append(job.job_id)
    report.explained.append(
        f"job {job.job_id} ({behaviour.name}) died: chaos spent its attempts "
        f"({', '.join(run.signature for run in job.runs) or 'no run folder'})"
    )
    return []


def _own_failures(job: JobFolder, behaviour: Behaviour) -> int:
    own = behaviour.failure(job.kwargs) if behaviour.failure else None
    return sum(1 for run in job.runs if own is not None and run.signature == own)


def _event_count_problems(job: JobFolder, done: int, dead: int) -> list[str]:
    """Never the other terminal line (a missing or repeated own one is judged apart)."""
    problems = []
    for prefix, expected in (("done:", done), ("dead:", dead)):
        found = job.events_starting(prefix)
        if expected == 0 and found > 0:
            problems.append(f"events has {found} '{prefix}' lines, expected {expected}")
    return problems


# -- reading files ---------------------------------------------------------------------


def _scan(folder: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as found:
            return list(found)
    except FileNotFoundError:
        return []


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except ValueError as exc:
        return {"unreadable": f"{path.name}: {exc}"}


def _read_result(path: Path) -> tuple[Any, int | None]:
    try:
        return json.loads(path.read_bytes()), os.stat(path).st_ino
    except FileNotFoundError:
        return _MISSING, None
    except ValueError as exc:
        return {"unreadable": str(exc)}, os.stat(path).st_ino


def _read_events(path: Path) -> tuple[str, ...]:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return ()
    return tuple(match[1] if (match := _EVENT_RE.match(line)) else f"malformed:{line}" for line in lines)


def _temporaries(job_dir: Path) -> list[str]:
    return [entry.name for entry in _scan(job_dir) if entry.name.startswith(".") and entry.name.endswith(".tmp")]


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


def _size(attempt: Path) -> int:
    try:
        return os.stat(attempt / "stdout").st_size
    except FileNotFoundError:
        return 0
