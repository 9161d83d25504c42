"""A run's output past its limit: the middle is punched out as the job writes (its file
keeps its length; its blocks go back), and rewritten as head, a line, tail at its end.
Real files in a temporary folder, written through a descriptor held open in append mode,
as a job's stdout is."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobs import output

LIMIT = 256 << 10
LINE = 23  # b"%015d chatty\n"


def numbered(start: int, size: int) -> bytes:
    """Bytes `start` to `start + size` of an output of lines that each say their own
    offset (so a test can tell which part of it was kept)."""
    first = start // LINE * LINE
    data = b"".join(b"%015d chatty\n" % offset for offset in range(first, start + size, LINE))
    return data[start - first : start - first + size]


@pytest.fixture
def run(tmp_path: Path) -> int:
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    yield fd
    os.close(fd)


def append(folder: Path, name: str, size: int) -> int:
    """Append `size` bytes of numbered lines to `name`, as a job would; the size written."""
    path = folder / name
    start = path.stat().st_size if path.exists() else 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, numbered(start, size))
    finally:
        os.close(fd)
    return start + size


def allocated(path: Path) -> int:
    return path.stat().st_blocks * 512


def test_a_running_jobs_output_past_its_limit_gives_its_blocks_back(tmp_path: Path, run: int) -> None:
    stdout = tmp_path / "stdout"
    for _ in range(40):  # 40 MiB in all, bounded after each write as the manager's checks do
        size = append(tmp_path, "stdout", 1 << 20)
        output.bound(run, LIMIT)
        assert allocated(stdout) <= LIMIT + (1 << 20) + 2 * os.statvfs(tmp_path).f_bsize
    assert stdout.stat().st_size == size  # its length (the job's offset) is as written
    with stdout.open("rb") as data:
        assert data.read(LIMIT // 2) == numbered(0, LIMIT // 2)  # the head is whole
        data.seek(size - LIMIT // 2)
        assert data.read() == numbered(size - LIMIT // 2, LIMIT // 2)  # and the tail


def test_at_its_end_the_output_is_its_head_a_line_and_its_tail(tmp_path: Path, run: int) -> None:
    size = append(tmp_path, "stdout", 3 << 20)
    append(tmp_path, "stderr", 1000)
    output.bound(run, LIMIT)
    dropped = output.compact(run, LIMIT)
    assert dropped == {"stdout": size - LIMIT}  # stderr is within its limit: untouched
    line = output.dropped_line("stdout", size - LIMIT, LIMIT)
    assert (tmp_path / "stdout").read_bytes() == (
        numbered(0, LIMIT // 2) + line + numbered(size - LIMIT // 2, LIMIT // 2)
    )
    assert f"{size - LIMIT} bytes of stdout dropped here".encode() in line
    assert (tmp_path / "stderr").read_bytes() == numbered(0, 1000)
    assert sorted(os.listdir(tmp_path)) == ["stderr", "stdout"]  # no staging file left


def test_compacting_keeps_the_files_mode_and_an_output_within_its_limit_as_it_is(tmp_path: Path, run: int) -> None:
    append(tmp_path, "stdout", 2 * LIMIT)
    os.chmod(tmp_path / "stdout", 0o640)
    append(tmp_path, "stderr", LIMIT)
    assert output.compact(run, LIMIT) == {"stdout": LIMIT}
    assert (tmp_path / "stdout").stat().st_mode & 0o777 == 0o640
    assert (tmp_path / "stderr").read_bytes() == numbered(0, LIMIT)


def test_what_a_stream_holds_is_its_blocks_not_its_length(tmp_path: Path, run: int) -> None:
    """Where holes cannot be punched, a run is stopped past its ceiling by what its output
    holds on disk: a job that seeks far has a long file, not a full disk."""
    with (tmp_path / "stdout").open("wb") as stdout:
        stdout.truncate(output.ceiling(LIMIT) * 4)  # one long hole
    assert output.allocated(run) < 64 << 10
    size = append(tmp_path, "stderr", 2 << 20)
    assert size <= output.allocated(run) < size + (64 << 10)
    assert output.ceiling(LIMIT) >= 4 * LIMIT


def test_what_a_job_put_in_place_of_its_output_is_left_alone(tmp_path: Path, run: int) -> None:
    """A job run as its submitter owns its run folder: a link, a fifo or a second name of
    a file in place of its output is neither followed, blocked on, nor rewritten."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(numbered(0, 3 * LIMIT))
    (tmp_path / "stdout").symlink_to(elsewhere)
    os.mkfifo(tmp_path / "stderr")
    output.bound(run, LIMIT)
    assert output.compact(run, LIMIT) == {}
    assert elsewhere.read_bytes() == numbered(0, 3 * LIMIT)
    (tmp_path / "stdout").unlink()
    os.link(elsewhere, tmp_path / "stdout")  # two names: rewriting one would tell the other a lie
    assert output.compact(run, LIMIT) == {}
    assert elsewhere.read_bytes() == numbered(0, 3 * LIMIT)


