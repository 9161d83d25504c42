"""SIGKILL at every step of every transition, then recover: no job is lost.

A child process performs one transition on a prepared queue and SIGKILLs
itself at a chosen point: a named `files.checkpoint`, or just before or just
after one of the renames the store makes (the child wraps `jobs.files.move`
to mark those; the rename itself is the real one). The parent then does what
a surviving manager would: a sweep past the lease that knows the child's
owner is dead, a sweep of `tmp/`, and claims and completes whatever is left.
After each step it checks, from the folder alone (`invariants.py`), that
every published job is in exactly one place (guarantees 1 and 2), that the
attempts counter never went below its value before the crash (guarantee 3:
attempts are counted before a run), and at the end that every job is done
or dead with a cause, and that its `events` tell its story whole and in order.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import jobs
from jobs import Call, Claim, JobOptions, Owner, Queue, State, WrongState, files, unknown_liveness
from jobs.job import ready_name
from jobs.lease import Liveness

from .conftest import Children, describe_status
from .invariants import all_attempts, check_invariants, entries, job_ids_on_disk, read_attempts

FUNCTION = "sample.work"
CHILD_LEASE = 3600.0  # long, so that a child's own sweeps never expire it: only its death does
FAR = 10 * 24 * 3600.0  # a `now` after every due time the tests use


# -- killing a child at a chosen point ------------------------------------------------


def rename_label(root: Path, target: Path) -> str:
    """What a rename to `target` does, by the folder it lands in."""
    parts = Path(target).relative_to(root).parts
    if parts[0] == State.CLAIMED.value and len(parts) == 2:
        return "reaping" if parts[1].startswith("reaping.") else "owner"
    return parts[0]  # ready, scheduled, claimed, done, dead, quarantine, tmp


def instrument_renames(root: Path) -> None:
    """In a child only: a checkpoint `renaming:LABEL` just before each rename the
    store makes, and `renamed:LABEL` just after it. The rename is the real one."""
    real_move = files.move

    def move(src: str, dst: str, **handles: int | None) -> None:
        folder = handles.get("dst_dir_fd")  # the store renames through its folder handles
        target = Path(dst) if folder is None else Path(os.readlink(f"/proc/self/fd/{folder}")) / dst
        label = rename_label(root, target)
        files.checkpoint(f"renaming:{label}")
        real_move(src, dst, **handles)
        files.checkpoint(f"renamed:{label}")

    files.move = move


class KillAt:
    """A checkpoint hook that SIGKILLs this process at the `nth` hit of `name`
    once armed (`name` None: the `nth` hit of any checkpoint)."""

    def __init__(
        self,
        name: str | None,
        nth: int = 1,
        on_kill: Callable[[str], None] | None = None,
    ) -> None:
        self.name, self.nth, self.on_kill = name, nth, on_kill
        self.armed = False
        self.hits = 0

    def __call__(self, name: str) -> None:
        if not self.armed or (self.name is not None and name != self.name):
            return
        self.hits += 1
        if self.hits == self.nth:
            if self.on_kill is not None:
                self.on_kill(name)
            os.kill(os.getpid(), signal.SIGKILL)


def parse_stop(stop: str) -> tuple[str, int]:
    """`claim:moved` or `renamed:ready#2` (the second hit) -> (name, nth)."""
    name, _, nth = stop.partition("#")
    return name, int(nth or 1)


def dead_owners(pids: set[int]) -> Liveness:
    """The liveness a same-host sweeper would report: these pids are dead, the rest unknown."""

    def is_alive(owner: Owner) -> bool | None:
        return False if owner.pid in pids else None

    return is_alive


# -- preparing a queue (in the parent) -------------------------------------------------


def publish(queue: Queue, published: list[str], **options: Any) -> str:
    job_id = queue.submit(Call(FUNCTION, (len(published),), options=JobOptions(**options)))
    published.append(job_id)
    return job_id


def write_result(claim: Claim) -> None:
    """What a successful run leaves in its attempt folder."""
    (claim.run_path / "result.json").write_text(json.dumps({"run": claim.run}) + "\n")


def with_bystanders(queue: Queue, published: list[str]) -> None:
    """A ready job and a scheduled one that the transition must leave alone."""
    publish(queue, published)
    publish(queue, published, delay=600.0)


def ready_target(max_attempts: int = 3) -> Callable[[Queue, list[str]], str]:
    def setup(queue: Queue, published: list[str]) -> str:
        with_bystanders(queue, published)
        return publish(queue, published, priority=10, max_attempts=max_attempts)  # claimed first

    return setup


def scheduled_target(delay: float) -> Callable[[Queue, list[str]], str]:
    def setup(queue: Queue, published: list[str]) -> str:
        with_bystanders(queue, published)
        return publish(queue, published, delay=delay)

    return setup


def finished_target(outcome: State) -> Callable[[Queue, list[str]], str]:
    """A target already in done/ or dead/, taken there by the parent's own owner."""

    def setup(queue: Queue, published: list[str]) -> str:
        target = ready_target()(queue, published)
        owner = Owner.new()
        queue.serving.register_owner(owner)
        claim = queue.serving.claim(owner.name)
        assert claim is not None
        assert claim.job_id == target
        if outcome is State.DONE:
            write_result(claim)
            queue.serving.complete(claim)
        else:
            queue.serving.fail(claim, {"message": "set up as dead"}, permanent=True)
        queue.serving.retire_owner(owner.name)
        return target

    return setup


