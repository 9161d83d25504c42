"""The jobs' children: the one place that starts, stops, kills and reaps them.

A job is stopped as a whole tree: SIGTERM to its process group and to every
descendant psutil can find (some leave the group with setsid), then SIGKILL after
the grace period. Descendants are remembered as they are found, so the SIGKILL
still reaches those the child's exit orphaned; when a child exits, what it left
in its process group goes too. Forks that fail (the host is out of processes or
memory) make the next ones wait a growing while.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Collection, Iterator

from jobs import Claim, ClaimState
from supervisor import containment, forking, limits
from supervisor.containment import CgroupRun
from supervisor.forking import Gate
from supervisor.pacing import Backoff
from supervisor.running import UNSTOPPED, Life, Running, Stop

log = logging.getLogger(__name__)
FORK_BACKOFF_MIN, FORK_BACKOFF_MAX = 0.1, 10.0


def run_mark(running: Running) -> str:
    """The mark every process of the run bears (`containment`)."""
    claim = running.claim
    return containment.run_mark(claim.owner, claim.job_id, claim.run)


def signal_strays(
    exclude: set[int], chosen: Callable[[set[str]], bool], signum: signal.Signals
) -> list[tuple[int, set[str]]]:
    """Signal each adopted orphan (not in `exclude`) whose runs' marks `chosen` picks, through
    a pidfd opened before its marks were read; (pid, marks) of each one signalled."""
    signalled = []
    for pid, pidfd, marks in containment.strays(exclude):
        try:
            if chosen(marks):
                signal.pidfd_send_signal(pidfd, signum)
                signalled.append((pid, marks))
        except ProcessLookupError:
            pass  # gone meanwhile
        finally:
            os.close(pidfd)
    return signalled


def _kill(pidfd: int, pid: int, why: str) -> None:
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except ProcessLookupError:
        return  # gone meanwhile
    log.warning("killed pid %d, %s", pid, why)


class Children:
    """The running jobs' children, at most `concurrency` of them."""

    def __init__(self, concurrency: int, kill_grace: float, memory_poll: float) -> None:
        self.running: dict[int, Running] = {}
        self.concurrency = concurrency
        self.kill_grace = kill_grace
        self.memory_poll = memory_poll
        self.forks = Backoff(FORK_BACKOFF_MIN, FORK_BACKOFF_MAX)
        self._next_memory_check = 0.0
        self._drain_deadline: float | None = None
        self._emptying: list[CgroupRun] = []  # the cgroups of ended runs, removed once empty
        self.strays = False  # look for what ended runs left among our own children (no cgroups)
        self.others: Callable[[], set[int]] = set  # the pids of our other children (sweepers): no strays
        self.on_start: Callable[[Running], None] | None = None  # told of each child started
        self.on_end: Callable[[Running], None] | None = None  # and of each reaped
        self.at_gates: list[tuple[Running, Gate]] = []  # started this turn, waiting for their counts on disk

    def gates(self) -> list[int]:
        """The manager's ends of the gates still shut: no other child may hold one."""
        return [gate.manager_end for _, gate in self.at_gates]

    def has_room(self, now: float) -> bool:
        """A free slot, and no recent fork failure to wait out."""
        return len(self.running) < self.concurrency and self.forks.due(now)

    def of(self, queue: int) -> Iterator[Running]:
        """The children running jobs of the manager's `queue`-th queue."""
        return (running for running in self.running.values() if running.queue == queue)

    def started_since(self, queue: int, since: float) -> int:
        """How many of the `queue`-th queue's children started at or after `since` (monotonic)."""
        return sum(1 for running in self.of(queue) if running.started >= since)

    def job_ids(self, queue: int) -> set[str]:
        return {running.claim.job_id for running in self.of(queue)}

    def start(
        self,
        claim: Claim,
        create: Callable[[], int],
        queue: int = 0,
        box: CgroupRun | None = None,
        gate: Gate | None = None,
    ) -> int:
        """Start the child of a job of the manager's `queue`-th queue with `create` (a fork or
        a spawn into `box`, its run's cgroup if it has one, which returns its pid; a forked
        child with a `gate` waits at it until `at_gates` is opened); OSError if the host
        cannot (EAGAIN, ENOMEM): the job is fine, the caller puts it back, and the next start
        waits (see `forks`)."""
        try:
            pid = create()
        except OSError:
            self.forks.failed(time.monotonic())
            raise
        self.forks.succeeded()
        running = self.running[pid] = Running(pid, claim, time.monotonic(), time.time(), queue, box=box)
        if gate is not None:
            self.at_gates.append((running, gate))
        if self.on_start is not None:
            self.on_start(running)
        return pid

    def reaped(self) -> Iterator[tuple[Running | None, forking.ExitStatus]]:
        """Each child that exited, with its job (None for another child: the sweeper)."""
        for status in forking.reap_nowait():
            running = self.running.pop(status.pid, None)
            if running is not None:
                if self.on_end is not None:
                    self.on_end(running)
                self._end_run(running)
            yield running, status

    def _end_run(self, running: Running) -> None:
        """A job ends with its child: what it left goes too. Its cgroup, all of it; else its
        process group (and, if we stopped it, every descendant seen), and the orphans it left
        (the kernel gave them to us before the child became a zombie), found by their mark;
        what those had started comes to us as they die, and goes at the next check."""
        box = running.box
        if box is not None:
            box.seen.add(running.pid)  # (reaped already: no longer in the cgroup)
            running.cost = box.cost()  # before it goes: the kernel's count of every process it held
            if running.cost["oom_kills"] and running.stopped is None:
                running.stopped = Stop.MEMORY  # the kernel killed at its limit: that is why it ended
            if not box.remove():  # the kernel refuses while a process of the run is left in it
                box.sample()
                running.cost["processes_seen"] = len(box.seen)
                box.kill()
                if not box.remove():
                    self._emptying.append(box)  # removed once the kernel has killed them (`enforce`)
        elif running.stopped is not None:  # we stopped it: its leftovers go, even if they ignore SIGTERM
            forking.signal_tree(running.pid, signal.SIGKILL, running.descendants)
        else:
            forking.kill_group(running.pid)
        if box is None and self.strays:
            self._end_strays()

    # -- stopping --------------------------------------------------------------------

    def freeze(self, running: Running, frozen: bool, now: float) -> None:
        """Freeze (or thaw) every process of the run: its cgroup's freezer, else SIGSTOP (SIGCONT)
        to its tree and to what it left elsewhere bearing its mark. Its timeout stands still."""
        job_id = running.claim.job_id
        if frozen:
            running.freeze(now)
        else:
            running.thaw(now)
        log.warning("job %s pid %d: %s by an operator", job_id, running.pid, "frozen" if frozen else "thawed")
        if running.box is not None:
            running.box.freeze(frozen)
            return
        signum = signal.SIGSTOP if frozen else signal.SIGCONT
        self._signal(running, signum)
        self._signal_marked(running, signum)

    def stop(self, running: Running, why: Stop, now: float) -> None:
        """SIGTERM the job's tree now, SIGKILL it after the grace period (`enforce`); a frozen
        run is thawed first, so that it can act on the SIGTERM. A run stopped for its output
        has until the next check only: what it writes meanwhile stays on the disk whole."""
        if running.frozen:
            self.freeze(running, False, now)
        grace = min(self.kill_grace, self.memory_poll) if why is Stop.OUTPUT else self.kill_grace
        running.stop(why, now + grace)
        log.warning("job %s pid %d: %s, sending SIGTERM", running.claim.job_id, running.pid, why.value)
        self._signal(running, signal.SIGTERM)

    def kill_lost(self, running: Running) -> None:
        """SIGKILL a job whose claim was taken back: its end will be recorded nowhere."""
        if not running.lost:  # (a second time: its owner reaped after its claim was seen gone)
            running.lose()
        self._signal(running, signal.SIGKILL)

    def kill_all_and_reap(self, on_exit: Callable[[Running | None, forking.ExitStatus], None]) -> None:
        """SIGKILL every job and reap them all (each exit to `on_exit`), for a moment at most."""
        self.kill_all()
        deadline = time.monotonic() + self.kill_grace + 5
        while self.running and time.monotonic() < deadline:
            time.sleep(0.01)  # SIGKILLed: gone in a moment
            for running, status in self.reaped():
                on_exit(running, status)

    def kill_all(self) -> None:
        """SIGKILL every job now (a second SIGTERM, or the manager closing): each goes back unfinished."""
        for running in self.running.values():
            if running.life not in (Life.KILLED, Life.LOST):
                running.kill(Stop.DRAIN)
            self._signal(running, signal.SIGKILL)

    def check_claims(
        self,
        queue: int,
        claim_state: Callable[[Claim], ClaimState],
        now: float,
        only: Collection[str] | None = None,
    ) -> None:
        """Kill the jobs of the `queue`-th queue whose claim a sweeper took back; stop those an
        operator cancelled, freeze or thaw those an operator froze or let go (of those whose
        ids are in `only`, if given). `claim_state` says what the job's folder says."""
        for running in self.of(queue):
            if only is not None and running.claim.job_id not in only:
                continue
            try:
                state = claim_state(running.claim)
            except OSError as exc:  # its folder cannot be looked at now: look again at the next heartbeat
                log.warning("cannot check the claim of job %s: %s", running.claim.job_id, exc)
                continue
            if not running.lost and not state.held:
                self.kill_lost(running)
            elif running.life in UNSTOPPED and state.cancelled:
                self.stop(running, Stop.CANCELLED, now)
            elif running.life in UNSTOPPED and state.frozen != running.frozen:
                self.freeze(running, state.frozen, now)

    def drain(self, now: float, timeout: float) -> None:
        """Let the jobs run `timeout` more seconds, then stop them (they go back, not counted)."""
        self._drain_deadline = now + timeout

    def enforce(self, now: float) -> None:
        """Stop the jobs past a limit or the drain deadline; SIGKILL those past their grace."""
        check_memory = now >= self._next_memory_check
        if check_memory:
            self._next_memory_check = now + self.memory_poll
            self._emptying = [box for box in self._emptying if not box.remove()]
            if self.strays:
                self._end_strays()
        for running in list(self.running.values()):
            self._enforce_one(running, now, check_memory)
        if self._drain_deadline is not None and now >= self._drain_deadline:
            self._drain_deadline = None  # done once: kill_at takes it from here
            for running in self.running.values():
                if running.life in UNSTOPPED:
                    self.stop(running, Stop.DRAIN, now)

    def _enforce_one(self, running: Running, now: float, check_memory: bool) -> None:
        if running.life is Life.STOPPING:
            self._escalate(running, now)
        elif running.life is Life.RUNNING and (hit := limits.limit_hit(running, now, check_memory)) is not None:
            self.stop(running, hit, now)
        if check_memory and running.claim.policy.output_limit:
            over = limits.bound_output(running)
            if over and running.life is Life.RUNNING:
                self.stop(running, Stop.OUTPUT, now)
        if check_memory and running.box is not None:
            running.box.sample()

    def next_deadline(self, now: float) -> float:
        """When `enforce` has something to do next (a loop, not lists: it runs at every turn)."""
        soonest = float("inf") if self._drain_deadline is None else self._drain_deadline
        for running in self.running.values():
            if running.life is Life.STOPPING and running.kill_at is not None:
                soonest = min(soonest, running.kill_at)
            elif running.life is Life.RUNNING:  # a stopping one waits on kill_at, a frozen one on nothing
                policy = running.claim.policy
                if policy.timeout:
                    soonest = min(soonest, limits.deadline_of(running))
                if policy.memory_limit or running.output_unbounded:  # (its output: held by no hole)
                    soonest = min(soonest, self._next_memory_check)
        if len(self.running) < self.concurrency and not self.forks.due(now):
            soonest = min(soonest, self.forks.next_try)
        return soonest

    def _escalate(self, running: Running, now: float) -> None:
        if running.kill_at is not None and now >= running.kill_at:
            job_id = running.claim.job_id
            log.warning("job %s pid %d: still running after SIGTERM, sending SIGKILL", job_id, running.pid)
            running.kill()
            self._signal(running, signal.SIGKILL)

    def end_leftovers(self, timeout: float) -> None:
        """At the manager's end, once no run is left: kill what ended runs left among our
        children, and wait (at most `timeout` seconds) until the cgroups of ended runs are
        empty, and remove them (the kernel kills their processes; it takes a moment)."""
        if self.strays:
            self._end_strays()
        deadline = time.monotonic() + timeout
        while True:
            self._emptying = [box for box in self._emptying if not box.remove()]
            if not self._emptying or time.monotonic() >= deadline:
                break
            time.sleep(0.01)  # bounded: killed processes leave within milliseconds
        for box in self._emptying:
            log.warning("the cgroup %s still has processes after %gs; the next sweep removes it", box.path, timeout)

    def _end_strays(self) -> None:
        """Kill the orphans (adopted: the manager is a subreaper) of runs that ended, found by
        their run's mark: where runs have no cgroup, what a job left in another session. Note
        those of live runs with their run (`Running.strays`): its memory limit counts them
        (by pid: our children, no other process can take theirs until we reap them), and one
        look at our children serves both."""
        live = {run_mark(running): running for running in self.running.values()}
        for running in live.values():
            running.strays = []
        known = {*self.running, *self.others()}
        for pid, pidfd, marks in containment.strays(known, unmarked=True):
            try:
                if marks:
                    self._sort_stray(pid, pidfd, [live[mark] for mark in marks if mark in live], marks)
                elif not self._lived_when_born(pid):
                    _kill(pidfd, pid, "adopted without a mark, once every run that lived at its start had ended")
            finally:
                os.close(pidfd)

    @staticmethod
    def _sort_stray(pid: int, pidfd: int, runs: list[Running], marks: set[str]) -> None:
        """A stray goes with its live runs, or (of none) is killed, through its pidfd."""
        for running in runs:
            running.strays.append(pid)
        if not runs:
            _kill(pidfd, pid, f"left by the ended run {', '.join(sorted(marks))}")

    def _lived_when_born(self, pid: int) -> bool:
        """Whether a run that lived when this orphan started lives still. One without a mark
        (it closed the run's descriptor and exec'd with a clean environment) is still some
        run's: only runs' processes are our children's children. Which one cannot be told,
        but only a run that had started by then can have made it: it goes once none of those
        lives (not counted in any run's memory: it may be another's)."""
        born = containment.started(pid)
        return born is not None and any(
            (began := containment.started(running.pid)) is not None and began <= born
            for running in self.running.values()
        )

    @staticmethod
    def _signal_marked(running: Running, signum: signal.Signals) -> None:
        """Signal the processes of the run that left its tree (adopted: we are a subreaper)."""
        mark = run_mark(running)
        signal_strays(set(), lambda marks: mark in marks, signum)

    @staticmethod
    def _signal(running: Running, signum: signal.Signals) -> None:
        """Signal every process of the job: its cgroup's; else its group and every descendant seen so far."""
        if running.box is not None:
            running.box.signal(signum)
            return
        known = {process.pid for process in running.descendants}
        running.descendants += [p for p in forking.job_tree(running.pid) if p.pid not in known]
        forking.signal_tree(running.pid, signum, running.descendants)
