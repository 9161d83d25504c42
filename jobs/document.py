"""JSON documents read from a queue folder, which anyone who may write the queue wrote.

Every document is read with the safe reader (`files.read_limited`: no links,
fifos or devices, a size limit) and parsed here, so that no entry can stop a
loop: JSON nested deeper than `MAX_DEPTH` is refused before anything walks it
(the standard library recurses once per level, in the parser and the encoder
alike, and a `RecursionError` in a manager would stop it), a number that is not
finite is refused wherever it stands (Python's parser reads `NaN`, `Infinity`
and `1e400` as floats, which the encoders then refuse or write as invalid JSON,
and which no arithmetic on a time or a duration survives), and every failure
(`ValueError`, `RecursionError`, `MemoryError`) becomes `InvalidJob` naming what
was read, where in it, and why.
"""

from __future__ import annotations

import json
import math
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
    depth, finite = _walk(value, max_depth)
    if depth > max_depth:
        raise InvalidJob(f"{what} is nested too deeply to read (JSON nested over {max_depth} levels)")
    if not finite:
        where, number = _first_not_finite(value)
        raise InvalidJob(f"{what}: {where} is {number!r}, and numbers must be finite (JSON has no NaN or Infinity)")
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


def too_deep(value: Any, max_depth: int = MAX_DEPTH) -> bool:
    """Whether `value`, written as JSON (a tuple as an array), nests deeper than a reader of
    the queue reads (`parse`): what a writer checks, so that nothing it writes is refused later."""
    return _walk(value, max_depth)[0] > max_depth


def _walk(value: Any, limit: int) -> tuple[int, bool]:
    """How deep `value` nests (counting stops past `limit`) and whether every number in it
    is finite; without recursion, in one pass (every job.json is read this way at its claim)."""
    deepest = 0
    finite = True
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):  # (a tuple only before it is written: it is written as an array)
            children = item
        else:
            if type(item) is float and not math.isfinite(item):
                finite = False
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest, finite
        stack.extend((child, depth + 1) for child in children)
    return deepest, finite


def _first_not_finite(value: Any) -> tuple[str, float]:
    """Where the first number that is not finite stands (`args[2].size`), and the number.
    Walked again only when `_walk` found one: the path costs nothing on the usual read."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, where = stack.pop()
        if isinstance(item, dict):
            stack.extend((child, _key_path(where, key)) for key, child in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend((child, f"{where}[{index}]") for index, child in reversed(list(enumerate(item))))
        elif type(item) is float and not math.isfinite(item):
            return where or "the document", item
    return "the document", math.nan  # not reached: `_walk` found one


def _key_path(where: str, key: str) -> str:
    if key.isidentifier() and len(key) <= 40:
        return f"{where}.{key}" if where else key
    return f"{where}[{json.dumps(key[:40])}]"
