"""forkvisor's durable job store: a job queue that lives in a folder.

This package owns the on-disk format (version 1) and every transition of a
job. It starts no processes and never imports `supervisor`.

    QUEUE/
      queue.json            marker: kind, format version, shared mode, defaults
      incoming/UID/ID.json  a member's submission (a shared queue), taken in by a manager (jobs.incoming)
      taken/ID              the ids of members' submissions taken in lately
      tmp/                  submissions being written; invisible to managers
      ready/RRR.ID          claimable now; RRR = 100 - priority, so names sort in claim order
      scheduled/DUE.RRR.ID  waiting until DUE (epoch milliseconds, 13 digits)
      waiting/ID            waiting until the jobs it depends on are done (edges/PARENT/ID)
      claimed/OWNER/ID      held by one manager; claimed/OWNER/.owner.json's mtime is its lease
      done/ID               completed (terminal)
      dead/ID               cannot be completed (terminal)
      quarantine/           entries that were not jobs, each with a NAME.why note
      purged.log            one line per job an operator purged
      schedules/, ticks/    periodic jobs, the ticks each fired, the tick ids' secret (jobs.ticks)
      keys/                 which job holds each unique key (jobs.keys)

A job directory holds `job.json` (the immutable spec: only what the submitter
set), `attempts` (attempts used, written before each run starts), `attempt-N/`
(one per run: policy.json, stdout, stderr, result.json, outcome.json),
`result.json` (done), `error.json` (dead: the last cause) and `events` (an
append-only log of transitions). A job's policy (attempts, timeout, memory
limit, backoff) is resolved by the claiming manager: see `jobs.policy`.

Transitions, each one rename(2) of the job directory:

    enqueue   tmp/ID                -> ready/RRR.ID, scheduled/DUE.RRR.ID or waiting/ID
    take in   incoming/UID/ID.json  -> (as an enqueue, written by the owner's manager)
    settle    waiting/ID            -> ready/RRR.ID or dead/ID (what it depends on ended)
    claim     ready/RRR.ID          -> claimed/OWNER/ID   (then attempts += 1, attempt-N/policy.json)
    give back claimed/OWNER/ID      -> ready/RRR.ID       (a function this claimer does not run: untouched)
    complete  claimed/OWNER/ID      -> done/ID
    fail      claimed/OWNER/ID      -> scheduled/DUE.RRR.ID (retry) or dead/ID
    release   claimed/OWNER/ID      -> ready/RRR.ID       (attempts -= 1)
    reap      claimed/OWNER         -> claimed/reaping.OWNER, then each job -> ready/ or dead/
    promote   scheduled/DUE.RRR.ID  -> ready/RRR.ID
    cancel    ready/, scheduled/ or waiting/ -> dead/ID
    retry     dead/ID               -> ready/RRR.ID or waiting/ID (attempts = 0)

Assumptions: POSIX rename(2) on one file system; renameat2(RENAME_NOREPLACE)
where available (else a check-then-rename fallback). Details: docs/FORMAT.md.
"""

from types import MappingProxyType

__version__ = "0.1.0"  # the one source of truth (pyproject.toml reads it)
__forkvisor__ = True  # marks this package as forkvisor's: a user's jobs.py on the path would shadow it

from jobs import output, run_folder
from jobs.access import owner_group_members
from jobs.claim import Claim, ClaimState, Finished, Retry
from jobs.command import Command, command_call
from jobs.config import BUILT_IN as _BUILT_IN
from jobs.config import SETTINGS as QUEUE_SETTINGS
from jobs.config import TMP_AGE
from jobs.config import checked as check_setting
from jobs.context import Current, NotInJob, current
from jobs.errors import (
    ArgumentNotSerializable,
    BadArguments,
    CannotComplete,
    ClaimLost,
    InternalError,
    InvalidJob,
    InvalidJobId,
    JobFailed,
    JobNotFound,
    JobsError,
    KeyTaken,
    MoveCollision,
    NotFinished,
    QueueError,
    QueueReplaced,
    StorageError,
    UnknownCallable,
    UnsupportedFormat,
    WaitTimeout,
    WrongState,
    storage_error,
)
from jobs.fate import CANCELLED, DRAIN, Cause, Reason, RunEnd, Verdict
from jobs.folder import CANCEL_FILE, DRAIN_FILE, FREEZE_FILE
from jobs.job import COMMAND, JobOptions, JobSpec, State, is_job_id, new_job_id
from jobs.job_view import Job, Run
from jobs.lease import Liveness, Owner, host_part, is_owner_name, unknown_liveness
from jobs.pause import NOT_PAUSED, PAUSE_FILE, Paused
from jobs.planner import Planner
from jobs.policy import Functions, Policy, Source
from jobs.registry import Registered, Registry
from jobs.retry import DEFAULT_BACKOFF, Backoff, retry_delay
from jobs.schedules import DEFAULT_CAP as SCHEDULE_CAP
from jobs.schedules import DEFAULT_MISSED, MISSED, Schedule, Timing
from jobs.stats import BUCKETS as DURATION_BUCKETS
from jobs.stats import MEMORY_BUCKETS, OUTCOMES, RunCost, StatsFile, Tally
from jobs.store import Call, Queue, Submitter
from jobs.timetable import ScheduleInfo
from jobs.units import format_duration, format_size, parse_duration, parse_size
from jobs.view import OwnerFolder

QUEUE_DEFAULTS = MappingProxyType(_BUILT_IN)  # every queue setting's value where queue.json sets none

__all__ = [
    "CANCELLED",
    "CANCEL_FILE",
    "COMMAND",
    "DEFAULT_BACKOFF",
    "DEFAULT_MISSED",
    "DRAIN",
    "DRAIN_FILE",
    "DURATION_BUCKETS",
    "FREEZE_FILE",
    "MEMORY_BUCKETS",
    "MISSED",
    "NOT_PAUSED",
    "OUTCOMES",
    "PAUSE_FILE",
    "QUEUE_DEFAULTS",
    "QUEUE_SETTINGS",
    "SCHEDULE_CAP",
    "TMP_AGE",
    "ArgumentNotSerializable",
    "Backoff",
    "BadArguments",
    "Call",
    "CannotComplete",
    "Cause",
    "Claim",
    "ClaimLost",
    "ClaimState",
    "Command",
    "Current",
    "Finished",
    "Functions",
    "InternalError",
    "InvalidJob",
    "InvalidJobId",
    "Job",
    "JobFailed",
    "JobNotFound",
    "JobOptions",
    "JobSpec",
    "JobsError",
    "KeyTaken",
    "Liveness",
    "MoveCollision",
    "NotFinished",
    "NotInJob",
    "Owner",
    "OwnerFolder",
    "Paused",
    "Planner",
    "Policy",
    "Queue",
    "QueueError",
    "QueueReplaced",
    "Reason",
    "Registered",
    "Registry",
    "Retry",
    "Run",
    "RunCost",
    "RunEnd",
    "Schedule",
    "ScheduleInfo",
    "Source",
    "State",
    "StatsFile",
    "StorageError",
    "Submitter",
    "Tally",
    "Timing",
    "UnknownCallable",
    "UnsupportedFormat",
    "Verdict",
    "WaitTimeout",
    "WrongState",
    "check_setting",
    "command_call",
    "current",
    "format_duration",
    "format_size",
    "host_part",
    "is_job_id",
    "is_owner_name",
    "new_job_id",
    "output",
    "owner_group_members",
    "parse_duration",
    "parse_size",
    "retry_delay",
    "run_folder",
    "storage_error",
    "unknown_liveness",
]
