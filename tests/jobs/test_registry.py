"""The registry of callables, and the backoff between attempts."""

from __future__ import annotations

import types

import pytest
import tenacity

from jobs import DEFAULT_BACKOFF, InvalidJob, Registered, Registry, UnknownCallable, retry_delay
from jobs.registry import default_name, registration_of


def test_bare_decorator_registers_under_module_and_qualname() -> None:
    registry = Registry()

    @registry.job
    def thumbnail(path: str) -> str:
        return path

    name = f"{__name__}.test_bare_decorator_registers_under_module_and_qualname.<locals>.thumbnail"
    assert default_name(thumbnail) == name
    assert list(registry) == [name]
    entry = registry.get(name)
    assert entry == Registered(name, thumbnail), "nothing declared: the queue's or the built-in policy applies"
    assert registration_of(thumbnail) is entry
    assert thumbnail("a.png") == "a.png", "the decorator returns the function itself"


def test_decorator_with_options() -> None:
    registry = Registry()
    wait = tenacity.wait_fixed(5)

    @registry.job(name="tasks.resize", max_attempts=5, timeout=60, memory_limit=1 << 28, backoff=wait)
    def resize(path: str) -> str:
        return path

    entry = registry.get("tasks.resize")
    assert (entry.name, entry.fn, entry.max_attempts, entry.timeout, entry.memory_limit) == (
        "tasks.resize",
        resize,
        5,
        60,
        1 << 28,
    )
    assert entry.backoff is wait
    assert "tasks.resize" in registry
    assert default_name(resize) not in registry
    assert len(registry) == 1


def test_decorator_called_without_options() -> None:
    registry = Registry()

    @registry.job()
    def noop() -> None:
        return None

    assert registry.get(default_name(noop)).max_attempts is None  # the queue's default applies


def test_methods_get_their_qualified_name() -> None:
    registry = Registry()

    class Tasks:
        @staticmethod
        def run() -> int:
            return 1

    registry.job(Tasks.run)
    assert default_name(Tasks.run).endswith("<locals>.Tasks.run")
    assert default_name(Tasks.run) in registry


def test_name_collision_is_refused() -> None:
    registry = Registry()

    @registry.job(name="tasks.same")
    def first() -> int:
        return 1

    def second() -> int:
        return 2

    with pytest.raises(InvalidJob, match=r"job name 'tasks\.same' is already registered for .*first.*pass name="):
        registry.job(name="tasks.same")(second)
    assert registry.get("tasks.same").fn is first
    assert registration_of(second) is None


def test_registering_the_same_function_twice_is_allowed() -> None:
    registry = Registry()

    def task() -> None:
        return None

    registry.job(task)
    registry.job(task)
    assert len(registry) == 1


def test_registries_are_independent() -> None:
    one, two = Registry(), Registry()

    @one.job(name="tasks.a")
    def a() -> None:
        return None

    assert "tasks.a" in one
    assert "tasks.a" not in two


@pytest.mark.parametrize("name", [" tasks.a", "tasks.a\n", "\t"])
def test_blank_or_padded_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidJob, match=r"is empty or has surrounding spaces"):
        Registry().job(name=name)(lambda: None)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_attempts": 0}, r"max_attempts must be a whole number of at least 1"),
        ({"max_attempts": True}, r"max_attempts must be a whole number"),
        ({"timeout": -1}, r"timeout must be positive \(or 0 for no limit\), got -1"),
        ({"timeout": "-5s"}, r"timeout '-5s' is negative: a duration must be positive"),
        ({"timeout": "5M"}, r"units are lowercase \(5m is five minutes; M means MiB in sizes\)"),
        ({"memory_limit": -1}, r"memory_limit must be positive"),
        ({"memory_limit": "lots"}, r"memory_limit 'lots' is not a size"),
        ({"backoff": "sometimes"}, r"backoff 'sometimes' is not one: write `fixed 30s`"),
        ({"backoff": 5}, r"backoff must be text such as `exponential 1s 5m` or a tenacity wait"),
        ({"priority": 101}, r"priority 101 is out of range"),
    ],
)
def test_bad_defaults_are_refused_at_decoration(options: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidJob, match=message):
        Registry().job(**options)  # type: ignore[call-overload]  # deliberately bad values


def test_unknown_name_lists_the_registered_ones(registry: Registry, samples: types.SimpleNamespace) -> None:
    with pytest.raises(UnknownCallable) as info:
        registry.get("tasks.missing")
    message = str(info.value)
    assert "no function is registered as 'tasks.missing'" in message
    assert "sample.echo" in message
    assert default_name(samples.add) in message
    assert default_name(samples.resize) in message
    assert "@registry.job" in message
    assert isinstance(info.value, LookupError)


def test_unknown_name_in_an_empty_registry() -> None:
    with pytest.raises(UnknownCallable, match=r"\(registered: none\)"):
        Registry().get("tasks.a")


def test_unknown_name_lists_at_most_ten() -> None:
    registry = Registry()
    for n in range(12):
        registry.job(name=f"tasks.t{n:02d}")(lambda: None)
    with pytest.raises(UnknownCallable) as info:
        registry.get("x")
    assert "tasks.t09" in str(info.value)
    assert "tasks.t10" not in str(info.value)


def test_registration_of_an_undecorated_function_is_none(samples: types.SimpleNamespace) -> None:
    assert registration_of(samples.undecorated) is None
    assert registration_of(samples.echo) is not None


# -- retry delays ------------------------------------------------------------------------


@pytest.mark.parametrize(("attempts", "base"), [(0, 1), (1, 1), (2, 2), (3, 4), (4, 8), (6, 32), (9, 256)])
def test_default_wait_doubles_with_up_to_a_second_of_jitter(attempts: int, base: float) -> None:
    delays = [retry_delay(DEFAULT_BACKOFF, attempts) for _ in range(50)]
    assert all(base <= delay <= base + 1 for delay in delays), delays
    assert len(set(delays)) > 1, "the jitter varies"


@pytest.mark.parametrize("attempts", [10, 11, 20, 1000])
def test_default_wait_is_capped_at_five_minutes(attempts: int) -> None:
    delays = [retry_delay(DEFAULT_BACKOFF, attempts) for _ in range(20)]
    assert all(300 <= delay <= 301 for delay in delays), delays


def test_default_wait_grows() -> None:
    lows = [min(retry_delay(DEFAULT_BACKOFF, n) for _ in range(10)) for n in range(1, 12)]
    assert lows == sorted(lows)
    assert lows[0] < 2
    assert lows[-1] >= 300


@pytest.mark.parametrize("attempts", [0, 1, 2, 7, 50])
def test_wait_fixed(attempts: int) -> None:
    assert retry_delay(tenacity.wait_fixed(5), attempts) == 5.0


def test_wait_chain_sees_the_attempt_number() -> None:
    wait = tenacity.wait_chain(tenacity.wait_fixed(1), tenacity.wait_fixed(10), tenacity.wait_fixed(100))
    assert [retry_delay(wait, n) for n in (1, 2, 3, 4)] == [1.0, 10.0, 100.0, 100.0]


def test_wait_exponential_without_jitter() -> None:
    wait = tenacity.wait_exponential(multiplier=2, max=60)
    assert [retry_delay(wait, n) for n in (1, 2, 3, 4, 5, 6)] == [2.0, 4.0, 8.0, 16.0, 32.0, 60.0]


def test_a_negative_wait_counts_as_none() -> None:
    assert retry_delay(lambda state: -3.0, 1) == 0.0
