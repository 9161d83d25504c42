"""JSON documents read from a queue folder, which anyone who may write the queue wrote.

Every document is read with the safe reader (`files.read_limited`: no links,
fifos or devices, a size limit) and parsed here, so that no entry can stop a
loop: JSON nested deeper than `MAX_DEPTH` is refused before anything walks it
(the standard library recurses once per level, in the parser and the encoder
alike, and a `RecursionError` in a manager would stop it), and every failure
(`ValueError`, `RecursionError`, `MemoryError`) becomes `InvalidJob` naming what
was read and why.
"""

from __future__ import annotations

import json
from typing import Any

from jobs import files
from jobs.errors import InvalidJob

MAX_DEPTH = 64  # arrays and objects inside each other; JSON arguments rarely go past 5


def parse(data: bytes, what: str, max_depth: int = MAX_DEPTH) -> Any:
    """The JSON value in `data`; InvalidJob saying why `what` is not one."""
    try:
        value = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidJob(f"{what} is not valid JSON ({exc})") from None
    except RecursionError:
        raise InvalidJob(f"{what} is nested too deeply to read (JSON nested over {max_depth} levels)") from None
    except MemoryError:
        raise InvalidJob(f"{what} is too large to read") from None
    if _depth(value, max_depth) > max_depth:
        raise InvalidJob(f"{what} is nested too deeply to read (JSON nested over {max_depth} levels)")
    return value


def read(path: files.StrPath, limit: int, what: str, dir_fd: int | None = None) -> Any:
    """Read and parse a JSON file of the queue; InvalidJob for anything but a regular file
    of at most `limit` bytes holding JSON. FileNotFoundError passes through (callers
    often mean "not there yet")."""
    try:
        data = files.read_limited(path, limit, dir_fd)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise InvalidJob(f"cannot read {what}: {exc.strerror or exc}") from None
    return parse(data, what)


def _depth(value: Any, limit: int) -> int:
    """How deep `value` nests, walked without recursion; stops counting past `limit`."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest
