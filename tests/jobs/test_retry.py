"""Backoffs as data and as tenacity strategies (`jobs.retry`): how each reads, and the
delay each gives, at the edges the rest of the suite does not reach (mutation testing
found them)."""

from __future__ import annotations

import dataclasses

import pytest
import tenacity

from jobs import Backoff
from jobs.retry import DEFAULT_BACKOFF, Described, describe, retry_delay


def test_backoffs_are_values_a_policy_can_share() -> None:
    """A resolved policy is memoized and shared between claims: nothing may change it."""
    for value in (Backoff(1.0, 5.0), Described("fixed 3s")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            value.text = "x" if isinstance(value, Described) else 0  # type: ignore[misc,union-attr]
        assert hash(value) == hash(dataclasses.replace(value))


def test_a_cap_may_equal_the_first_delay_but_not_be_shorter() -> None:
    assert Backoff(5.0, 5.0).cap == 5.0
    with pytest.raises(ValueError, match="cap must not be shorter"):
        Backoff(5.0, 4.0)


@pytest.mark.parametrize(("text", "backoff"), [("5s", Backoff(5.0)), ("7", Backoff(7.0)), ("fixed 2m", Backoff(120.0))])
def test_one_word_that_starts_with_a_digit_is_a_fixed_delay(text: str, backoff: Backoff) -> None:
    assert Backoff.parse(text) == backoff


def test_a_described_backoff_waits_as_its_text_says_else_as_the_default() -> None:
    assert retry_delay(Described("fixed 7s"), 3) == 7.0
    assert retry_delay(Described("exponential 2s 1m"), 1) == pytest.approx(3.0, abs=1.0)  # 2 s + up to 2 s of jitter
    first = retry_delay(Described("custom (my_wait)"), 1)
    assert DEFAULT_BACKOFF.first <= first <= 2 * DEFAULT_BACKOFF.first  # 1 s plus up to 1 s of jitter
    assert retry_delay(Described("custom (my_wait)"), 30) == DEFAULT_BACKOFF.cap


def _jitter(first: float, cap: float, **more: float) -> tenacity.wait_exponential_jitter:
    """tenacity's exponential wait from `first` (tenacity 9 calls it `multiplier`, before `initial`)."""
    try:
        return tenacity.wait_exponential_jitter(multiplier=first, max=cap, **more)
    except TypeError:
        return tenacity.wait_exponential_jitter(initial=first, max=cap, **more)


@pytest.mark.parametrize(
    ("wait", "reads"),
    [
        (Described("custom (my_wait)"), "custom (my_wait)"),
        (tenacity.wait_fixed(5), "fixed 5s"),
        (_jitter(1, 300, jitter=1), "exponential 1s 5m"),
        (_jitter(2, 2, jitter=2), "exponential 2s 2s"),  # a cap equal to the first
        (_jitter(1, 300, jitter=0.5), "custom (wait_exponential_jitter)"),
        (_jitter(1, 300, exp_base=3, jitter=1), "custom (wait_exponential_jitter)"),
        (_jitter(4, 3, jitter=4), "custom (wait_exponential_jitter)"),  # cap < first
        (_jitter(0, 300, jitter=0), "custom (wait_exponential_jitter)"),
        (tenacity.wait_random(1, 2), "custom (wait_random)"),
    ],
)
def test_a_tenacity_wait_reads_as_data_only_when_it_is_one(wait: object, reads: str) -> None:
    assert describe(wait) == reads
