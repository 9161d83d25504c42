"""The status page in a real browser: headless Chromium loads it against a live manager
and reads what a person would see, opening the URL `forkvisor web` printed (the token in
it), as a person would. Skipped (with the reason) where Chromium is not installed;
`.ci/run` installs it. The screenshot is kept in the test's folder (and in
$FORKVISOR_SCREENSHOTS, if set) for a person to look at."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from jobs import Queue, State
from tests import sample_jobs
from tests.conftest import wait_until
from tests.processes import Processes
from tests.supervisor.test_web import runtime, start_web

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (Debian package chromium)"),
    pytest.mark.usefixtures(runtime.__name__),  # the server's token kept in the test's folder
]


def _browser(tmp_path: Path, url: str, *options: str) -> subprocess.CompletedProcess[str]:
    """Chromium, headless, run until the page has run its scripts for a few seconds."""
    assert CHROMIUM is not None
    return subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",  # as root in CI; the page is ours
            "--disable-gpu",
            "--hide-scrollbars",
            f"--user-data-dir={tmp_path / 'chromium'}",
            "--virtual-time-budget=5000",
            *options,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def _dom(tmp_path: Path, url: str) -> str:
    done = _browser(tmp_path, url, "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _counts(dom: str) -> dict[str, int]:
    """The counts by state, as the page shows them."""
    return {state: int(n) for state, n in re.findall(r'data-state="(\w+)"><b>(\d+)</b>', dom)}


@pytest.mark.slow
def test_a_person_sees_the_counts_change_and_a_dead_jobs_cause(
    procs: Processes, queue: Queue, barriers: Path, tmp_path: Path
) -> None:
    release = barriers / "release"
    dead = queue.with_options(max_attempts=1).enqueue(sample_jobs.fail, "the disk is on fire <script>alert(1)</script>")
    waiting = [queue.enqueue(sample_jobs.wait_release, str(barriers / f"started-{n}"), str(release)) for n in range(2)]
    manager = procs.run_manager(queue)
    wait_until(lambda: queue.job(dead).state is State.DEAD, 15, "the failing job died")
    wait_until(lambda: all((barriers / f"started-{n}").exists() for n in range(2)), 15, "the others started")
    server, web = start_web(procs, queue.path)

    refused = _dom(tmp_path, web.url + "/")  # without the token: the page, but none of the queue's data
    assert "a token is needed" in refused, refused
    assert str(queue.path) not in refused
    assert dead not in refused

    before = _dom(tmp_path, web.page())
    assert _counts(before) == {
        "incoming": 0,
        "ready": 0,
        "scheduled": 0,
        "waiting": 0,
        "claimed": 2,
        "done": 0,
        "dead": 1,
    }, before
    assert "managers alive: 1" in before
    assert all(job_id in before for job_id in waiting)  # the running table

    release.touch()
    wait_until(lambda: queue.counts()["done"] == 2, 15, "the jobs finished")
    shown: list[str] = []

    def page_shows_them_done() -> bool:
        shown[:] = [_dom(tmp_path, web.page())]  # a new look, as a person reloading (or waiting 2s)
        return _counts(shown[0]).get("done") == 2

    wait_until(page_shows_them_done, 30, "the page shows the jobs done")
    assert _counts(shown[0])["claimed"] == 0, shown[0]

    page = _dom(tmp_path, web.page(f"#/job/0/{dead}"))
    cause = re.search(r'<p class="error cause">(.*?)</p>', page)
    assert cause is not None, page
    assert "the disk is on fire &lt;script&gt;alert(1)&lt;/script&gt;" in cause.group(1)  # shown, not run
    assert "<script>alert(1)" not in page

    shot = tmp_path / "status.png"
    done = _browser(tmp_path, web.page(), "--window-size=1280,1000", f"--screenshot={shot}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 20_000  # a page, not a blank
    if os.environ.get("FORKVISOR_SCREENSHOTS"):
        shutil.copy(shot, Path(os.environ["FORKVISOR_SCREENSHOTS"]) / "status.png")
    for process in (server, manager):
        process.terminate()
        assert procs.wait_exit(process, 15, "it stops") == 0