def tmp_leftover(queue: Queue, published: list[str]) -> None:
    """A submission a dead submitter left half-way in tmp/ (never published)."""
    with_bystanders(queue, published)
    staging = queue.path / "tmp" / jobs.new_job_id()
    staging.mkdir()
    (staging / "job.json").write_text(json.dumps({"function": FUNCTION}))


# -- the transitions (in the child) ------------------------------------------------------


@dataclass
class Child:
    """What a transition runs with in the child: its queue, its owner, the target."""

    queue: Queue
    owner: Owner
    target: str | None
    arm: Callable[[], None]

    def claim_target(self, owner: str | None = None) -> Claim:
        claim = self.queue.serving.claim(owner or self.owner.name)
        assert claim is not None, f"claimed nothing instead of {self.target}"
        assert claim.job_id == self.target, f"claimed {claim.job_id} instead of {self.target}"
        return claim


def do_enqueue(**options: Any) -> Callable[[Child], None]:
    def act(child: Child) -> None:
        child.arm()
        child.queue.submit(Call(FUNCTION, ("new",), options=JobOptions(**options)))

    return act


def do_enqueue_after(child: Child) -> None:
    """Enqueue a job that depends on the target (its edges, then waiting/)."""
    child.arm()
    assert child.target is not None
    child.queue.submit(Call(FUNCTION, ("after",), options=JobOptions(depends_on=[child.target])))


def with_a_dependent(dies: bool = False) -> Callable[[Queue, list[str]], str | None]:
    """A ready target, and a job waiting for it (which dies with it if `dies`)."""

    def setup(queue: Queue, published: list[str]) -> str | None:
        target = ready_target()(queue, published)
        assert target is not None
        published.append(queue.submit(Call(FUNCTION, ("after",), options=JobOptions(depends_on=[target]))))
        return target

    return setup


def dependent_in_ready(queue: Queue, published: list[str]) -> str:
    """A job that depends on a ready parent, written into ready/ before the parent ended (by
    hand, say, or by an older forkvisor), without its edge: its claim sends it to wait."""
    parent = ready_target()(queue, published)
    target = queue.submit(Call(FUNCTION, ("after",), options=JobOptions(depends_on=[parent], priority=20)))
    published.append(target)
    os.rename(queue.path / "waiting" / target, queue.path / "ready" / ready_name(target, 20))
    os.unlink(queue.path / "edges" / parent / target)
    return target


def do_finish_and_settle(ok: bool) -> Callable[[Child], None]:
    """End the target as its manager would (done, or dead), then settle its dependents."""

    def act(child: Child) -> None:
        claim = child.claim_target()
        child.arm()
        if ok:
            write_result(claim)
            child.queue.serving.complete(claim)
        else:
            child.queue.serving.fail(claim, {"message": "broken"}, permanent=True)
        child.queue.serving.settle_dependents(claim.job_id)

    return act


def do_enqueue_many(child: Child) -> None:
    child.arm()
    child.queue.enqueue_many([Call(FUNCTION, (i,)) for i in range(3)])


def do_claim(child: Child) -> None:
    child.arm()
    child.claim_target()


def do_claim_staged(child: Child) -> None:
    """A durable manager's claim: the count staged, then committed (its child waits meanwhile)."""
    child.arm()
    claim = child.queue.serving.claim(child.owner.name, staged=True)
    assert claim is not None, f"claimed nothing instead of {child.target}"
    assert claim.job_id == child.target, f"claimed {claim.job_id} instead of {child.target}"
    assert child.queue.serving.commit_counts([claim]) == [None]


def do_claim_to_wait(child: Child) -> None:
    """Claim the target, which goes to wait for its parent; the parent is claimed next."""
    child.arm()
    claim = child.queue.serving.claim(child.owner.name)
    assert claim is not None, "the parent was not claimed"
    assert claim.job_id != child.target, "the target was not sent to wait"


def do_complete(child: Child) -> None:
    claim = child.claim_target()
    write_result(claim)
    child.arm()
    child.queue.serving.complete(claim)


def do_fail(delay: float = 0.0, permanent: bool = False) -> Callable[[Child], None]:
    def act(child: Child) -> None:
        claim = child.claim_target()
        child.arm()
        child.queue.serving.fail(claim, {"message": "the run failed"}, delay=delay, permanent=permanent)

    return act


def do_release(child: Child) -> None:
    claim = child.claim_target()
    child.arm()
    child.queue.serving.release(claim)


def do_reap(child: Child) -> None:
    """This child's sweeper reaps a second owner of its own, which it declares dead."""
    victim = Owner.new(lease=CHILD_LEASE)
    child.queue.serving.register_owner(victim)
    child.claim_target(victim.name)
    child.arm()
    child.queue.serving.sweep(time.time(), lambda owner: owner.name != victim.name)


def do_promote(child: Child) -> None:
    child.arm()
    child.queue.serving.sweep(time.time() + 60, unknown_liveness)


def do_cancel(child: Child) -> None:
    child.arm()
    assert child.target is not None
    child.queue.cancel(child.target)


def do_retry(child: Child) -> None:
    child.arm()
    assert child.target is not None
    child.queue.retry(child.target)


def do_purge(child: Child) -> None:
    child.arm()
    child.queue.purge(State.DONE, older_than=0, now=time.time() + 60)


