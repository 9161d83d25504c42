"""What a claimed job's child will run, decided in the manager before it starts: its
registered function or its command, as whom (with `--run-as-submitter`, the member
who submitted it), and how it starts (forked, or for a command job spawned: see
`spawner`). A job that cannot run here at all raises: it is dead, with the reason,
rather than a child that fails at once."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence

from jobs import COMMAND, Claim, Command, JobsError, Queue, Registry, UnknownCallable, owner_group_members
from supervisor import forking, privileges
from supervisor.child import job_environment, run_attempt, run_command
from supervisor.children import Children
from supervisor.containment import CgroupRun, Containment, ProcessContainment, run_mark
from supervisor.errors import CannotRunAs, ConfigError, RunGone
from supervisor.forking import NO_CGROUPS
from supervisor.outcomes import Outcomes, describe, job_fields
from supervisor.settings import Settings
from supervisor.spawner import Spawner

log = logging.getLogger(__name__)


class Launcher:
    """Starts each job's child: forked to run its function or command, or for a command job
    spawned (`spawner`) where the host allows it."""

    def __init__(
        self,
        queue: Queue,
        registry: Registry,
        settings: Settings,
        index: int = 0,
        label: str = "",
        spawner: Spawner | None = None,
        containment: Containment | None = None,
    ) -> None:
        """`settings`: the manager's, with the queue's own filled in; `index`: the queue's
        place in its manager's order (its children are counted by it); `label` names it in
        log lines where the manager serves several; `spawner`, if given, starts command jobs
        without a fork. Jobs run as their submitters get only the manager's variables that
        `settings.pass_env` names."""
        self.queue = queue
        self.index = index
        self.label = label
        self.registry = registry
        self.commands = settings.commands
        self.run_as_submitter = settings.run_as_submitter
        self.members_as_root = settings.members_as_root
        self.spawner = spawner
        self.containment = containment or ProcessContainment("none given")
        passed = {name: os.environ[name] for name in settings.pass_env if name in os.environ}
        self._identities = privileges.Identities(passed)

    def launch(self, claim: Claim, children: Children, outcomes: Outcomes, close_fds: list[int]) -> None:
        """Start the job's child (in its run's cgroup, where runs have one); a job that cannot
        start here is dead, one the host cannot start a process for goes back (its attempt
        not counted)."""
        box = self.containment.new_run(claim.owner, claim.job_id, claim.run, claim.policy.memory_limit)
        mark = self.containment.mark_run(run_mark(claim.owner, claim.job_id, claim.run))
        try:
            self._launch(claim, children, outcomes, close_fds, box)
        finally:
            if mark >= 0:
                os.close(mark)  # the run's first process has it (or there is none)

    def _launch(
        self, claim: Claim, children: Children, outcomes: Outcomes, close_fds: list[int], box: CgroupRun | None
    ) -> None:
        try:
            create, gate = self.creator(claim, [*close_fds, *children.gates()], box)
        except (JobsError, CannotRunAs) as exc:  # unknown function, malformed command, no such submitter
            _discard(box)
            outcomes.unstarted(claim, exc)
            return
        try:
            pid = children.start(claim, create, self.index, box, gate)
        except RunGone:
            _discard(box)
            _shut(gate)
            log.warning("job %s: its run folder is gone (a sweeper took the claim back); not started", claim.job_id)
            return
        except OSError as exc:  # EAGAIN, ENOMEM: the job is fine, the host is not (or its count, see `creator`)
            _discard(box)
            _shut(gate)
            wait = children.forks.next_try - time.monotonic()
            fields = job_fields(claim, self.queue, "released")
            log.error(
                "cannot fork for job %s: %s; putting it back, retrying in %.1fs",
                claim.job_id,
                exc,
                wait,
                extra={"fields": fields},
            )
            outcomes.fork_failed(claim, exc)
            return
        if box is not None:
            box.started()  # the child has its own descriptor of cgroup.procs: ours goes
        if log.isEnabledFor(logging.INFO):  # per job: build the words only if they are wanted
            fields = {**job_fields(claim, self.queue, "started"), "pid": pid}
            log.info("%s started as pid %d", describe(claim, self.label), pid, extra={"fields": fields})

    def creator(
        self, claim: Claim, close_fds: list[int], box: CgroupRun | None = None
    ) -> tuple[Callable[[], int], forking.Gate | None]:
        """What starts the job's child (into `box`, its run's cgroup, if given) and returns its
        pid, and the gate the child waits at: a forked child whose count is only staged waits
        until the manager has it on disk (`Served.open_gates`). A spawned child cannot wait,
        so its count is committed first (OSError if it cannot be: the job goes back). JobsError
        (or CannotRunAs) if the job cannot run here at all."""
        queue, identity = self.queue, self._identity(claim)
        cgroups = NO_CGROUPS if box is None else box.entries()
        cgroup, cgroups_left = (None, NO_CGROUPS) if box is None else box.fork_into()
        if claim.spec.function == COMMAND:
            command = self._command(claim)
            spawner = self.spawner
            # As a submitter, or into a cgroup a spawn cannot enter before its program runs: forked.
            if spawner is not None and identity is None and (box is None or spawner.enters_cgroup):
                environment = {**job_environment(claim), **command.env}  # (over the manager's)
                mode = queue.file_mode

                def spawn() -> int:
                    self._counted(claim)  # a spawned child cannot wait at a gate
                    return spawner.spawn(claim, command, environment, mode, cgroups)

                return spawn, None
        else:
            registered = self.registry.get(claim.spec.function)
        gate = None if claim.counted else forking.Gate()  # (made last: nothing above may leave it open)
        wait = -1 if gate is None else gate.child_end
        body: Callable[[], int]
        if claim.spec.function == COMMAND:
            body = lambda: run_command(claim, command, queue.file_mode, identity, cgroups_left, wait)  # noqa: E731
        else:
            body = lambda: run_attempt(claim, registered, queue.durable, queue.file_mode, identity, cgroups_left, wait)  # noqa: E731
        return lambda: forking.start_child(body, close_fds, gate, cgroup), gate

    def _counted(self, claim: Claim) -> None:
        """Commit the staged count of a claim whose child cannot wait at a gate (OSError if not)."""
        if not claim.counted and (failed := self.queue.serving.commit_counts([claim])[0]) is not None:
            raise failed

    def _command(self, claim: Claim) -> Command:
        """The command job's command, if this manager runs command jobs."""
        if not self.commands:
            queue = self.queue
            why = f"the queue {queue.path} is shared" if queue.shared else "it was told not to (--no-commands)"
            raise UnknownCallable(
                f"this manager does not run command jobs ({why}); "
                "start one with --commands to allow them, then `forkvisor retry` the job"
            )
        return Command.of(claim.spec)

    def _identity(self, claim: Claim) -> privileges.Identity | None:
        """Whom the job runs as with --run-as-submitter: the member who submitted it, or for
        the owner's own jobs the queue's owner (None: as this manager)."""
        if not self.run_as_submitter:
            self._check_member_as_root(claim)
            return None
        uid = self.queue.owner_uid if claim.spec.submitted_by is None else claim.spec.submitted_by
        if uid == 0 and not self.queue.settings["root_jobs"]:
            raise CannotRunAs(
                "it would run as root (its submitter is uid 0), which this queue does not allow: the "
                "owner allows it with `forkvisor config QUEUE root_jobs yes`, then `forkvisor retry`s it"
            )
        return self._identities.of(uid)

    def _check_member_as_root(self, claim: Claim) -> None:
        """A root manager runs a member's job as root only when told so (`check_root` looks
        at the start; a member may join the group later)."""
        submitter = claim.spec.submitted_by
        if os.geteuid() == 0 and submitter not in (None, 0) and not self.members_as_root:
            raise CannotRunAs(
                f"it was submitted by a member (uid {submitter}) and this manager runs as root: it runs a member's "
                "job as its submitter with --run-as-submitter (or as root with --members-as-root); restart it "
                "so, then `forkvisor retry` the job"
            )


