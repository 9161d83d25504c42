"""A job's effective policy, resolved in one order whatever path submitted it.

For each of `max_attempts`, `timeout`, `memory_limit`, `output_limit` and `backoff` the first
level that sets it wins:

    the job (job.json)  >  its function's registration  >  the queue (queue.json)  >  built in

`job.json` records only what the submitter set, so a job enqueued by name,
from the shell or from another language gets its function's policy like one
enqueued with the function object. The manager that claims a job holds the
registry: it resolves the policy then, writes it into the run's folder
(`attempt-N/policy.json`, with where each value came from), and every later
decision about that run (its timeout, its memory limit, whether it was the last
attempt, its backoff; the sweeper's too, if the manager dies) reads the same
values. A timeout, memory or output limit of 0 at any level means "no limit" there.

`Functions` says what one manager can run: the functions of its registry, and
command jobs if it runs them. A job naming anything else is left for a
manager that can run it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from jobs.config import BUILT_IN
from jobs.document import parse as parse_document
from jobs.errors import InvalidJob
from jobs.job import COMMAND, POLICY_FIELDS, JobOptions, JobSpec, indented_json
from jobs.registry import Registered, Registry
from jobs.retry import Described, WaitStrategy, as_backoff, describe, retry_delay

POLICY_FILE = "policy.json"


class Source(enum.StrEnum):
    """Where a value of a job's policy came from."""

    JOB = "job"
    FUNCTION = "function"
    QUEUE = "queue"
    DEFAULT = "default"


@dataclass(frozen=True)
class Policy:
    """What one run of a job gets, and where each value came from."""

    max_attempts: int
    timeout: float | None  # None: no limit
    memory_limit: int | None  # None: no limit
    output_limit: int | None  # None: no limit
    backoff: str  # as it reads: "exponential 1s 5m", "fixed 0.2s", "custom (wait_chain)"
    sources: Mapping[str, Source]
    wait: WaitStrategy = field(default=None, compare=False, repr=False)  # the strategy itself

    def delay(self, attempts: int) -> float:
        """Seconds before the next attempt, after `attempts` attempts have failed."""
        return retry_delay(self.wait if self.wait is not None else Described(self.backoff), attempts)

    def to_json(self) -> dict[str, Any]:
        values = {name: getattr(self, name) for name in POLICY_FIELDS}
        return {**values, "sources": {name: str(self.sources[name]) for name in POLICY_FIELDS}}

    @classmethod
    def from_json(cls, data: bytes) -> Policy:
        """Decode a run's `policy.json`; raise InvalidJob if it is not one."""
        document = parse_document(data, POLICY_FILE)
        try:
            recorded = document["sources"]
            # a run recorded before output_limit existed kept all of its output
            sources = {name: Source(recorded.get(name, Source.DEFAULT)) for name in POLICY_FIELDS}
            policy = cls(
                max_attempts=document["max_attempts"],
                timeout=document["timeout"],
                memory_limit=document["memory_limit"],
                output_limit=document.get("output_limit"),
                backoff=document["backoff"],
                sources=sources,
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidJob(f"{POLICY_FILE} is not a policy ({type(exc).__name__}: {exc})") from None
        limits_ok = all(_is_limit(value) for value in (policy.timeout, policy.memory_limit, policy.output_limit))
        if not _is_count(policy.max_attempts) or not isinstance(policy.backoff, str) or not limits_ok:
            raise InvalidJob(f"{POLICY_FILE} has a field of the wrong type")
        return policy


def resolve(spec: JobSpec, registered: Registered | None, queue_settings: Mapping[str, Any]) -> Policy:
    """The policy of `spec`: the job's own values, else the function's, the queue's, the built-in ones.
    `queue_settings` holds only what the queue sets (`QueueFolder.stored_settings`)."""
    levels: list[tuple[Source, Mapping[str, Any]]] = [
        (Source.JOB, {name: getattr(spec, name) for name in POLICY_FIELDS}),
        (Source.FUNCTION, _declared(registered)),
        (Source.QUEUE, queue_settings),
        (Source.DEFAULT, BUILT_IN),
    ]
    values: dict[str, Any] = {}
    sources: dict[str, Source] = {}
    for name in POLICY_FIELDS:
        source, value = next(((s, level[name]) for s, level in levels if level.get(name) is not None), _NONE)
        values[name], sources[name] = value, source
    wait = as_backoff(values["backoff"])
    return Policy(
        max_attempts=values["max_attempts"],
        timeout=values["timeout"] or None,  # 0: no limit
        memory_limit=values["memory_limit"] or None,
        output_limit=values["output_limit"] or None,
        backoff=describe(wait),
        sources=sources,
        wait=wait,
    )


_NONE = (Source.DEFAULT, None)
MEMO_SIZE = 1024


class PolicyMemo:
    """Resolved policies and their `policy.json` bytes, by what they depend on.

    Nearly every job of a function gives nothing of its own, so its policy is the same
    each time: resolving and encoding it once, not per claim, spares the manager's hot
    path the objects (and, after a fork, the copy-on-write faults) that building it costs.
    """

    def __init__(self) -> None:
        self._known: dict[tuple[Any, ...], tuple[Policy, bytes]] = {}
        self._functions: Functions | None = None
        self._settings: Mapping[str, Any] | None = None

    def resolve(
        self, spec: JobSpec, functions: Functions | None, queue_settings: Mapping[str, Any]
    ) -> tuple[Policy, bytes]:
        if functions is not self._functions or queue_settings is not self._settings:
            self._known.clear()  # another claimer's functions, or a settings reload (a new mapping)
            self._functions, self._settings = functions, queue_settings
        key = (spec.function, spec.max_attempts, spec.timeout, spec.memory_limit, spec.output_limit, spec.backoff)
        found = self._known.get(key)
        if found is None:
            if len(self._known) >= MEMO_SIZE:
                self._known.clear()  # jobs that each give their own values: keep it bounded
            registered = functions.registration(spec.function) if functions is not None else None
            policy = resolve(spec, registered, queue_settings)
            found = self._known[key] = (policy, indented_json(policy.to_json()))
        return found


def _declared(registered: Registered | None) -> dict[str, Any]:
    if registered is None:
        return {}
    return {name: getattr(registered, name) for name in POLICY_FIELDS}


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _is_limit(value: object) -> bool:
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool) and value > 0)


class Functions:
    """What one manager can run: its registry's functions, and command jobs if allowed."""

    def __init__(self, registry: Registry | None = None, *, commands: bool = True) -> None:
        self.registry = registry if registry is not None else Registry()
        self.commands = commands

    def knows(self, function: str) -> bool:
        return function in self.registry or (self.commands and function == COMMAND)

    def registration(self, function: str) -> Registered | None:
        return self.registry.lookup(function)

    def __iter__(self) -> Iterator[str]:
        yield from self.registry
        if self.commands:
            yield COMMAND

    def advertised(self) -> dict[str, dict[str, Any]]:
        """Each function's declared policy, for `claimed/OWNER/.functions.json` (what `status`
        and `show` read to tell which jobs a running manager can serve, and how)."""
        found = {}
        for name in self:
            declared = _declared(self.registration(name))
            if declared.get("backoff") is not None:
                declared["backoff"] = describe(declared["backoff"])
            found[name] = {key: value for key, value in declared.items() if value is not None}
        return found


def registration_from(name: str, declared: Mapping[str, Any]) -> Registered | None:
    """A registration rebuilt from what a manager advertised (for display, never to run);
    None if what it says is not a policy."""
    backoff = declared.get("backoff")
    try:
        options = JobOptions(
            max_attempts=declared.get("max_attempts"),
            timeout=declared.get("timeout"),
            memory_limit=declared.get("memory_limit"),
            output_limit=declared.get("output_limit"),
        )
    except InvalidJob:
        return None
    if backoff is not None and not isinstance(backoff, str):
        return None
    return Registered(
        name=name,
        fn=_not_callable,
        max_attempts=options.max_attempts,
        timeout=options.timeout,
        memory_limit=options.memory_limit,
        output_limit=options.output_limit,
        backoff=None if backoff is None else Described(backoff),
    )


def _not_callable(*args: Any, **kwargs: Any) -> Any:
    raise InvalidJob("a registration read from a queue folder describes a function; it cannot run it")
