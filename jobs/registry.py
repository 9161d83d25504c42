"""The registry: the only functions a manager will ever run, by name, and their policies.

A job names its function as a string in `job.json`; a manager runs it only if
that name is in the registry it was given. Nothing is ever unpickled, so a
job file cannot make a manager run code it was not told about.

A registration may declare the function's policy (attempts, timeout, memory
limit, backoff, priority). A manager applies it to every job of that function,
however the job was enqueued (see `jobs.policy`).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from jobs import schedules
from jobs.errors import BadArguments, InvalidJob, UnknownCallable
from jobs.job import JobOptions, check_priority
from jobs.retry import WaitStrategy, as_backoff
from jobs.schedules import Schedule
from jobs.units import bytes_of, seconds_of

F = TypeVar("F", bound=Callable[..., Any])
_ATTRIBUTE = "__forkvisor_job__"
_OPTION_NAMES = frozenset(JobOptions.__dataclass_fields__)


@dataclass(frozen=True)
class Registered:
    """A registered function and its policy; None where it declares nothing."""

    name: str
    fn: Callable[..., Any]
    max_attempts: int | None = None
    timeout: float | None = None  # 0: no limit, whatever the queue says
    memory_limit: int | None = None  # 0: no limit
    output_limit: int | None = None  # 0: no limit
    backoff: WaitStrategy | None = None
    priority: int | None = None  # used when the function object is enqueued (the name carries it)

    def check_arguments(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        """Raise BadArguments if `fn(*args, **kwargs)` could not even be called."""
        signature = self._signature
        if signature is None:
            return
        try:
            signature.bind(*args, **kwargs)
        except TypeError as exc:
            misplaced = sorted(set(kwargs) & _OPTION_NAMES - set(signature.parameters))
            if misplaced and not _takes_any_keyword(signature):
                option = misplaced[0]
                raise BadArguments(
                    f"cannot enqueue {self.name}: {option} is a per-job option, not an argument of the function; "
                    f"give it with queue.with_options({option}=...).enqueue(...)"
                ) from None
            raise BadArguments(f"cannot enqueue {self.name}{signature}: {exc}") from None

    @functools.cached_property
    def _signature(self) -> inspect.Signature | None:
        try:
            return inspect.signature(self.fn)
        except (TypeError, ValueError):
            return None  # a callable Python cannot introspect: it is called unchecked


def _takes_any_keyword(signature: inspect.Signature) -> bool:
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values())


class Registry:
    """Named callables a manager may run."""

    def __init__(self) -> None:
        self._by_name: dict[str, Registered] = {}
        self._schedules: dict[str, Schedule] = {}

    @overload
    def job(self, fn: F, /) -> F: ...
    @overload
    def job(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        max_attempts: int | None = None,
        timeout: float | str | Any = None,
        memory_limit: int | str | None = None,
        output_limit: int | str | None = None,
        backoff: str | WaitStrategy | None = None,
        priority: int | None = None,
        schedule: str | None = None,
    ) -> Callable[[F], F]: ...

    def job(
        self,
        fn: F | None = None,
        /,
        *,
        name: str | None = None,
        max_attempts: int | None = None,
        timeout: float | str | Any = None,
        memory_limit: int | str | None = None,
        output_limit: int | str | None = None,
        backoff: str | WaitStrategy | None = None,
        priority: int | None = None,
        schedule: str | None = None,
    ) -> F | Callable[[F], F]:
        """Register a function; use as `@registry.job` or `@registry.job(max_attempts=5, timeout="5m")`.

        `timeout` takes seconds, text ("5m") or a timedelta, 0 for no limit; `memory_limit`
        and `output_limit` bytes or text ("512M"); `backoff` text ("exponential 1s 5m", "fixed 30s") or any
        tenacity wait strategy. `schedule` (a cron expression in UTC, or "every 30s") also
        runs it periodically, as `periodic` does with its defaults.
        """
        try:  # the forms JobOptions takes from `with_options`, checked the same way
            seconds, size = seconds_of(timeout, "timeout"), bytes_of(memory_limit, "memory_limit")
            output = bytes_of(output_limit, "output_limit")
        except ValueError as exc:
            raise InvalidJob(str(exc)) from None
        checked = JobOptions(max_attempts=max_attempts, timeout=seconds, memory_limit=size, output_limit=output)
        wait = None if backoff is None else as_backoff(backoff)
        if priority is not None:
            check_priority(priority)

        def register(function: F) -> F:
            entry = Registered(
                name=default_name(function) if name is None else name,
                fn=function,
                max_attempts=checked.max_attempts,
                timeout=checked.timeout,
                memory_limit=checked.memory_limit,
                output_limit=checked.output_limit,
                backoff=wait,
                priority=priority,
            )
            self._add(entry)
            setattr(function, _ATTRIBUTE, entry)
            if schedule is not None:
                self._declare(schedules.declared(schedules.name_for(entry.name), schedule, entry.name))
            return function

        return register(fn) if fn is not None else register

    def periodic(
        self,
        when: str,
        /,
        *,
        tz: str | None = None,
        name: str | None = None,
        missed: str = schedules.DEFAULT_MISSED,
        cap: int = schedules.DEFAULT_CAP,
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
        **policy: Any,
    ) -> Callable[[F], F]:
        """Register a function and run it on a schedule, once per tick across every manager
        of the queue: `@registry.periodic("0 3 * * *", tz="Europe/Paris")`,
        `@registry.periodic("every 30s")`. `name` names the schedule (default: the function's
        registered name); `missed` says what to do with ticks that passed while no manager
        ran: "skip", "once" (the default: one run) or "all" (up to `cap`); `args` and `kwargs`
        are each tick's arguments; `policy` is `job`'s (max_attempts, timeout, ...).
        Stack several `periodic` on one function (each with its own `name`) for several times."""
        timing = schedules.Timing(when, tz)  # checked now, not at the first tick

        def declare(function: F) -> F:
            entry = registration_of(function)
            if entry is not None and policy:
                raise InvalidJob(
                    f"{entry.name} is registered already: give its policy ({', '.join(sorted(policy))}) "
                    "where it is registered (the decorator nearest the function)"
                )
            entry = entry or registration_of(self.job(**policy)(function))
            assert entry is not None
            entry.check_arguments(tuple(args), kwargs or {})
            self._declare(
                schedules.declared(
                    name or schedules.name_for(entry.name),
                    timing.text,
                    entry.name,
                    tz=timing.tz,
                    args=tuple(args),
                    kwargs=kwargs,
                    missed=missed,
                    cap=cap,
                )
            )
            return function

        return declare

    def _declare(self, schedule: Schedule) -> None:
        if schedule.name in self._schedules:
            raise InvalidJob(f"schedule {schedule.name!r} is declared twice: give each periodic() its own name=")
        self._schedules[schedule.name] = schedule

    @property
    def schedules(self) -> list[Schedule]:
        """The schedules declared with `periodic` (or `job(schedule=...)`)."""
        return list(self._schedules.values())

    def _add(self, entry: Registered) -> None:
        if not entry.name or entry.name.strip() != entry.name:
            raise InvalidJob(f"job name {entry.name!r} is empty or has surrounding spaces")
        known = self._by_name.get(entry.name)
        if known is not None and known.fn is not entry.fn:
            raise InvalidJob(
                f"job name {entry.name!r} is already registered for {known.fn!r}; pass name= to tell them apart"
            )
        self._by_name[entry.name] = entry

    def get(self, name: str) -> Registered:
        """Return the function registered as `name`, or raise UnknownCallable."""
        try:
            return self._by_name[name]
        except KeyError:
            known = ", ".join(sorted(self._by_name)[:10]) or "none"
            raise UnknownCallable(
                f"no function is registered as {name!r} (registered: {known}); "
                "register it with @registry.job in the module the manager loads with --app"
            ) from None

    def lookup(self, name: str) -> Registered | None:
        """The function registered as `name`, or None."""
        return self._by_name.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._by_name))

    def __len__(self) -> int:
        return len(self._by_name)


def default_name(fn: Callable[..., Any]) -> str:
    """`module.qualname`, the name a function is registered under by default."""
    return f"{fn.__module__}.{fn.__qualname__}"


def registration_of(fn: Callable[..., Any]) -> Registered | None:
    """The registration a decorated function carries, or None."""
    entry = getattr(fn, _ATTRIBUTE, None)
    return entry if isinstance(entry, Registered) else None
