"""Hostile documents, and what may stand where a reader expects a file, for the readers of
a queue's files (tests/security/test_hostile_documents.py).

Whatever someone other than the queue's managers wrote (a member's submission, a job's own
files in its run folder, a `job.json` put in `ready/` by hand) reaches forkvisor as bytes.
The strategies here make those bytes as an attacker or a broken writer would:

- JSON text put together piece by piece, so that it can hold what `json.dumps` never
  writes: NaN, Infinity, 1e400, integers of thousands of digits, duplicate keys, lone
  surrogates, control characters, nesting past any limit;
- a reader's own valid document with a few fields made hostile, removed, repeated or
  added, so that the checks after the parse are reached too; or with some fields swapped
  for hostile values of the same kind (text for text), which every check lets through to
  whatever prints or computes with them;
- bytes that are no JSON at all, or JSON in another encoding, truncated, or followed by junk.

A `Planting` is what stands at a file's place: such bytes in a regular file, or a link out
of the queue, a fifo, a socket, a device, a folder, a sparse file over every size limit, or
nothing. Ids the test only knows once its queue exists are written as placeholders
(`@LIVE@`...) and filled in by `Planting.bound`.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, replace
from pathlib import Path

from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from tests.faults.conftest import Outside, plant_entry

# Placeholders for job ids, filled in once the example's queue holds such jobs.
LIVE, DONE, DEAD, SELF = "@LIVE@", "@DONE@", "@DEAD@", "@SELF@"

# -- JSON text, piece by piece ---------------------------------------------------------------


def _digits(count: int) -> str:
    return "1" + "0" * (count - 1)


# Python's parser reads these as floats that are not finite, which no encoder writes back
# as JSON and no arithmetic on a time or a duration survives.
NOT_FINITE = ["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1E+999999999", f"{_digits(401)}.0", "-NaN"]
# Numbers at the edges of what the readers check: pids, priorities, epochs, 32 and 64 bits.
EDGES = [
    "0",
    "-0",
    "-0.0",
    "1",
    "-1",
    "2",
    "0.5",
    "1.0",
    "63",
    "64",
    "65",
    "100",
    "101",
    "-100",
    "-101",
    "1000000",
    "1000001",
    "4194304",
    "4194305",
    "2147483648",
    "4294967296",
    "9223372036854775808",
    "18446744073709551616",
    "9999999999",
    "9999999999999",
    "10000000000000",
    "253402300800",
    "1e20",
    "-1e20",
    "1e300",
    "1.7976931348623157e308",
    "5e-324",
    "1e-400",
    "1795430400.0",
]
# Integers of thousands of digits: Python reads up to 4300 digits, then refuses (ValueError);
# one of 400 digits is too large for any float, one of 20 for 64 bits.
BIG_INTEGERS = st.sampled_from([20, 40, 309, 400, 4000, 4300, 4301, 20_000]).flatmap(
    lambda count: st.sampled_from([_digits(count), "-" + _digits(count)])
)
NUMBERS: SearchStrategy[str] = st.one_of(
    st.sampled_from(NOT_FINITE),
    st.sampled_from(EDGES),
    BIG_INTEGERS,
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(json.dumps),
)

# Pieces of a JSON string: escapes of lone surrogates, terminal controls, bidirectional
# overrides, raw control characters (not JSON), and text that means something elsewhere.
STRING_PIECES = [
    "\\ud800",
    "\\udfff",
    "\\udc80",
    "\\udc9b",
    "\\ud83d\\ude00",
    "\\u0000",
    "\\u001b[2J",
    "\\u001b]0;owned\\u0007",
    "\\u009b31m",
    "\\u202e",
    "\\u2066",
    "\\r",
    "\\n",
    "\\t",
    "\\\\",
    '\\"',
    "\\ufeff",
    "\\uffff",
    "\x01",
    "\x7f",
    "\u202e",
    "\u0085",
    "a",
    " ",
    "é",
    "汉",
    "🙂",
    "../",
    "%s",
    "$(id)",
]
# Text that breaks printing: a lone surrogate no encoder takes, one that surrogateescape
# turns into a raw C1 byte (CSI), terminal escapes, a bidirectional override, a forged line.
PRINT_BREAKERS = ["\ud800", "a\udc9bb", "\x1b[2J\x1b]0;owned\x07", "\u202eevil", "line\nforged line", "\x00"]
# Text some reader takes for a name, a duration, a size, a backoff or an id.
KNOWN_TEXTS = [
    "",
    "sample.echo",
    "forkvisor.command",
    "os.system",
    "x" * 501,
    "../../etc/passwd",
    "fixed 30s",
    "exponential 1s 5m",
    "none",
    "fixed 99999999999999999999999d",
    "fixed 1e400s",
    "fixed nans",
    "fixed infs",
    "exponential 5m 1s",
    "exponential 0s 0s",
    "fixed -1s",
    "custom (wait_chain)",
    "30s",
    "5m",
    "512M",
    "1e400M",
    "NaN",
    "inf",
    "job",
    "function",
    "queue",
    "default",
    "killed by SIGKILL",
    "exited 1",
    "timeout",
    "20261123-103300-123456-a1b2c3d4",
    "20260230-000000-000000-00000000",
    LIVE,
    DONE,
    DEAD,
    SELF,
]
STRINGS: SearchStrategy[str] = st.one_of(
    st.text(max_size=20).map(json.dumps),
    st.text(max_size=20).map(lambda text: json.dumps(text, ensure_ascii=False)),
    st.lists(st.sampled_from(STRING_PIECES), max_size=8).map(lambda pieces: '"' + "".join(pieces) + '"'),
    st.sampled_from([600, 10_001, 70_000]).map(lambda size: '"' + "x" * size + '"'),
    st.sampled_from(KNOWN_TEXTS).map(json.dumps),
    st.sampled_from(PRINT_BREAKERS).map(json.dumps),
)
KEYS: SearchStrategy[str] = st.one_of(
    st.text(max_size=8).map(json.dumps),
    st.lists(st.sampled_from(STRING_PIECES), min_size=1, max_size=3).map(lambda pieces: '"' + "".join(pieces) + '"'),
)
SCALARS: SearchStrategy[str] = st.one_of(st.sampled_from(["null", "true", "false"]), NUMBERS, STRINGS)


def _array(items: list[str]) -> str:
    return "[" + ",".join(items) + "]"


def _object(members: list[tuple[str, str]]) -> str:
    """A JSON object of (key text, value text) members, in order, duplicates kept."""
    return "{" + ",".join(f"{key}:{value}" for key, value in members) + "}"


# Nesting around the readers' limit of 64 levels, and far past it (the standard library
# recurses once per level); closed or not.
DEEP: SearchStrategy[str] = st.sampled_from([63, 64, 65, 1000, 100_000]).flatmap(
    lambda depth: st.sampled_from(["[" * depth + "]" * depth, '{"a":' * depth + "1" + "}" * depth, "[" * depth])
)
VALUES: SearchStrategy[str] = st.one_of(
    st.recursive(
        SCALARS,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4).map(_array),
            st.lists(st.tuples(KEYS, inner), max_size=4).map(_object),
        ),
        max_leaves=8,
    ),
    DEEP,
)

# -- documents --------------------------------------------------------------------------------

Fields = dict[str, str]  # a document's members: key -> JSON text of the value
JUNK: SearchStrategy[bytes] = st.one_of(
    st.binary(max_size=64),
    st.sampled_from(
        [
            b"",
            b" \n\t ",
            b"{",
            b"}",
            b'{"a":',
            b"\x00" * 16,
            b"\xff\xfe\xfd",
            b"\xef\xbb\xbf{}",
            b"null",
            b"[]",
            b'"a string"',
            b"1",
            b"{}{}",
            b"\x1b[2J\x1b]0;owned\x07",
        ]
    ),
)


def documents(
    base: Fields, extra: dict[str, SearchStrategy[str]] | None = None, *, weight: int = 3
) -> SearchStrategy[bytes]:
    """The bytes a reader of `base`'s kind may find: `base` with up to three fields made
    hostile, removed, repeated or added (`extra`: fields it may gain, with values of their
    own; any field may also get any value); `base` with any of its fields swapped for a
    hostile value of the same kind (text for text, a number for a number); `base` itself
    in another encoding, cut short or followed by junk; any JSON value; or no JSON at all."""
    extra = extra or {}
    valid = _object([(json.dumps(key), value) for key, value in base.items()])
    mutated = _mutated(base, extra).map(lambda text: text.encode("utf-8"))
    tainted = tainted_documents(base)
    return st.one_of(
        *([mutated, tainted] * weight),  # the most reach the checks after the parse
        st.sampled_from(["utf-16", "utf-32", "utf-8-sig", "cut", "junk after"]).map(lambda how: _recoded(valid, how)),
        VALUES.map(lambda text: text.encode("utf-8")),
        JUNK,
    )


def _recoded(text: str, how: str) -> bytes:
    if how == "cut":
        return text.encode()[: len(text) // 2]
    if how == "junk after":
        return text.encode() + b"\x00}{garbage"
    return text.encode(how)  # json.loads of bytes guesses UTF-16 and UTF-32 from the first bytes


TEXTS: SearchStrategy[str] = st.one_of(
    st.sampled_from(PRINT_BREAKERS).map(json.dumps),
    st.lists(st.sampled_from(STRING_PIECES), min_size=1, max_size=6).map(lambda pieces: '"' + "".join(pieces) + '"'),
    st.sampled_from(KNOWN_TEXTS).map(json.dumps),
)
"""Text of the kind that breaks printing: lone surrogates, escapes, bidirectional controls."""


def tainted_documents(base: Fields) -> SearchStrategy[bytes]:
    """`base` with any of its fields swapped for a hostile value of the same kind: documents
    every check lets through, for what prints them or computes with them."""
    return _tainted(base).map(lambda text: text.encode("utf-8"))


@st.composite
def _tainted(draw: st.DrawFn, base: Fields) -> str:
    """`base` with any of its fields swapped for a hostile value of the same kind, so that a
    document stays of the right shape and reaches whatever prints or computes with it."""
    members = []
    for key, value in base.items():
        if draw(st.integers(min_value=0, max_value=3)) == 0:  # a few at a time: most stay valid
            kind = TEXTS if value.startswith('"') else VALUES if value[0] in "[{" else NUMBERS
            value = draw(kind)
        members.append((json.dumps(key), value))
    return _object(members)


@st.composite
def _mutated(draw: st.DrawFn, base: Fields, extra: dict[str, SearchStrategy[str]]) -> str:
    """`base` with up to three fields replaced, removed, repeated, or added (see `documents`)."""
    members = [(json.dumps(key), value) for key, value in base.items()]
    names = sorted({*base, *extra})
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        how = draw(st.sampled_from(["replace", "remove", "repeat", "add"]))
        name = draw(st.sampled_from(names))
        value = draw(st.one_of(extra[name], SCALARS, VALUES) if name in extra else st.one_of(SCALARS, VALUES))
        if how == "remove":
            members = [member for member in members if member[0] != json.dumps(name)]
        elif how == "replace":
            members = [(key, value if key == json.dumps(name) else old) for key, old in members]
            if json.dumps(name) not in (key for key, _ in members):
                members.append((json.dumps(name), value))
        elif how == "repeat":
            members.append((json.dumps(name), value))  # JSON allows it: the last one wins in Python
        else:
            members.append((draw(KEYS), value))
    return _object(members)


def _ids(*items: str) -> str:
    return json.dumps(list(items))


JOB: Fields = {
    "function": '"sample.echo"',
    "args": '[1, "a"]',
    "kwargs": '{"x": 2}',
    "priority": "0",
    "created": "1795430400.0",
    "metadata": "{}",
}
"""A job's `job.json` (docs/FORMAT.md), as a member or the owner's own script writes it."""

JOB_EXTRA: dict[str, SearchStrategy[str]] = {
    "format": st.sampled_from(["1", "2", "1.0", "0", '"1"', "99999999999999999999"]),
    "id": st.sampled_from([json.dumps(SELF), json.dumps(LIVE), '"../x"', "1"]),
    "max_attempts": st.sampled_from(["1", "0", "-1", "1000000", "1000001", "3.0", _digits(400)]),
    "timeout": st.sampled_from(["0", "60", "-1", "1e300", "3155760000", "3155760001", "0.001"]),
    "memory_limit": st.sampled_from(["0", "1", "-1", _digits(31), "1e18", '"512M"']),
    "backoff": st.sampled_from(KNOWN_TEXTS).map(json.dumps),
    "key": st.sampled_from(['"k"', '""', json.dumps("k" * 201), '"\\u0000"', '"a\\nb"', '"..\\/x"', "1"]),
    "depends_on": st.sampled_from(
        [
            _ids(LIVE),
            _ids(DONE),
            _ids(DEAD),
            _ids(SELF),
            _ids(LIVE, LIVE),
            _ids(DONE, DEAD, LIVE),
            _ids("20200101-000000-000000-0badc0de"),
            _ids("20260230-000000-000000-00000000"),
            '["../x"]',
            json.dumps(LIVE),
            "[]",
            _ids(*(f"20200101-000000-{n:06d}-0badc0de" for n in range(1001))),
        ]
    ),
    "allow_failure": st.sampled_from(["true", "false", "1", "null"]),
    "run_at": st.sampled_from(["0", "1", "-1", "1e20", "9999999999.999", "10000000000", "4102444800", '"soon"']),
    "submitted_by": st.sampled_from(['{"uid": 0}', '{"uid": 1000, "user": "bob"}', '{"uid": -1}', "0", '"root"']),
}

PROGRESS: Fields = {"done": "3", "total": "10", "message": '"resized a.png"', "at": "1795555622.31"}
"""`attempt-N/progress.json`, as `jobs.current().progress` writes it."""

ERROR: Fields = {
    "type": '"ValueError"',
    "message": '"bad input"',
    "traceback": '"Traceback (most recent call last):\\n  File \\"tasks.py\\", line 1\\nValueError: bad input\\n"',
}
"""`attempt-N/error.json`, as the job's child records an exception."""