def _shut(gate: forking.Gate | None) -> None:
    """A gate whose child never started (or cannot wait at it)."""
    if gate is not None:
        gate.forked()
        gate.shut()


def _discard(box: CgroupRun | None) -> None:
    """A run's cgroup that no process entered: gone again."""
    if box is not None:
        box.started()
        box.remove()


def check_root(run_as_submitter: bool, members_as_root: bool, queues: Sequence[Queue]) -> None:
    """--run-as-submitter needs root: only root can become each job's submitter. And root
    runs the jobs of a shared queue's members as root only when told so, and says so."""
    if run_as_submitter and os.geteuid() != 0:
        raise ConfigError(
            f"--run-as-submitter needs a manager started as root (this is uid {os.geteuid()}): "
            "only root can become each job's submitter"
        )
    if os.geteuid() != 0 or run_as_submitter:
        return
    for queue in queues:
        members = owner_group_members(os.stat(queue.path).st_gid, 0, every_user=True) if queue.shared else []
        if not members:
            continue
        named = f"{', '.join(members[:3])}{' and others' if len(members) > 3 else ''}"
        if members_as_root:
            log.warning("the jobs the members of %s submit (%s) run as root: --members-as-root", queue.path, named)
            continue
        raise ConfigError(
            f"this manager runs as root, so the jobs the members of {queue.path} submit ({named}) would run as "
            "root: start it with --run-as-submitter (each job as its submitter), or --user OWNER (as the queue's "
            "owner), or --members-as-root if running them as root is what you mean"
        )