def test_a_reader_finds_where_the_data_resumes_after_the_dropped_middle(tmp_path: Path, run: int) -> None:
    size = append(tmp_path, "stdout", 4 << 20)
    output.bound(run, LIMIT)
    fd = os.open(tmp_path / "stdout", os.O_RDONLY)
    try:
        start, end = output.data_after(fd, 0)
        assert start == 0
        assert LIMIT // 2 <= end < size - LIMIT // 2
        resumed, stop = output.data_after(fd, end)
        assert end < resumed <= size - LIMIT // 2
        assert stop == size
        assert output.data_after(fd, size) == (size, size)
    finally:
        os.close(fd)


# -- what a job may write, generated -----------------------------------------------------------

WRITES = st.lists(st.tuples(st.integers(0, 300_000), st.binary(min_size=1, max_size=64)), min_size=1, max_size=12)
KINDS = st.sampled_from(["file", "link", "fifo", "folder", "two names"])


@settings(max_examples=40, deadline=None, database=None, derandomize=True)
@given(writes=WRITES, limit=st.integers(1, 200_000), bound_after=st.lists(st.booleans(), max_size=12), kind=KINDS)
def test_whatever_a_job_writes_its_head_and_tail_are_kept_and_nothing_else_is_touched(
    writes: list[tuple[int, bytes]], limit: int, bound_after: list[bool], kind: str
) -> None:
    """Any sizes, any bytes, bounded at any moments, and whatever stands at the output's
    name: a regular file ends as its head, the line and its tail (or whole, within its
    limit); anything else is left as it was; nothing raises."""
    with tempfile.TemporaryDirectory() as folder:
        base = Path(folder)
        target = base / "stdout" if kind in ("file", "two names") else base / "elsewhere"
        written = bytearray()
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            run = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
            try:
                _stand_in(base, kind)
                for index, (size, pattern) in enumerate(writes):
                    chunk = (pattern * (size // len(pattern) + 1))[:size]
                    os.write(fd, chunk)
                    written += chunk
                    if index < len(bound_after) and bound_after[index]:
                        output.bound(run, limit)
                dropped = output.compact(run, limit)
            finally:
                os.close(run)
        finally:
            os.close(fd)
        whole, kept = bytes(written), target.read_bytes()
        if kind != "file":
            assert dropped == {}
            assert kept == whole, "what a job put in place of its output was touched"
        elif len(whole) <= limit:
            assert dropped == {}
            assert kept == whole
        else:
            head, tail = output.head_size(limit), output.tail_size(limit)
            assert dropped == {"stdout": len(whole) - limit}
            assert kept == whole[:head] + output.dropped_line("stdout", len(whole) - limit, limit) + whole[-tail:]


def _stand_in(base: Path, kind: str) -> None:
    """Put at `stdout` what the job put there instead of its output (`elsewhere` is written)."""
    stdout = base / "stdout"
    if kind == "link":
        stdout.symlink_to(base / "elsewhere")
    elif kind == "fifo":
        os.mkfifo(stdout)
    elif kind == "folder":
        stdout.mkdir()
    elif kind == "two names":
        os.link(stdout, base / "another")