OUTCOME: Fields = {
    "run": "1",
    "attempt": "1",
    "max_attempts": "3",
    "status": '"exited 1"',
    "exit_code": "1",
    "signal": "null",
    "limit": "null",
    "released": "false",
    "succeeded": "false",
    "host": '"node7"',
    "pid": "4121",
    "started": "1795430400.0",
    "ended": "1795430401.5",
    "wall_time": "1.5",
    "cpu_user": "0.25",
    "cpu_system": "0.05",
    "max_rss_kb": "20480",
    "error": '{"type": "ValueError", "message": "bad input"}',
    "stderr_tail": '""',
}
"""`attempt-N/outcome.json` as a manager writes it (the job may write one first)."""

POLICY: Fields = {
    "max_attempts": "5",
    "timeout": "60",
    "memory_limit": "null",
    "backoff": '"exponential 2s 10m"',
    "sources": '{"max_attempts": "function", "timeout": "job", "memory_limit": "default", "backoff": "function"}',
}
"""`attempt-N/policy.json` as a claim writes it (a job run as the owner's user may rewrite it)."""

RESULT: Fields = {"value": "[1, 2, 3]"}

PIDS: SearchStrategy[bytes] = st.one_of(
    st.sampled_from(
        [
            b"4121\n",
            b"0",
            b"1",
            b"2",
            b"-5",
            b"4194304",
            b"4194305",
            b" 77 \n",
            b"1_000",
            b"0x10",
            b"1e3",
            b"NaN",
            "\uff11\uff12".encode(),
            "\u0661\u0662".encode(),
            b"9" * 32,
            b"9" * 33,
            b"",
        ]
    ),
    st.integers().map(lambda number: str(number).encode()),
    st.binary(max_size=40),
)
"""`attempt-N/pid`: the child's pid, as decimal text."""

OUTPUTS: SearchStrategy[bytes] = st.one_of(
    st.binary(max_size=200),
    st.sampled_from([b"\x1b[2J\x1b]0;owned\x07", b"\xff\xfe\xfd", "\u202e\u2066".encode(), b"\x00" * 100, b"\x9b31m"]),
)
"""`attempt-N/stdout` and `stderr`: whatever the job printed."""

COUNTERS: SearchStrategy[bytes] = st.one_of(
    st.sampled_from(
        [b"", b"0", b"1\n", b"3", b"-1", b"1.5", b" 2 ", b"junk", "\u0661".encode(), b"9" * 20, b"9" * 64, b"9" * 65]
    ),
    st.binary(max_size=16),
)
"""A job's `attempts` counter."""

# -- what stands where a file is expected -------------------------------------------------------

NOT_FILES = [
    "missing",
    "fifo",
    "socket",
    "device",
    "folder",
    "link-secret",
    "link-fifo",
    "link-job",
    "dangling",
    "oversize",
]


@dataclass(frozen=True)
class Planting:
    """What stands at a file's place: `kind` is "file" (holding `data`) or one of `NOT_FILES`."""

    kind: str
    data: bytes = b""

    def bound(self, **ids: str) -> Planting:
        """This planting with the id placeholders (`LIVE=...`) replaced by real ids."""
        data = self.data
        for name, job_id in ids.items():
            data = data.replace(f"@{name}@".encode(), job_id.encode())
        return replace(self, data=data)