def do_clear_tmp(child: Child) -> None:
    child.arm()
    child.queue.serving.sweep(time.time() + 60, unknown_liveness, tmp_age=0)


@dataclass(frozen=True)
class Transition:
    setup: Callable[[Queue, list[str]], str | None]
    act: Callable[[Child], None]
    floor: Callable[[int], int] = lambda before: before  # the target's attempts may not go below this


TRANSITIONS: dict[str, Transition] = {
    "enqueue": Transition(with_bystanders, do_enqueue(priority=5)),
    "enqueue-later": Transition(with_bystanders, do_enqueue(delay=300.0)),
    "enqueue-keyed": Transition(with_bystanders, do_enqueue(key="daily-report")),
    "enqueue-many": Transition(with_bystanders, do_enqueue_many),
    "enqueue-after": Transition(ready_target(), do_enqueue_after),
    "complete-and-settle": Transition(with_a_dependent(), do_finish_and_settle(ok=True)),
    "bury-and-settle": Transition(with_a_dependent(dies=True), do_finish_and_settle(ok=False)),
    "claim": Transition(ready_target(), do_claim),
    "claim-last-attempt": Transition(ready_target(max_attempts=1), do_claim),
    "claim-staged": Transition(ready_target(), do_claim_staged),
    "claim-staged-last-attempt": Transition(ready_target(max_attempts=1), do_claim_staged),
    "claim-to-wait": Transition(dependent_in_ready, do_claim_to_wait),
    "complete": Transition(ready_target(), do_complete),
    "fail-retry-later": Transition(ready_target(), do_fail(delay=30.0)),
    "fail-retry-now": Transition(ready_target(), do_fail(delay=0.0)),
    "fail-last-attempt": Transition(ready_target(max_attempts=1), do_fail()),
    "fail-permanent": Transition(ready_target(), do_fail(permanent=True)),
    "release": Transition(ready_target(), do_release, floor=lambda before: before - 1),
    "reap": Transition(ready_target(), do_reap),
    "reap-last-attempt": Transition(ready_target(max_attempts=1), do_reap),
    "promote": Transition(scheduled_target(delay=5.0), do_promote),
    "cancel-ready": Transition(ready_target(), do_cancel),
    "cancel-scheduled": Transition(scheduled_target(delay=300.0), do_cancel),
    "retry": Transition(finished_target(State.DEAD), do_retry, floor=lambda before: 0),
    "purge": Transition(finished_target(State.DONE), do_purge),
    "clear-tmp": Transition(tmp_leftover, do_clear_tmp),
}


@dataclass(frozen=True)
class Expect:
    """What the crash leaves: how many new jobs became visible, how many entries
    stay in tmp/, and where the target (or the new jobs) end: `done`,
    `dead:REASON`, `purged`, or `none` (there is no job to follow)."""

    end: str = "done"
    published: int = 0
    tmp: int = 0


CASES = [
    ("enqueue", "enqueue:staged", Expect(tmp=1)),
    ("enqueue", "renamed:ready", Expect(published=1)),
    ("enqueue-later", "enqueue:staged", Expect(tmp=1)),
    ("enqueue-keyed", "enqueue:key-reserved", Expect(tmp=1)),  # the key names a job in tmp/ until it is cleared
    ("enqueue-keyed", "renamed:ready", Expect(published=1)),
    ("enqueue-later", "renamed:scheduled", Expect(published=1)),
    ("enqueue-after", "enqueue:edges-written", Expect(tmp=1)),  # an edge to a job in tmp/: dropped when settled
    ("enqueue-after", "enqueue:waiting", Expect(published=1)),  # waiting: the target's end releases it
    ("complete-and-settle", "renamed:done", Expect()),  # done, its dependent not settled: the sweep does it
    ("complete-and-settle", "settle:settled", Expect()),  # settled, its edge left: removed by the next settler
    ("bury-and-settle", "renamed:dead", Expect("dead:cannot be completed")),
    ("bury-and-settle", "settle:settled", Expect("dead:cannot be completed")),
    ("enqueue-many", "enqueue:staged#2", Expect(tmp=2)),
    ("enqueue-many", "renamed:ready#1", Expect(published=1, tmp=2)),
    ("enqueue-many", "renamed:ready#3", Expect(published=3)),
    ("claim", "renamed:claimed", Expect()),
    ("claim", "claim:moved", Expect()),
    ("claim", "claim:judged", Expect()),
    ("claim", "claim:counted", Expect()),
    ("claim", "claim:attempt-created", Expect()),
    ("claim-last-attempt", "claim:moved", Expect()),
    ("claim-last-attempt", "claim:counted", Expect("dead:attempts exhausted")),
    ("claim-last-attempt", "claim:attempt-created", Expect("dead:attempts exhausted")),
    ("claim-staged", "claim:counted", Expect()),  # staged only: not counted, it runs as if never claimed
    ("claim-staged", "count:synced", Expect()),
    ("claim-staged", "count:renamed", Expect()),
    ("claim-staged-last-attempt", "count:synced", Expect()),  # the one attempt not used: it still runs
    ("claim-staged-last-attempt", "count:renamed", Expect("dead:attempts exhausted")),
    ("claim-staged", "claim:attempt-created", Expect()),  # counted, its run folder made at the commit
    ("claim-staged-last-attempt", "claim:attempt-created", Expect("dead:attempts exhausted")),
    ("claim-to-wait", "claim:edges-written", Expect()),  # still claimed: its owner's reaper gives it back
    ("claim-to-wait", "claim:waiting", Expect()),  # waiting, not settled: the parent's end releases it
    ("claim-to-wait", "renamed:waiting", Expect()),
    ("complete", "complete:opened", Expect()),
    ("complete", "complete:result-checked", Expect()),
    ("complete", "complete:result-linked", Expect()),
    ("complete", "renamed:done", Expect()),
    ("fail-retry-later", "renamed:scheduled", Expect()),
    ("fail-retry-now", "renamed:ready", Expect()),
    ("fail-last-attempt", "renaming:dead", Expect("dead:attempts exhausted")),
    ("fail-last-attempt", "renamed:dead", Expect("dead:attempts exhausted")),
    ("fail-permanent", "renaming:dead", Expect()),  # not recorded yet: it runs again (at least once)
    ("fail-permanent", "renamed:dead", Expect("dead:cannot be completed")),
    ("release", "release:uncounted", Expect()),
    ("release", "renamed:ready", Expect()),
    ("reap", "reap:leftovers-ended", Expect()),  # its leftovers ended, not yet fenced: a later sweep fences
    ("reap", "renamed:reaping", Expect()),
    ("reap", "reap:fenced", Expect()),
    ("reap", "renamed:ready", Expect()),
    ("reap-last-attempt", "reap:fenced", Expect("dead:attempts exhausted")),
    ("reap-last-attempt", "renaming:dead", Expect("dead:attempts exhausted")),
    ("reap-last-attempt", "renamed:dead", Expect("dead:attempts exhausted")),
    ("promote", "renamed:ready", Expect()),
    ("cancel-ready", "renamed:dead", Expect("dead:cancelled")),
    ("cancel-scheduled", "renamed:dead", Expect("dead:cancelled")),
    ("retry", "renaming:ready", Expect("dead:cannot be completed")),
    ("retry", "renamed:ready", Expect()),
    ("purge", "renaming:tmp", Expect()),
    ("purge", "renamed:tmp", Expect("purged", tmp=1)),
    ("clear-tmp", "renamed:quarantine", Expect("none")),
    ("clear-tmp", "quarantine:moved", Expect("none")),  # moved, its .why note not written yet
]


