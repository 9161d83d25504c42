"""The chaos run: `python -m tests.chaos.run --jobs 3000 --managers 3 --seed N`.

Thousands of jobs of mixed behaviour (`behaviours.BEHAVIOURS`) go through two
or three real `forkvisor run` managers while this script, at random moments,
SIGKILLs a job's child, a manager or a sweeper, drains a manager with SIGTERM
(or two: stop now), asks every manager to drain through the queue folder, or
SIGSTOPs a manager past its lease (a sweeper reaps it; once SIGCONTed it must
find itself fenced out); exited managers are restarted. Then it lets the queue quiesce, stops the
managers, runs a final `--burst` manager, and judges the folder alone
(`checker.check`). It prints the figures and exits 1 on any violation.

The seed fixes the jobs, their arguments and the sequence of chaos events, so
a failing run can be replayed with `--seed`; the moments things happen at
depend on the machine, so a replay repeats the plan, not every interleaving.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import IO, Any

import psutil

from jobs import Call, JobOptions, Queue
from tests.chaos import checker
from tests.chaos.behaviours import BEHAVIOURS, LONG_LIFETIME, OUTLIVED, OVERLAP, SURVIVED, Scratch
from tests.chaos.cluster import APP, JOB_TITLE, SWEEPER_TITLE, Cluster, ManagerOptions, ManagerProcess, title, wait_for

DEPENDENTS = 4  # jobs of each batch enqueued to wait for others of it (`depends_on`)


class Kind(Enum):
    """The chaos events."""

    ENQUEUE = "enqueue"
    KILL_CHILD = "kill child"  # SIGKILL a job's process
    KILL_MANAGER = "kill manager"  # SIGKILL a manager (its children die with it)
    KILL_SWEEPER = "kill sweeper"  # SIGKILL a manager's lease-sweeper child
    DRAIN = "drain"  # SIGTERM one manager
    STOP_NOW = "stop now"  # SIGTERM one manager twice
    DRAIN_ALL = "drain all"  # `forkvisor drain QUEUE`: every manager drains
    PAUSE = "pause manager"  # SIGSTOP one manager past its lease, then SIGCONT


@dataclass(frozen=True)
class Config:
    """How big and how wild a run is."""

    jobs: int = 3000
    managers: int = 3
    seed: int = 1
    interval: float = 0.25  # mean pause between chaos events (seconds, exponentially distributed)
    first_batch: float = 0.3  # share of the jobs enqueued before the first event
    batch: int = 60  # jobs per later enqueue
    quiesce_timeout: float = 240.0
    strict: bool = False  # known issues (checker.Report.known) count as violations
    target_timeout: float = 5.0  # how long an event waits for something to hit (a running job, a sweeper)
    options: ManagerOptions = field(default_factory=ManagerOptions)

    def event_counts(self) -> dict[Kind, int]:
        """How many events of each kind, scaled with the number of jobs."""
        n = self.jobs
        return {
            Kind.KILL_CHILD: max(3, n // 60),
            Kind.KILL_MANAGER: max(2, n // 250),
            Kind.KILL_SWEEPER: max(2, n // 250),
            Kind.DRAIN: max(2, n // 300),
            Kind.STOP_NOW: max(1, n // 1000),
            Kind.DRAIN_ALL: max(1, n // 3000),
            Kind.PAUSE: max(1, n // 1000),
        }

    def replay(self) -> str:
        return f"python -m tests.chaos.run --jobs {self.jobs} --managers {self.managers} --seed {self.seed}"


@dataclass(frozen=True)
class Workspace:
    """A fresh folder holding the queue, the jobs' scratch space and every log."""

    root: Path

    @classmethod
    def create(cls, root: Path | None) -> Workspace:
        workspace = cls(Path(tempfile.mkdtemp(prefix="forkvisor-chaos-")) if root is None else root)
        workspace.logs.mkdir(parents=True, exist_ok=True)
        workspace.scratch.create()
        return workspace

    @property
    def queue(self) -> Path:
        return self.root / "queue"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def scratch(self) -> Scratch:
        return Scratch.beside(self.queue)  # where the jobs find it


# -- the plan -----------------------------------------------------------------------