def plantings(content: SearchStrategy[bytes], *, files_weight: int = 3) -> SearchStrategy[Planting]:
    """Mostly files holding `content`; otherwise anything else that can stand at a name."""
    as_file = content.map(lambda data: Planting("file", data))
    return st.one_of(*([as_file] * files_weight), st.sampled_from(NOT_FILES).map(Planting))


def files_only(content: SearchStrategy[bytes]) -> SearchStrategy[Planting]:
    return content.map(lambda data: Planting("file", data))


def plant(path: Path, planting: Planting, outside: Outside, oversize: int) -> None:
    """Put `planting` at `path` (replacing what is there); "oversize" is a sparse file of
    `oversize` bytes starting with the planting's data, which costs no disk."""
    if os.path.lexists(path):
        os.unlink(path)
    kind = planting.kind
    if kind == "missing":
        return
    if kind == "file":
        path.write_bytes(planting.data)
    elif kind == "oversize":
        with open(path, "wb") as file:
            file.write(planting.data)
            file.truncate(oversize)
    elif kind == "socket":
        os.mknod(path, stat.S_IFSOCK | 0o600)
    elif kind == "device":
        _plant_device(path)
    elif kind == "folder":
        path.mkdir()
        (path / "job.json").write_bytes(planting.data or Outside.JOB)
    else:
        plant_entry(path, kind, outside)  # links out of the queue, a dangling one, a fifo


def _plant_device(path: Path) -> None:
    """/dev/zero's device: endless bytes to whoever reads it. Without the right to make
    devices, a fifo stands in (what no reader may open and wait on either)."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 5))
    except PermissionError:
        os.mkfifo(path)


CLI_DRIVER = r"""
import base64, io, json, signal, sys, time
from supervisor.cli import main

def expire(signum, frame):
    raise TimeoutError("the command blocked for over %s seconds" % limit)

limit = float(sys.argv[1])
signal.signal(signal.SIGALRM, expire)
results = []
for argv in json.loads(sys.argv[2]):
    real = sys.stdout, sys.stderr
    out = io.TextIOWrapper(io.BytesIO(), encoding=real[0].encoding, errors=real[0].errors, write_through=True)
    err = io.TextIOWrapper(io.BytesIO(), encoding=real[1].encoding, errors=real[1].errors, write_through=True)
    sys.stdout, sys.stderr = out, err
    started = time.monotonic()
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        sys.stdout, sys.stderr = real
    results.append({
        "argv": argv,
        "code": code,
        "seconds": time.monotonic() - started,
        "out": base64.b64encode(out.buffer.getvalue()).decode(),
        "err": base64.b64encode(err.buffer.getvalue()).decode(),
    })
print(json.dumps(results))
"""
"""Runs several `forkvisor` commands (`supervisor.cli.main`, what the installed script calls)
in one fresh process, each with stdout and stderr as a pipe would have them (the same
encoding and error handler) and an alarm after argv[1] seconds; prints, as JSON, each
command's exit code, time and output (base64). One process for all of an example's commands
costs one interpreter start instead of ten."""