def case_params() -> list[object]:
    params = []
    for transition, stop, expect in CASES:
        params.append(pytest.param(transition, stop, expect, id=f"{transition}@{stop}"))
    return params


# -- recovering (in the parent) ------------------------------------------------------------


def purged_ids(queue_path: Path) -> set[str]:
    try:
        lines = (queue_path / "purged.log").read_text().splitlines()
    except FileNotFoundError:
        return set()
    return {line.split()[-1] for line in lines if line.strip()}


def drain(queue: Queue) -> None:
    """Promote everything scheduled, then claim and complete everything ready,
    as a healthy manager would; fail if the queue does not empty."""
    now = time.time()
    for _ in range(5):
        queue.serving.sweep(now + FAR, unknown_liveness)  # no owner is registered now: this only promotes
        owner = Owner.new()
        queue.serving.register_owner(owner)
        while (claim := queue.serving.claim(owner.name, now)) is not None:
            write_result(claim)
            queue.serving.complete(claim, now)
        queue.serving.retire_owner(owner.name)
        counts = queue.counts()
        if counts["ready"] == counts["scheduled"] == counts["waiting"] == counts["claimed"] == 0:
            return
    pytest.fail(f"the queue did not drain: {counts}")


def latest_attempt(job_dir: Path) -> Path | None:
    numbers = [int(m[1]) for name in entries(job_dir) if (m := re.fullmatch(r"attempt-(\d+)", name))]
    return job_dir / f"attempt-{max(numbers)}" if numbers else None


def check_finished(places: dict[str, tuple[State, Path]]) -> None:
    """Every job is done (with the winning run's result) or dead (with a cause)."""
    for job_id, (state, path) in sorted(places.items()):
        assert state in (State.DONE, State.DEAD), f"job {job_id} is still {state.value} after draining"
        if state is State.DEAD:
            assert (path / "error.json").is_file(), f"job {job_id} is dead without error.json (no cause)"
            cause = json.loads((path / "error.json").read_text())
            assert cause.get("reason"), f"job {job_id} is dead with a cause that has no reason: {cause}"
        else:
            run = latest_attempt(path)
            assert run is not None, f"job {job_id} is done but never ran"
            assert (path / "result.json").is_file(), f"job {job_id} is done without result.json"
            assert (path / "result.json").samefile(run / "result.json"), (
                f"job {job_id}: done/{job_id}/result.json is not the result of its last run {run.name}"
            )


EVENT_LINE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z \S.*")
RETRY_EVENT = re.compile(r"(ready|waiting): retried by an operator, attempts reset")  # its move may be cut
RUN_END_EVENT = re.compile(  # how a claimed run ended, each way (`jobs.claim`, `jobs.sweep`)
    r"(done: |failed: |dead: |ready: claim reverted"
    r"|.*: run \d+ stopped, attempt not counted|run \d+ by .* after its claim was lost)"
)
CLAIMED_EVENT = re.compile(r"claimed by \S+: attempt \d+/\d+ \(run (\d+)\)")


