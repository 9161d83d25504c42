"""The registry: the only functions a manager will ever run, by name.

A job names its function as a string in `job.json`; a manager runs it only if
that name is in the registry it was given. Nothing is ever unpickled, so a
job file cannot make a manager run code it was not told about.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from jobs.errors import InvalidJob, UnknownCallable
from jobs.job import JobOptions
from jobs.retry import DEFAULT_WAIT, WaitStrategy

F = TypeVar("F", bound=Callable[..., Any])
_ATTRIBUTE = "__forkvisor_job__"


@dataclass(frozen=True)
class Registered:
    """A registered function and its defaults."""

    name: str
    fn: Callable[..., Any]
    max_attempts: int | None = None  # None: the queue's default
    timeout: float | None = None
    memory_limit: int | None = None
    retry: WaitStrategy = DEFAULT_WAIT


class Registry:
    """Named callables a manager may run."""

    def __init__(self) -> None:
        self._by_name: dict[str, Registered] = {}

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
        timeout: float | None = None,
        memory_limit: int | None = None,
        retry: WaitStrategy = DEFAULT_WAIT,
    ) -> Callable[[F], F]: ...

    def job(
        self,
        fn: F | None = None,
        /,
        *,
        name: str | None = None,
        max_attempts: int | None = None,
        timeout: float | None = None,
        memory_limit: int | None = None,
        retry: WaitStrategy = DEFAULT_WAIT,
    ) -> F | Callable[[F], F]:
        """Register a function; use as `@registry.job` or `@registry.job(max_attempts=5)`."""
        JobOptions(max_attempts=max_attempts, timeout=timeout, memory_limit=memory_limit)

        def register(function: F) -> F:
            entry = Registered(
                default_name(function) if name is None else name, function, max_attempts, timeout, memory_limit, retry
            )
            self._add(entry)
            setattr(function, _ATTRIBUTE, entry)
            return function

        return register(fn) if fn is not None else register

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
