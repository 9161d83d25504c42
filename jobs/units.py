"""Durations, sizes and moments as people write them, for the CLI and the Python API alike.

    durations  90, 1.5, 500ms, 30s, 5m, 2h, 7d, 1w, 1h30m; or a `timedelta` from Python
    sizes      4096, 100k, 512M, 2G (powers of 1024)
    moments    epoch seconds, or an aware `datetime` from Python

Units of durations are lowercase: `5M` is refused, since M means MiB in sizes.

Every value is bounded, whoever wrote it (a member's submission, a job's record, the
command line): a duration is at most `MAX_DURATION`, a size at most `MAX_SIZE`, a moment
lies between the epoch and `LATEST_MOMENT`. A value past them is refused with words, not
carried into arithmetic that overflows later (a backoff of a billion billion days once
sent a retried job out of the state folders: its due time no longer fit a name).
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timedelta

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmg]?)(?:i?b)?", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}
MAX_DURATION = 100 * 365 * 86400.0  # a century: longer than any timeout, delay or backoff means a typo
MAX_SIZE = 2**62  # bytes: past any machine's memory, within a signed 64-bit limit
LATEST_MOMENT = 9_999_999_999.0  # epoch seconds in 13 digits of milliseconds (scheduled/ names): the year 2286
DURATION_HELP = "write seconds (90) or a number with a unit (500ms, 30s, 5m, 2h, 7d, 1w, 1h30m)"


def parse_duration(text: str) -> float:
    """Seconds in `90`, `1.5`, `500ms`, `30s`, `5m`, `2h`, `7d`, `1w` or `1h30m`; raise ValueError."""
    cleaned = text.strip()
    if cleaned.startswith("-"):
        raise ValueError(f"{text!r} is negative: a duration must be positive")
    try:
        seconds = float(cleaned)
    except ValueError:
        parts = _PART.findall(cleaned)
        if not parts or "".join(number + unit for number, unit in parts) != cleaned:
            hint = (
                "; units are lowercase (5m is five minutes; M means MiB in sizes)" if cleaned != cleaned.lower() else ""
            )
            raise ValueError(f"{text!r} is not a duration: {DURATION_HELP}{hint}") from None
        seconds = sum(float(number) * _UNITS[unit] for number, unit in parts)
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{text!r} is not a duration: it must be a finite number of seconds, at least 0")
    return checked_duration(seconds, repr(text))


def checked_duration(seconds: float, shown: str) -> float:
    """`seconds`, if it is at most `MAX_DURATION`; ValueError saying so (`shown` is the value as written)."""
    if seconds > MAX_DURATION:
        raise ValueError(f"{shown} is too long a duration: at most 100 years ({MAX_DURATION:.0f} seconds)")
    return seconds


def format_duration(seconds: float | None) -> str:
    """The shortest of `45s`, `5m`, `2h`, `7d` (or seconds) that is exact; `none` for None."""
    if seconds is None:
        return "none"
    for unit in ("d", "h", "m"):
        size = _UNITS[unit]
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def parse_size(text: str) -> int:
    """Bytes in `4096`, `100k`, `512M`, `2G` (also `512MiB`, `512MB`); raise ValueError."""
    match = _SIZE.fullmatch(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a size: write bytes or 100k, 512M, 2G")
    return checked_size(int(float(match[1]) * _SIZE_UNITS[match[2].lower()]), repr(text))


def checked_size(size: int, shown: str) -> int:
    """`size`, if it is 0 to `MAX_SIZE` bytes; ValueError saying so."""
    if not 0 <= size <= MAX_SIZE:
        raise ValueError(f"{shown} is not a size a machine has: 0 to {MAX_SIZE} bytes")
    return size


def format_size(size: int | None) -> str:
    """`512M`, `2G`, `100k` when exact, else bytes; `none` for None."""
    if size is None:
        return "none"
    for unit in ("G", "M", "k"):
        scale = _SIZE_UNITS[unit.lower()]
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return str(size)


def seconds_of(value: object, name: str) -> float | None:
    """A duration given from Python (number, text or timedelta) in seconds; None stays None.
    Raises ValueError naming `name`."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            return parse_duration(value)
        except ValueError as exc:
            raise ValueError(f"{name} {exc}") from None
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds):
        raise ValueError(
            f"{name} must be a finite number of seconds, a duration such as '5m', or a timedelta, got {value!r}"
        )
    if abs(seconds) > MAX_DURATION:
        raise ValueError(f"{name} of {seconds:g} seconds is too long: at most 100 years ({MAX_DURATION:.0f} seconds)")
    return float(seconds)


def bytes_of(value: object, name: str) -> int | None:
    """A size given from Python (whole bytes, or text such as '512M'); None stays None."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        if abs(value) > MAX_SIZE:
            raise ValueError(f"{name} of {value} bytes is not a size a machine has: at most {MAX_SIZE}")
        return value
    if isinstance(value, str):
        try:
            return parse_size(value)
        except ValueError as exc:
            raise ValueError(f"{name} {exc}") from None
    raise ValueError(f"{name} must be whole bytes or a size such as '512M', got {value!r}")


def epoch_of(value: object, name: str) -> float | None:
    """A moment given from Python (epoch seconds or an aware datetime); None stays None."""
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(
                f"{name}={value!r} has no time zone, so it could mean any of 24 hours: "
                "pass an aware datetime (datetime.now(UTC) + timedelta(...)) or epoch seconds"
            )
        value = value.timestamp()
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be epoch seconds or an aware datetime, got {value!r}")
    if not 0 <= value <= LATEST_MOMENT:
        raise ValueError(
            f"{name}={value:g} is not a moment forkvisor keeps (0 to {LATEST_MOMENT:.0f}, the year 2286): "
            "give epoch seconds, not milliseconds"
        )
    return float(value)