def check_events(places: dict[str, tuple[State, Path]]) -> None:
    """Each finished job's `events` tells its story whole and in order, whatever the crash
    cut short: every line whole, `enqueued` first, each run claimed once and in order and its
    end told before the next is claimed, and
    its end last (a done job's names the run whose result it holds, claimed before it). After
    a dead job's end only an operator's retry may come, whose move the crash cut (the line is
    written before the move, which may not happen)."""
    for job_id, (state, path) in sorted(places.items()):
        lines = (path / "events").read_text().splitlines()
        torn = [line for line in lines if not EVENT_LINE.fullmatch(line)]
        assert lines, f"job {job_id} has no events"
        assert not torn, f"job {job_id}: events lines that are not `TIME what`: {torn}"
        story = [line.split(" ", 1)[1] for line in lines]
        assert story[0] == "enqueued", f"job {job_id}: its events begin with {story[0]!r}"
        runs = [int(found[1]) for text in story if (found := CLAIMED_EVENT.fullmatch(text))]
        assert runs == sorted(set(runs)), f"job {job_id}: runs claimed out of order or twice: {runs}"
        claims = [index for index, text in enumerate(story) if CLAIMED_EVENT.fullmatch(text)]
        for earlier, later in itertools.pairwise(claims):
            told = [text for text in story[earlier + 1 : later] if RUN_END_EVENT.match(text)]
            assert told, f"job {job_id}: nothing says how the run claimed in {story[earlier]!r} ended: {story}"
        ends = [index for index, text in enumerate(story) if text.startswith(("done:", "dead:"))]
        assert ends, f"job {job_id} is {state.value}; no event says where it ended: {story}"
        assert story[ends[-1]].startswith(f"{state.value}:"), f"job {job_id} is {state.value}: {story}"
        cut_short = story[ends[-1] + 1 :]  # a line is written just before its move: a crash may cut the move
        assert not cut_short or (state is State.DEAD and all(map(RETRY_EVENT.fullmatch, cut_short))), (
            f"job {job_id} is {state.value}; after its end come {cut_short}"
        )
        if state is State.DONE:
            run = latest_attempt(path)
            assert run is not None, f"job {job_id} is done and never ran"
            number = int(run.name.removeprefix("attempt-"))
            assert f"(run {number})" in story[-1], f"job {job_id}: its end {story[-1]!r} is not its last run's"
            assert number in runs, f"job {job_id}: its done run {number} was never claimed"


def check_floors(places: dict[str, tuple[State, Path]], floors: dict[str, int], when: str) -> None:
    below = {
        job_id: (read_attempts(places[job_id][1]), floor)
        for job_id, floor in floors.items()
        if job_id in places and read_attempts(places[job_id][1]) < floor
    }
    assert not below, f"attempts went below their value before the crash ({when}): id -> (now, floor) {below}"


def expected_ids(queue_path: Path, published: list[str]) -> list[str]:
    """Published jobs that must be on disk: all but the purged, except that a purge
    records its line before removing the job, so a recorded one may still be there."""
    purged, on_disk = purged_ids(queue_path), job_ids_on_disk(queue_path)
    return sorted(job_id for job_id in set(published) if job_id not in purged or job_id in on_disk)


def at_the_crash(queue_path: Path, published: list[str], floors: dict[str, int]) -> dict[str, int]:
    """Conservation holds in the state the crash left, before anyone recovers; the
    counters found there are floors too (no recovery step may lower them)."""
    places = check_invariants(queue_path, expected_ids(queue_path, published))
    found = all_attempts(places)
    return {job_id: max(floors.get(job_id, 0), n) for job_id, n in found.items()}


def recover(queue: Queue, dead_pid: int, published: list[str]) -> dict[str, tuple[State, Path]]:
    """The sweep a surviving manager runs: past the lease, knowing the child is dead.
    Return where every published job now is (none may still be claimed)."""
    queue.serving.sweep(time.time() + CHILD_LEASE + 1, dead_owners({dead_pid}))
    live = expected_ids(queue.path, published)
    places = check_invariants(queue.path, live)
    claimed = {job_id: str(path) for job_id, (state, path) in places.items() if state is State.CLAIMED}
    assert not claimed, f"jobs still claimed after the dead owner was reaped: {claimed}"
    assert entries(queue.path / "claimed") == [], "the dead owner's folder is still in claimed/"
    return places


def clear_tmp(queue: Queue, published: list[str]) -> None:
    """Abandoned submissions are quarantined with a note (never deleted, never published)."""
    left = [name for name in entries(queue.path / "tmp") if not name.startswith(".purge.")]
    quarantined = set(entries(queue.path / "quarantine"))
    ready = entries(queue.path / "ready")
    queue.serving.sweep(time.time() + CHILD_LEASE + 1, unknown_liveness, tmp_age=0)
    assert entries(queue.path / "tmp") == [], "tmp/ still holds entries after a sweep with tmp_age=0"
    new = sorted(set(entries(queue.path / "quarantine")) - quarantined)
    notes = [name for name in new if name.endswith(".why")]
    assert len(notes) == len(left) == len(new) - len(notes), f"tmp/ held {left}; quarantine gained {new}"
    assert entries(queue.path / "ready") == ready, "clearing tmp/ published something"
    check_invariants(queue.path, expected_ids(queue.path, published))


