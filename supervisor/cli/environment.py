"""`forkvisor run`'s options from the environment, for a systemd unit's
`EnvironmentFile=` or a container's environment: `FORKVISOR_CONCURRENCY=8`,
`FORKVISOR_DRAIN_TIMEOUT=2m`, `FORKVISOR_BURST=yes`, `FORKVISOR_PATH=/srv/app:/srv/lib`,
`FORKVISOR_QUEUE_CONCURRENCY=/srv/q/bulk=2,/srv/q/low=1`, `FORKVISOR_LOG_FORMAT=json`...
The queues themselves are arguments (the unit's instance name, say), never taken from
the environment.

Precedence: a flag on the command line, then the environment, then the queue's
settings (`queue.json`: lease, retention), then the built-in default. The names a
job's child sees (`FORKVISOR_QUEUE`, `FORKVISOR_JOB_ID`, `FORKVISOR_ATTEMPT`,
`FORKVISOR_ATTEMPT_DIR`, `FORKVISOR_FUNCTION`) are never options: a manager started from inside a job
does not take its parent's queue.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from supervisor.cli.common import LOG_LEVELS, LOG_STYLES, UsageError, positive_duration, queue_cap

PREFIX = "FORKVISOR_"
_YES, _NO = ("1", "yes", "true", "on"), ("0", "no", "false", "off")


def _flag(text: str) -> bool:
    if text.strip().lower() in _YES:
        return True
    if text.strip().lower() in _NO:
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is neither yes nor no (1/0, true/false, on/off)")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be 1 or more")
    return value


def _paths(text: str) -> list[str]:
    return [part for part in text.split(os.pathsep) if part]


def _queue_caps(text: str) -> list[tuple[Path, int]]:
    return [queue_cap(part.strip()) for part in text.split(",") if part.strip()]


def _one_of(choices: tuple[str, ...]) -> Callable[[str], str]:
    def read(text: str) -> str:
        if text not in choices:
            raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(choices)}")
        return text

    return read


RUN: dict[str, Callable[[str], Any]] = {
    "app": str,
    "path": _paths,
    "concurrency": _positive_int,
    "queue_concurrency": _queue_caps,
    "burst": _flag,
    "commands": _flag,
    "horizon": positive_duration,
    "lease": positive_duration,
    "sweep_interval": positive_duration,
    "drain_timeout": positive_duration,
    "kill_grace": positive_duration,
    "poll_interval": positive_duration,
    "retention": positive_duration,
    "stall_timeout": positive_duration,
    "max_runtime": positive_duration,
    "max_jobs": _positive_int,
    "no_durable": _flag,
    "user": str,
    "run_as_submitter": _flag,
    "containment": _one_of(("auto", "cgroup", "processes")),
}
"""The options of `forkvisor run` that the environment may give, and how each is read."""


LOGGING: dict[str, Callable[[str], Any]] = {
    "log_level": _one_of(LOG_LEVELS),
    "log_format": _one_of(LOG_STYLES),
    "log_file": str,
}
"""`forkvisor run`'s logging from the environment (`FORKVISOR_LOG_FORMAT=json`...), read
before the log is set up."""


def fill(args: argparse.Namespace, options: Mapping[str, Callable[[str], Any]], environ: Mapping[str, str]) -> None:
    """Give each option the command line left unset (None, False, an empty list) its value
    from `FORKVISOR_<OPTION>`, if set; UsageError naming the variable if it does not read."""
    for name, read in options.items():
        variable = PREFIX + name.upper()
        given = getattr(args, name)
        unset = given is None if name == "commands" else given in (None, False, [])  # --no-commands is a flag
        if variable not in environ or not unset:
            continue
        try:
            setattr(args, name, read(environ[variable]))
        except (argparse.ArgumentTypeError, ValueError) as exc:
            raise UsageError(f"{variable}={environ[variable]!r} in the environment: {exc}") from None
