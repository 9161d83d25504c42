"""forkvisor's durable job store: a job queue that lives in a folder.

This package owns the on-disk format (version 1) and every transition of a
job. It starts no processes and never imports `supervisor`.

    QUEUE/
      queue.json            marker: kind, format version, shared mode, defaults
      tmp/                  submissions being written; invisible to managers
      ready/RRR.ID          claimable now; RRR = 100 - priority, so names sort in claim order
      scheduled/DUE.RRR.ID  waiting until DUE (epoch milliseconds, 13 digits)
      claimed/OWNER/ID      held by one manager; claimed/OWNER/.owner.json's mtime is its lease
      done/ID               completed (terminal)
      dead/ID               cannot be completed (terminal)
      quarantine/           entries that were not jobs, each with a NAME.why note
      purged.log            one line per job an operator purged

A job directory holds `job.json` (the immutable spec), `attempts` (attempts
used, written before each run starts), `attempt-N/` (one per run: stdout,
stderr, result.json, outcome.json), `result.json` (done), `error.json`
(dead: the last cause) and `events` (an append-only log of transitions).

Transitions, each one rename(2) of the job directory:

    enqueue   tmp/ID                -> ready/RRR.ID or scheduled/DUE.RRR.ID
    claim     ready/RRR.ID          -> claimed/OWNER/ID   (then attempts += 1)
    complete  claimed/OWNER/ID      -> done/ID
    fail      claimed/OWNER/ID      -> scheduled/DUE.RRR.ID (retry) or dead/ID
    release   claimed/OWNER/ID      -> ready/RRR.ID       (attempts -= 1)
    reap      claimed/OWNER         -> claimed/reaping.OWNER, then each job -> ready/ or dead/
    promote   scheduled/DUE.RRR.ID  -> ready/RRR.ID
    cancel    ready/ or scheduled/  -> dead/ID
    retry     dead/ID               -> ready/RRR.ID       (attempts = 0)

Assumptions: POSIX rename(2) on one file system; renameat2(RENAME_NOREPLACE)
where available (else a check-then-rename fallback). Details: docs/FORMAT.md.
"""

from jobs.command import COMMAND, Command, command_call
from jobs.config import format_duration, parse_duration
from jobs.errors import (
    ArgumentNotSerializable,
    CannotComplete,
    ClaimLost,
    InternalError,
    InvalidJob,
    InvalidJobId,
    JobFailed,
    JobNotFound,
    JobsError,
    MoveCollision,
    NotFinished,
    QueueError,
    UnknownCallable,
    WaitTimeout,
    WrongState,
)
from jobs.job import Attempt, Job, JobOptions, JobSpec, State, is_job_id, new_job_id
from jobs.lease import Liveness, Owner, unknown_liveness
from jobs.registry import Registered, Registry
from jobs.retry import DEFAULT_WAIT, retry_delay
from jobs.store import Call, Claim, Queue, Submitter

__all__ = [
    "COMMAND",
    "DEFAULT_WAIT",
    "ArgumentNotSerializable",
    "Attempt",
    "Call",
    "CannotComplete",
    "Claim",
    "ClaimLost",
    "Command",
    "InternalError",
    "InvalidJob",
    "InvalidJobId",
    "Job",
    "JobFailed",
    "JobNotFound",
    "JobOptions",
    "JobSpec",
    "JobsError",
    "Liveness",
    "MoveCollision",
    "NotFinished",
    "Owner",
    "Queue",
    "QueueError",
    "Registered",
    "Registry",
    "State",
    "Submitter",
    "UnknownCallable",
    "WaitTimeout",
    "WrongState",
    "command_call",
    "format_duration",
    "is_job_id",
    "new_job_id",
    "parse_duration",
    "retry_delay",
    "unknown_liveness",
]