@pytest.mark.parametrize(("transition", "stop", "expect"), case_params())
def test_sigkill_during_a_transition_loses_no_job(
    tmp_path: Path, children: Children, transition: str, stop: str, expect: Expect
) -> None:
    plan = TRANSITIONS[transition]
    queue_path = tmp_path / "queue"
    queue = Queue(queue_path)
    published: list[str] = []
    target = plan.setup(queue, published)
    on_disk_before = job_ids_on_disk(queue_path)
    baseline_file = tmp_path / "attempts-before.json"
    name, nth = parse_stop(stop)

    def body() -> None:
        child_queue = Queue(queue_path, create=False)
        owner = Owner.new(lease=CHILD_LEASE)
        child_queue.serving.register_owner(owner)
        instrument_renames(child_queue.path)
        killer = KillAt(name, nth)
        files.checkpoint_hook = killer

        def arm() -> None:
            baseline_file.write_text(json.dumps(all_attempts(check_invariants(queue_path, published))))
            killer.armed = True

        plan.act(Child(child_queue, owner, target, arm))

    pid = children.fork(body)
    children.wait_killed(pid, f"{stop} of {transition}")
    before = json.loads(baseline_file.read_text())
    floors = {job_id: plan.floor(n) if job_id == target else n for job_id, n in before.items()}

    appeared = job_ids_on_disk(queue_path) - on_disk_before
    assert len(appeared) == expect.published, f"jobs that became visible: {sorted(appeared)}"
    published += sorted(appeared)  # published by the rename, though enqueue never returned their ids
    tmp_left = entries(queue_path / "tmp")
    assert len(tmp_left) == expect.tmp, f"tmp/ holds {tmp_left}"
    floors = at_the_crash(queue_path, published, floors)

    places = recover(queue, pid, published)
    check_floors(places, floors, "after the recovery sweep")
    clear_tmp(queue, published)
    drain(queue)
    places = check_invariants(queue_path, expected_ids(queue_path, published))
    check_finished(places)
    check_events(places)
    check_floors(places, floors, "after draining")

    if expect.end == "purged":
        assert target in purged_ids(queue_path), f"job {target} is neither in a state folder nor in purged.log"
    elif expect.end == "none":  # the crash was in the sweep that quarantines an abandoned submission
        kept = [name for name in entries(queue_path / "quarantine") if name.startswith("tmp.")]
        assert kept, "the abandoned submission was deleted instead of quarantined"  # (its .why note may be lost)
    else:
        want_state, _, reason = expect.end.partition(":")
        for job_id in [target] if target else sorted(appeared):
            state, path = places[job_id]
            assert state.value == want_state, f"job {job_id} ended {state.value}, expected {expect.end}"
            if reason:
                assert json.loads((path / "error.json").read_text())["reason"] == reason


# Checkpoints whose crash cases need a recovery this table does not model, each with the
# test that kills a process there and checks the invariants itself.
COVERED_ELSEWHERE = {
    "tick:taken": "tests/jobs/test_ticks.py: the sweep publishes a tick's job its firer left in tmp/",
}


def test_every_named_checkpoint_has_a_crash_case() -> None:
    named = set()
    for source in Path(jobs.__file__).parent.glob("*.py"):
        named |= set(re.findall(r"files\.checkpoint\(\"([^\"]+)\"\)", source.read_text()))
    assert named, "found no files.checkpoint(...) in jobs/"
    covered = {parse_stop(stop)[0] for _, stop, _ in CASES} | set(COVERED_ELSEWHERE)
    assert named <= covered, f"checkpoints with no crash case: {sorted(named - covered)}"


def test_a_lost_completion_never_leaves_its_result_for_a_later_run(tmp_path: Path, children: Children) -> None:
    queue_path = tmp_path / "queue"
    queue = Queue(queue_path)
    published: list[str] = []
    target = ready_target()(queue, published)

    def body() -> None:
        child_queue = Queue(queue_path, create=False)
        owner = Owner.new(lease=CHILD_LEASE)
        child_queue.serving.register_owner(owner)
        claim = child_queue.serving.claim(owner.name)
        assert claim is not None
        assert claim.job_id == target
        write_result(claim)
        killer = KillAt("complete:result-linked")
        killer.armed = True
        files.checkpoint_hook = killer
        child_queue.serving.complete(claim)

    pid = children.fork(body)
    children.wait_killed(pid, "complete:result-linked")
    recover(queue, pid, published)
    owner = Owner.new()
    queue.serving.register_owner(owner)
    claim = queue.serving.claim(owner.name)
    assert claim is not None
    assert (claim.job_id, claim.run) == (target, 2)
    queue.serving.complete(claim)  # run 2 succeeded and wrote no result.json
    done = queue.job(target)
    assert done.state is State.DONE
    assert not (done.path / "result.json").exists(), (
        f"done/{target}/result.json is run 1's result {done.result!r}; run 1 lost its claim, run 2 completed"
    )