def plan_jobs(rng: random.Random, count: int, scratch: Scratch) -> list[Call]:
    """`count` calls drawn from the behaviours by weight, each with a unique token."""
    chosen = rng.choices(BEHAVIOURS, weights=[behaviour.weight for behaviour in BEHAVIOURS], k=count)
    return [Call(b.function, (), b.arguments(rng, f"t{n:06d}", scratch)) for n, b in enumerate(chosen)]


def plan_batches(config: Config, calls: list[Call]) -> list[list[Call]]:
    first = max(1, int(len(calls) * config.first_batch))
    rest = calls[first:]
    return [calls[:first], *(rest[start : start + config.batch] for start in range(0, len(rest), config.batch))]


def plan_events(rng: random.Random, config: Config, batches: int) -> list[Kind]:
    """The first batch, then the kills shuffled, with the other batches spread evenly among them
    so that jobs keep arriving (and running) while chaos happens."""
    kills = [kind for kind, count in config.event_counts().items() for _ in range(count)]
    rng.shuffle(kills)
    events = [Kind.ENQUEUE]
    every = max(1, len(kills) // max(1, batches - 1))
    for position, kind in enumerate(kills):
        if position % every == 0 and events.count(Kind.ENQUEUE) < batches:
            events.append(Kind.ENQUEUE)
        events.append(kind)
    return events + [Kind.ENQUEUE] * (batches - events.count(Kind.ENQUEUE))


# -- the chaos --------------------------------------------------------------------------


class Chaos:
    """Performs the events of the plan on a running cluster."""

    def __init__(
        self, config: Config, cluster: Cluster, queue: Queue, batches: list[list[Call]], note: Callable[[str], None]
    ) -> None:
        self.config = config
        self.cluster = cluster
        self.queue = queue
        self.rng = cluster.rng
        self.batches: Iterator[list[Call]] = iter(batches)
        self.note = note
        self.published: list[str] = []
        self.performed: Counter[Kind] = Counter()
        self.skipped: Counter[Kind] = Counter()
        self.killed_children: set[tuple[int, float]] = set()  # (pid, start time)

    def wait_between_events(self, seconds: float) -> None:
        """Let the managers work for a while, restarting those that exit."""
        until = time.monotonic() + seconds
        wait_for(lambda: time.monotonic() >= until, seconds + 1.0, "a pause between chaos events", self.cluster.tend)

    def perform(self, kind: Kind) -> None:
        actions: dict[Kind, Callable[[], bool]] = {
            Kind.ENQUEUE: self._enqueue,
            Kind.KILL_CHILD: self._kill_child,
            Kind.KILL_MANAGER: self._kill_manager,
            Kind.KILL_SWEEPER: self._kill_sweeper,
            Kind.DRAIN: lambda: self._signal_manager(self.cluster.drain, kind),
            Kind.STOP_NOW: lambda: self._signal_manager(self._stop_now, kind),
            Kind.DRAIN_ALL: self._drain_all,
            Kind.PAUSE: self._pause,
        }
        if actions[kind]():
            self.performed[kind] += 1
        else:
            self.skipped[kind] += 1
            self.note(f"skipped {kind.value}: nothing to hit within {self.config.target_timeout:g}s")

    def _enqueue(self) -> bool:
        """A batch, the last few of which depend on 1-3 jobs of the batch (some allowing failure)."""
        batch = next(self.batches, [])
        plain, later = (batch[:-DEPENDENTS], batch[-DEPENDENTS:]) if len(batch) > 2 * DEPENDENTS else (batch, [])
        ids = self.queue.enqueue_many(plain)
        self.published += ids
        for call in later:
            parents = self.rng.sample(ids, k=self.rng.randint(1, 3))
            options = JobOptions(depends_on=parents, allow_failure=self.rng.random() < 0.3)
            self.published.append(self.queue.submit(Call(call.fn, call.args, call.kwargs, options)))
        self.note(f"enqueued {len(batch)} jobs, {len(later)} of them after others ({len(self.published)} in all)")
        return bool(batch)

    def _kill_child(self) -> bool:
        hit = self._kill_one(lambda: self.cluster.children_titled(JOB_TITLE))
        if hit is not None:
            self.killed_children.add(hit)
        return hit is not None

    def _kill_manager(self) -> bool:
        target = self._target(self.cluster.unpaused)  # a paused one must live to find itself fenced out
        if target is not None:
            self.cluster.kill(target)
            self.note(f"SIGKILL {target.name}")
        return target is not None

    def _kill_sweeper(self) -> bool:
        return self._kill_one(lambda: self.cluster.children_titled(SWEEPER_TITLE)) is not None

    def _kill_one(self, find: Callable[[], list[tuple[ManagerProcess, psutil.Process]]]) -> tuple[int, float] | None:
        """SIGKILL one of the processes `find` lists, retrying while those picked end first;
        return its (pid, start time), or None if nothing could be hit in time."""
        deadline = time.monotonic() + self.config.target_timeout
        while time.monotonic() < deadline:
            target = self._target(find)
            if target is None:
                return None
            manager, process = target
            what = title(process)[:70]
            try:
                started = process.create_time()
                if process.status() == psutil.STATUS_ZOMBIE:
                    continue  # it has exited already: killing it would be no kill
                process.send_signal(signal.SIGKILL)  # psutil checks that the pid was not reused meanwhile
            except psutil.Error:
                continue  # it ended first
            self.note(f"SIGKILL {what} (pid {process.pid}) of {manager.name}")
            return process.pid, started
        return None

    def _signal_manager(self, action: Callable[[Any], None], kind: Kind) -> bool:
        target = self._target(self.cluster.serving)  # a SIGTERM before its handlers are installed would kill it
        if target is not None:
            action(target)
            self.note(f"{kind.value}: {target.name}")
        return target is not None

    def _pause(self) -> bool:
        """Long enough for a sweeper to judge its lease expired and reap it."""
        target = self._target(self.cluster.serving)
        if target is not None:
            self.cluster.pause(target, self.config.options.pause)
            self.note(f"SIGSTOP {target.name}")
        return target is not None

    def _stop_now(self, manager: ManagerProcess) -> None:
        self.cluster.stop_now(manager, self.config.target_timeout)

    def _drain_all(self) -> bool:
        try:
            wait_for(self.cluster.all_started, self.config.target_timeout, "every manager started", self.cluster.tend)
        except TimeoutError:
            return False
        code = self.cluster.drain_all(self.config.target_timeout)
        self.note(f"forkvisor drain: exit {code}")
        return code == 0

    def _target(self, find: Callable[[], list[Any]]) -> Any:
        """Wait (up to the target timeout) for something to hit, and pick one at random."""
        found: list[Any] = []

        def something_found() -> bool:
            found[:] = find()
            return bool(found)

        try:
            wait_for(something_found, self.config.target_timeout, "a target", self.cluster.tend)
        except TimeoutError:
            return None
        return self.rng.choice(found)


# -- quiescence and leftovers ---------------------------------------------------------------


def quiesced(queue: Path, total: int) -> bool:
    """Nothing ready, scheduled or claimed, and every job done or dead (as `ls` shows it)."""
    if _names(queue / "ready") or _names(queue / "scheduled"):
        return False
    for owner in _names(queue / "claimed"):
        if [name for name in _names(queue / "claimed" / owner) if not name.startswith(".")]:
            return False
    return len(_names(queue / "done")) + len(_names(queue / "dead")) >= total


def _names(folder: Path) -> list[str]:
    try:
        return os.listdir(folder)
    except FileNotFoundError:
        return []


@dataclass
class Grandchildren:
    """What became of the long-lived grandchildren that `chaos.fork_hang` jobs forked, and
    whether a run of any job started while a process of an earlier run of it lived."""

    bound: float  # how long a grandchild may outlive its job's end (`ManagerOptions.outstay_bound`)
    recorded: int = 0
    outlived: int = 0  # seen alive after their job ended, however briefly
    longest: float = 0.0  # seconds: the longest any (not excused) was seen alive after its job ended
    excused: list[str] = field(default_factory=list)  # left running when no manager was left on the host
    leaked: list[str] = field(default_factory=list)  # outlived their job beyond the bound, or every manager
    overlaps: list[str] = field(default_factory=list)  # a run started while a process of an earlier run lived

    @property
    def violations(self) -> list[str]:
        """Leaks, and overlaps: in either containment mode (a cgroup, or the mark every
        process of a run inherits), no run overlaps its retry, and nothing of a run outlives it."""
        return [*self.leaked, *self.overlaps]


def judge_grandchildren(
    scratch: Scratch, bound: float, kills: dict[int, float], lives: list[tuple[int | None, float, float]]
) -> Grandchildren:
    """Judged once every manager has exited, the final `--burst` one too. `kills`: when chaos
    SIGKILLed each manager, by pid; `lives`: (pid, start, end) of every manager (`Cluster.lives`).

    Overlaps (`behaviours._one_run_at_a_time`, `_record_overlaps`) are violations, always.

    A grandchild may outlive its job's end (its job's process exited: the grandchild saw it
    through a pidfd, `behaviours._live`) by `bound` seconds at most: its manager reaps the job
    and ends the rest of the run (the run's cgroup, or its marks); if chaos SIGKILLed its
    manager, whoever reaps that manager's claims on this host ends it (a live manager's
    sweeper, if it has one at the time: chaos kills sweepers too), and its successor does as it
    starts, before its first claim (`containment.clear_dead_owners`). So the end is due within
    `bound` of the job's end, or of the first manager start after the kill if that came later;
    and anything still alive now, with every manager gone, is a leak.

    Excused, and only that: a grandchild of a run whose manager chaos SIGKILLed when no other
    manager lived on this host afterwards (none running on, none started since, not even the
    final burst one): nobody was left to end it. The final burst manager follows every kill,
    so there is none unless it could not start (which is reported as a problem)."""
    found = Grandchildren(bound)
    now = time.monotonic()
    found.overlaps = [_read(path)["about"] for path in sorted(scratch.overlaps.glob(f"{OVERLAP}.*"))]
    for path in scratch.grandchildren.glob("[0-9]*"):
        if not path.name.isdigit():
            continue  # PID.survived, PID.outlived
        record = _read(path)
        if record["lifetime"] < LONG_LIFETIME:
            continue
        found.recorded += 1
        witness = _read(path.with_name(path.name + OUTLIVED)) if path.with_name(path.name + OUTLIVED).exists() else {}
        alive = _running(record["pid"], record["started"])
        survived = path.with_name(path.name + SURVIVED).exists()
        if not (witness or alive or survived):
            continue  # it died with its job
        found.outlived += bool(witness)
        about = (
            f"grandchild pid {record['pid']} of job {record['token']} (job pid {record['job']}, "
            f"manager pid {record['manager']})"
        )
        killed = kills.get(record["manager"])
        if killed is not None and not any(pid != record["manager"] and end > killed for pid, _, end in lives):
            found.excused.append(f"{about}: its manager was SIGKILLed and no manager lived on this host after it")
            continue
        if not witness:
            found.leaked.append(f"{about}: {'lived its whole life' if survived else 'alive'}, and so did its job")
            continue
        ended = witness["job_ended"]
        due = ended
        if killed is not None:
            due = max(ended, min((start for _, start, _ in lives if start > killed), default=ended))
        seen = now if alive else witness["alive_at"]
        found.longest = max(found.longest, seen - ended)
        if alive:
            found.leaked.append(f"{about}: alive {seen - ended:.1f}s after its job ended, every manager gone")
        elif seen > due + bound:
            found.leaked.append(
                f"{about}: alive {seen - ended:.1f}s after its job ended"
                + (f" ({seen - due:.1f}s after its manager's successor started)" if due > ended else "")
                + f", beyond the bound of {bound:g}s"
            )
    return found


def _read(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(path.read_text())
    return document


def _running(pid: int, started: float) -> bool:
    try:
        process = psutil.Process(pid)
        return abs(process.create_time() - started) < 0.01 and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def log_findings(logs: Path) -> Counter[str]:
    """ERROR lines and tracebacks in the managers' logs, by message head."""
    found: Counter[str] = Counter()
    for path in logs.glob("*.log"):
        for line in path.read_text(errors="replace").splitlines():
            if "Traceback" in line:
                found[f"traceback in {path.name}"] += 1
            elif " ERROR " in line:
                found[line.split(" ERROR ", 1)[1][:90]] += 1
    return found


# -- the run ------------------------------------------------------------------------------


@dataclass
class Outcome:
    """Everything a run found, and how to print it."""

    config: Config
    workspace: Workspace
    performed: Counter[Kind]
    skipped: Counter[Kind]
    restarts: int
    report: checker.Report
    grandchildren: Grandchildren
    problems: list[str]  # with the processes: unexpected exits, drains that hung, a failed burst
    log_errors: Counter[str]
    chaos_seconds: float = 0.0
    quiesce_seconds: float | None = None  # None: it never quiesced
    wall_seconds: float = 0.0

    @property
    def violations(self) -> list[str]:
        # Tracebacks in the logs are not violations by themselves: a child forked for a claim
        # lost while its manager was paused prints one (exit 70), harmlessly. An internal error
        # in a manager shows as its exit 101, which `problems` reports.
        return [*self.report.violations, *self.problems, *self.grandchildren.violations]

    def summary(self, verbose: bool = False) -> str:
        shown = None if verbose else 10
        lines = _figures(self)
        lines += [f"  explained: {text}" for text in self.report.explained[:shown]]
        lines += [f"  known issue: {text}" for text in self.report.known[:shown]]
        lines += [f"  excused: {text}" for text in self.grandchildren.excused[:shown]]
        lines += [f"  VIOLATION: {text}" for text in self.violations[:shown]]
        return "\n".join(lines)


def _figures(outcome: Outcome) -> list[str]:
    config, report = outcome.config, outcome.report
    events = ", ".join(
        f"{kind.value} {outcome.performed[kind]}"
        + (f" (skipped {outcome.skipped[kind]})" if outcome.skipped[kind] else "")
        for kind in Kind
    )
    runs = ", ".join(f"{sig} {n}" for sig, n in report.runs.most_common())
    quiesce = "never" if outcome.quiesce_seconds is None else f"{outcome.quiesce_seconds:.1f}s"
    grandchildren = outcome.grandchildren
    return [
        f"forkvisor chaos run: seed {config.seed}, {config.jobs} jobs, {config.managers} managers x concurrency "
        f"{config.options.concurrency} on {os.cpu_count()} cores",
        f"  events: {events}; manager restarts {outcome.restarts}",
        f"  jobs: enqueued {report.enqueued}, done {report.states['done']}, dead {report.states['dead']} "
        f"(dead by chaos {len(report.dead_by_chaos)}); lost {len(report.lost)}, duplicated {len(report.duplicated)}, "
        f"stuck {len(report.stuck)}, quarantined {len(report.quarantined)}, "
        f"owner folders left {len(report.owner_folders)}",
        f"  runs: {runs}",
        f"  attempts: highest counter {report.max_counter}; explained oddities {len(report.explained)}; "
        f"known issues {len(report.known)}; temporaries left in job folders {len(report.temporaries)}",
        f"  grandchildren of hanging jobs: {grandchildren.recorded}, seen alive after their job ended "
        f"{grandchildren.outlived} (longest {grandchildren.longest:.2f}s, bound {grandchildren.bound:g}s), "
        f"leaked {len(grandchildren.leaked)}, excused {len(grandchildren.excused)} (no manager left on the host)",
        f"  runs that overlapped an earlier run of their job: {len(grandchildren.overlaps)}",
        f"  manager log errors: {dict(outcome.log_errors) or 'none'}",
        f"  time: chaos {outcome.chaos_seconds:.1f}s, quiesce {quiesce} after the last event, "
        f"wall {outcome.wall_seconds:.1f}s",
        f"  violations: {len(outcome.violations)}; folder {outcome.workspace.root}",
        f"  replay: {config.replay()}",
    ]


def run_chaos(config: Config, folder: Path | None = None, echo: Callable[[str], None] | None = None) -> Outcome:
    """Run the whole thing in `folder` (default: a new temporary folder) and judge it."""
    started = time.monotonic()
    workspace = Workspace.create(folder)
    rng = random.Random(config.seed)
    queue = Queue(workspace.queue)
    batches = plan_batches(config, plan_jobs(rng, config.jobs, workspace.scratch))
    events = plan_events(rng, config, len(batches))
    with open(workspace.logs / "chaos.events", "w") as log, _cluster(config, workspace, rng, log, echo) as cluster:
        chaos = Chaos(config, cluster, queue, batches, cluster.note)
        cluster.start_all()
        for kind in events:
            chaos.wait_between_events(rng.expovariate(1 / config.interval))
            chaos.perform(kind)
        chaos_end = time.monotonic()
        quiesce = _wait_quiesced(config, workspace, chaos, chaos_end)
        _stop(cluster, config)
        cluster.run_command(["run", str(workspace.queue), "--app", APP, "--burst"], "burst", timeout=60.0)
        kills = {process.pid: process.killed_at for process in cluster.finished if process.killed_at is not None}
        grandchildren = judge_grandchildren(workspace.scratch, config.options.outstay_bound, kills, cluster.lives())
    return Outcome(
        config=config,
        workspace=workspace,
        performed=chaos.performed,
        skipped=chaos.skipped,
        restarts=cluster.restarts,
        report=checker.check(
            workspace.queue, chaos.published, config.strict, {pid for pid, _ in chaos.killed_children}
        ),
        grandchildren=grandchildren,
        problems=cluster.problems,
        log_errors=log_findings(workspace.logs),
        chaos_seconds=chaos_end - started,
        quiesce_seconds=quiesce,
        wall_seconds=time.monotonic() - started,
    )


def _cluster(
    config: Config, workspace: Workspace, rng: random.Random, log: IO[str], echo: Callable[[str], None] | None
) -> Cluster:
    started = time.monotonic()

    def note(text: str) -> None:
        line = f"{time.monotonic() - started:8.3f} {text}"
        log.write(line + "\n")
        if echo is not None:
            echo(line)

    return Cluster(workspace.queue, workspace.logs, config.options, config.managers, rng, note)


def _stop(cluster: Cluster, config: Config) -> None:
    try:
        cluster.stop_all(timeout=config.options.drain_deadline)
    except TimeoutError as exc:
        cluster.problems.append(f"stopping the managers: {exc}")  # cleanup kills them


def _wait_quiesced(config: Config, workspace: Workspace, chaos: Chaos, since: float) -> float | None:
    """Seconds from the last chaos event until the queue quiesced; None if it did not in time."""
    total = len(chaos.published)
    try:
        wait_for(
            lambda: quiesced(workspace.queue, total), config.quiesce_timeout, "the queue quiesced", chaos.cluster.tend
        )
    except TimeoutError:
        chaos.cluster.problems.append(f"the queue did not quiesce within {config.quiesce_timeout:g}s")
        return None
    return time.monotonic() - since


# -- command line -------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.run", description=__doc__.split("\n\n")[1])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--managers", type=int, default=3)
    parser.add_argument("--seed", type=int, default=None, help="default: a fresh one, printed")
    parser.add_argument("--concurrency", type=int, default=4, help="children per manager")
    parser.add_argument("--interval", type=float, default=0.25, help="mean seconds between chaos events")
    parser.add_argument("--quiesce-timeout", type=float, default=240.0)
    parser.add_argument("--dir", type=Path, help="run in this (new or empty) folder and keep it")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder even when all is well")
    parser.add_argument("--strict", action="store_true", help="known issues count as violations")
    parser.add_argument("--verbose", "-v", action="store_true", help="echo chaos events and explained oddities")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "big")
    config = Config(
        jobs=args.jobs,
        managers=args.managers,
        seed=seed,
        interval=args.interval,
        quiesce_timeout=args.quiesce_timeout,
        strict=args.strict,
        options=ManagerOptions(concurrency=args.concurrency),
    )
    print(f"seed {seed}: {config.replay()}", flush=True)
    outcome = run_chaos(config, args.dir, echo=print if args.verbose else None)
    print(outcome.summary(verbose=args.verbose))
    if not outcome.violations and not args.keep and args.dir is None:
        shutil.rmtree(outcome.workspace.root, ignore_errors=True)
    return 1 if outcome.violations else 0


if __name__ == "__main__":
    sys.exit(main())
