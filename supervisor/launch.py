"""What a claimed job's child will run, decided in the manager before the fork: its
registered function or its command, and as whom (with `--run-as-submitter`, the
member who submitted it). A job that cannot run here at all raises: it is dead,
with the reason, rather than a child that fails at once."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from jobs import COMMAND, Claim, Command, JobsError, Queue, Registry, UnknownCallable
from supervisor import privileges
from supervisor.child import run_attempt, run_command
from supervisor.children import Children
from supervisor.errors import ConfigError, NoSuchUser
from supervisor.outcomes import Outcomes, describe

log = logging.getLogger(__name__)


class Launcher:
    """Builds the body of each job's child."""

    def __init__(
        self, queue: Queue, registry: Registry, commands: bool, run_as_submitter: bool, index: int = 0, label: str = ""
    ) -> None:
        """`index`: the queue's place in its manager's order (its children are counted by it);
        `label` names it in log lines where the manager serves several."""
        self.queue = queue
        self.index = index
        self.label = label
        self.registry = registry
        self.commands = commands
        self.run_as_submitter = run_as_submitter
        self._identities = privileges.Identities()

    def launch(self, claim: Claim, children: Children, outcomes: Outcomes, close_fds: list[int]) -> None:
        """Fork the job's child; a job that cannot start here is dead, one the host cannot
        fork for goes back (its attempt not counted)."""
        try:
            body = self.body(claim)
        except (JobsError, NoSuchUser) as exc:  # unknown function, malformed command, no such submitter
            outcomes.unstarted(claim, exc)
            return
        try:
            pid = children.start(claim, body, close_fds, self.index)
        except OSError as exc:  # EAGAIN, ENOMEM: the job is fine, the host is not
            wait = children.forks.next_try - time.monotonic()
            log.error("cannot fork for job %s: %s; putting it back, retrying in %.1fs", claim.job_id, exc, wait)
            outcomes.fork_failed(claim, exc)
            return
        if log.isEnabledFor(logging.INFO):  # per job: build the words only if they are wanted
            log.info("%s started as pid %d", describe(claim, self.label), pid)

    def body(self, claim: Claim) -> Callable[[], int]:
        """The child's body; JobsError (or NoSuchUser) if the job cannot run here at all."""
        queue, identity = self.queue, self._identity(claim)
        if claim.spec.function == COMMAND:
            if not self.commands:
                why = f"the queue {queue.path} is shared" if queue.shared else "it was told not to (--no-commands)"
                raise UnknownCallable(
                    f"this manager does not run command jobs ({why}); "
                    "start one with --commands to allow them, then `forkvisor retry` the job"
                )
            command = Command.of(claim.spec)
            return lambda: run_command(claim, command, queue.file_mode, identity)
        registered = self.registry.get(claim.spec.function)
        return lambda: run_attempt(claim, registered, queue.durable, queue.file_mode, identity)

    def _identity(self, claim: Claim) -> privileges.Identity | None:
        """Whom the job runs as with --run-as-submitter: the member who submitted it, or for
        the owner's own jobs the queue's owner (None: as this manager)."""
        if not self.run_as_submitter:
            return None
        uid = claim.spec.submitted_by
        return self._identities.of(self.queue.owner_uid if uid is None else uid)


def check_root(run_as_submitter: bool) -> None:
    """--run-as-submitter needs root: only root can become each job's submitter."""
    if run_as_submitter and os.geteuid() != 0:
        raise ConfigError(
            f"--run-as-submitter needs a manager started as root (this is uid {os.geteuid()}): "
            "only root can become each job's submitter"
        )