def test_two_sweepers_racing_on_one_dead_owner_both_finish(tmp_path: Path, children: Children) -> None:
    queue_path = tmp_path / "queue"
    queue = Queue(queue_path)
    published: list[str] = []
    target = ready_target()(queue, published)
    victim = Owner.new(lease=CHILD_LEASE)
    queue.serving.register_owner(victim)
    claim = queue.serving.claim(victim.name)
    assert claim is not None
    assert claim.job_id == target
    result_file = tmp_path / "child-sweep.json"

    def body() -> None:
        child_queue = Queue(queue_path, create=False)
        files.checkpoint_hook = lambda name: os.kill(os.getpid(), signal.SIGSTOP) if name == "reap:fenced" else None
        swept = child_queue.serving.sweep(time.time(), lambda owner: owner.name != victim.name)
        result_file.write_text(json.dumps(swept))

    pid = children.fork(body)
    children.wait_stopped(pid)  # the child's sweep has fenced the victim and is paused
    assert queue.serving.sweep(time.time(), lambda owner: owner.name != victim.name)["reverted"] == 1
    os.kill(pid, signal.SIGCONT)
    status = children.wait(pid)
    check_invariants(queue_path, published)
    outcome = describe_status(status)
    assert outcome == "exited with code 0", f"the paused sweeper {outcome}:\n{children.error_of(pid)}"
    assert json.loads(result_file.read_text())["reverted"] == 0, "both sweepers say they moved the job"


def stop_before(function: Callable[..., object], caller: str) -> None:
    """In a child only: SIGSTOP this process just before `caller` calls the C
    function `function` (a profile hook watching calls; nothing is replaced)."""

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "c_call" and arg is function and frame.f_code.co_name == caller:
            sys.setprofile(None)
            os.kill(os.getpid(), signal.SIGSTOP)

    sys.setprofile(profile)


def stop_on_entering(function: str) -> None:
    """In a child only: SIGSTOP this process as the Python function named `function` is entered."""

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_name == function:
            sys.setprofile(None)
            os.kill(os.getpid(), signal.SIGSTOP)

    sys.setprofile(profile)


def test_a_complete_that_loses_its_claim_half_way_raises_claim_lost(tmp_path: Path, children: Children) -> None:
    queue_path = tmp_path / "queue"
    queue = Queue(queue_path)
    published: list[str] = []
    target = ready_target()(queue, published)
    raised = tmp_path / "raised.txt"

    def body() -> None:
        child_queue = Queue(queue_path, create=False)
        owner = Owner.new(lease=CHILD_LEASE)
        child_queue.serving.register_owner(owner)
        claim = child_queue.serving.claim(owner.name)
        assert claim is not None
        write_result(claim)
        stop_before(os.replace, "_replace_within")
        try:
            child_queue.serving.complete(claim)
        except Exception as exc:
            raised.write_text(type(exc).__name__)
        else:
            raised.write_text("nothing")

    pid = children.fork(body)
    children.wait_stopped(pid)  # result.json's staging link is made; the rename over result.json is not
    assert queue.serving.sweep(time.time() + CHILD_LEASE + 1, dead_owners({pid}))["reverted"] == 1
    os.kill(pid, signal.SIGCONT)
    children.wait_ok(pid)
    places = check_invariants(queue_path, published)
    assert places[target][0] is State.READY
    assert raised.read_text() == "ClaimLost", f"complete() of a reaped claim raised {raised.read_text()}"


def test_a_sweep_survives_an_owner_retiring_under_it(tmp_path: Path, children: Children) -> None:
    queue_path = tmp_path / "queue"
    queue = Queue(queue_path)
    published: list[str] = []
    ready_target()(queue, published)
    leaving = Owner.new()
    queue.serving.register_owner(leaving)
    result_file = tmp_path / "child-sweep.json"

    def body() -> None:
        child_queue = Queue(queue_path, create=False)
        stop_on_entering("_why_gone")
        result_file.write_text(json.dumps(child_queue.serving.sweep(time.time(), unknown_liveness)))

    pid = children.fork(body)
    children.wait_stopped(pid)  # the sweep listed the owner folders and is about to read leaving's owner file
    queue.serving.retire_owner(leaving.name)
    os.kill(pid, signal.SIGCONT)
    status = children.wait(pid)
    check_invariants(queue_path, published)
    outcome = describe_status(status)
    assert outcome == "exited with code 0", f"the sweep {outcome}:\n{children.error_of(pid)}"


# -- SIGKILL at random points of a mixed workload ------------------------------------------------

ROUNDS = 60
MAX_STEPS = 2000
WORKLOAD_OPS = (
    *("enqueue", "enqueue", "enqueue_many"),
    *("claim", "claim", "claim_spare", "complete", "complete", "fail", "release"),
    *("cancel", "retry", "sweep", "reap_spare"),
)


def workload(
    queue_path: Path, journal: Path, known: list[str], seed: int, stop_at: int, durable: bool
) -> Callable[[], None]:
    """A child running random enqueue/claim/complete/fail/release/cancel/retry/sweep
    steps, SIGKILLed at the `stop_at`-th checkpoint it passes (named or rename)."""

    def body() -> None:
        rng = random.Random(seed)
        queue = Queue(queue_path, create=False, durable=durable)
        owner = Owner.new(lease=CHILD_LEASE)
        spare = Owner.new(lease=CHILD_LEASE)  # an owner this child abandons to its own sweeper
        queue.serving.register_owner(owner)
        queue.serving.register_owner(spare)
        ids = list(known)
        held: list[Claim] = []
        spare_held: list[Claim] = []

        def log(line: str) -> None:
            with open(journal, "a") as file:
                file.write(line + "\n")

        op = ""

        instrument_renames(queue.path)
        killer = KillAt(None, stop_at, on_kill=lambda name: log(f"killed at {name}"))
        killer.armed = True
        files.checkpoint_hook = killer
        clock = time.time()
        for _ in range(MAX_STEPS):
            clock += 1.0
            op = rng.choice(WORKLOAD_OPS)
            log(f"op {op}")
            if op == "enqueue":
                options = JobOptions(
                    priority=rng.randint(-2, 2), delay=rng.choice([None, None, 3.0]), max_attempts=rng.randint(1, 3)
                )
                ids.append(queue.submit(Call(FUNCTION, (seed,), options=options), now=clock))
                log(f"published {ids[-1]}")
            elif op == "enqueue_many":
                batch = queue.enqueue_many([Call(FUNCTION, (seed, i)) for i in range(rng.randint(2, 3))], now=clock)
                ids += batch
                log("published " + " ".join(batch))
            elif op in ("claim", "claim_spare"):
                holder, into = (owner, held) if op == "claim" else (spare, spare_held)
                if (claim := queue.serving.claim(holder.name, clock)) is not None:
                    into.append(claim)
            elif op == "reap_spare":
                queue.serving.sweep(clock, lambda found, dead=spare.name: found.name != dead)  # says spare is dead
                spare_held.clear()
                spare = Owner.new(lease=CHILD_LEASE)
                queue.serving.register_owner(spare)
            elif op == "sweep":
                queue.serving.sweep(clock, unknown_liveness)  # promotes due retries; nobody's lease is over
            elif op in ("cancel", "retry") and ids:
                job_id = rng.choice(ids)
                log(f"{op} {job_id}")
                try:
                    queue.cancel(job_id, clock) if op == "cancel" else queue.retry(job_id, clock)
                except WrongState:
                    pass
            elif held and op in ("complete", "fail", "release"):
                claim = held.pop(rng.randrange(len(held)))
                if op == "complete":
                    write_result(claim)
                    queue.serving.complete(claim, clock)
                elif op == "fail":
                    queue.serving.fail(
                        claim, {"message": "boom"}, clock, delay=rng.choice([0.0, 3.0]), permanent=rng.random() < 0.2
                    )
                else:
                    queue.serving.release(claim, clock)
        log("finished without reaching the checkpoint")

    return body


def test_sigkill_at_random_points_of_a_mixed_workload_loses_no_job(tmp_path: Path, children: Children) -> None:
    rng = random.Random(20240607)
    queue_path = tmp_path / "queue"
    queue = Queue(queue_path, durable=False)
    published: list[str] = []
    for round_number in range(ROUNDS):
        places = check_invariants(queue_path, published)
        floors = all_attempts(places)
        done_before = {job_id for job_id, (state, _) in places.items() if state is State.DONE}
        journal = tmp_path / f"journal-{round_number}.txt"
        stop_at = rng.randint(1, 120)
        pid = children.fork(
            workload(queue_path, journal, published, rng.randrange(1 << 30), stop_at, rng.random() < 0.3)
        )
        children.wait_killed(pid, f"checkpoint hit {stop_at} of round {round_number}")

        lines = journal.read_text().splitlines()
        context = f"round {round_number}, seed-run journal tail: {lines[-4:]}"
        announced = [job_id for line in lines if line.startswith("published ") for job_id in line.split()[1:]]
        retried = {line.split()[1] for line in lines if line.startswith("retry ")}
        last_op = [line for line in lines if line.startswith("op ")][-1]
        appeared = job_ids_on_disk(queue_path) - set(published) - set(announced)
        if appeared:
            assert last_op in ("op enqueue", "op enqueue_many"), f"unknown jobs {sorted(appeared)}; {context}"
            assert len(appeared) <= 3, context
        published += announced + sorted(appeared)
        floors = {job_id: 0 if job_id in retried else n for job_id, n in floors.items()}
        floors = at_the_crash(queue_path, published, floors)

        places = recover(queue, pid, published)
        check_floors(places, floors, context)
        still_done = {job_id for job_id, (state, _) in places.items() if state is State.DONE}
        assert done_before <= still_done, f"jobs left done/: {sorted(done_before - still_done)}; {context}"
        clear_tmp(queue, published)
        drain(queue)
        places = check_invariants(queue_path, published)
        check_finished(places)
        check_floors(places, floors, context)


@pytest.mark.parametrize(
    ("story", "found"),
    [
        (["enqueued", "claimed by m: attempt 1/3 (run 1)", "done: attempt 1 (run 1) succeeded"], None),
        (["claimed by m: attempt 1/3 (run 1)", "done: attempt 1 (run 1) succeeded"], "begin with"),
        (["enqueued", "claimed by m: attempt 1/3 (run 1)", "ready: claim reverted, x"], "no event says"),
        (
            ["enqueued", "claimed by m: attempt 2/3 (run 2)", "claimed by m: attempt 1/3 (run 1)", "done: x (run 1)"],
            "order",
        ),
        (["enqueued", "claimed by m: attempt 1/3 (run 1)", "done: x (run 1)", "cancel requested"], "after its end"),
        (["enqueued", "done: attempt 1 (run 1) succeeded"], "never claimed"),
    ],
)
def test_the_events_check_fails_a_story_that_is_not_whole(tmp_path: Path, story: list[str], found: str | None) -> None:
    (tmp_path / "attempt-1").mkdir()
    stamp = "2026-11-27T06:00:00.000000Z"
    (tmp_path / "events").write_text("".join(f"{stamp} {text}\n" for text in story))
    if found is None:
        check_events({"job": (State.DONE, tmp_path)})
    else:
        with pytest.raises(AssertionError, match=found):
            check_events({"job": (State.DONE, tmp_path)})
