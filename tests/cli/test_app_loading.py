"""`--app` and `--path`, `--version`, and the packages forkvisor finds: each failure is one
line on stderr, exit 111, saying what was wrong and how to fix it; never a traceback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import jobs
from tests.cli.conftest import Result, cli, new_queue, ok, refused
from tests.processes import REPO, forkvisor_command

APP_SOURCE = """\
from jobs import Registry

registry = Registry()


@registry.job(name="tasks.hello")
def hello(name: str) -> str:
    return f"hello {name}"
"""


def _app(folder: Path, source: str = APP_SOURCE, name: str = "tasks") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.py").write_text(source)
    return folder


def _burst(queue: Path, *options: str, cwd: Path) -> Result:
    return cli("run", queue, "--burst", "--lease", "3", "--sweep-interval", "0.5", *options, cwd=cwd)


def test_path_finds_the_app_wherever_the_manager_starts(tmp_path: Path) -> None:
    queue = new_queue(tmp_path / "queue")
    code = _app(tmp_path / "code")
    job_id = ok("enqueue", queue, "tasks.hello", "--args", '["you"]', "--app", "tasks:registry", "--path", code).lines[
        0
    ]
    done = _burst(queue, "--app", "tasks:registry", "--path", code, cwd=tmp_path)
    assert done.code == 0, done
    assert jobs.Queue(queue, create=False).result(job_id, wait=False) == "hello you"


def test_the_current_folder_is_not_searched_unless_asked(tmp_path: Path) -> None:
    """A module planted in the folder a manager happens to start in (a shared queue's folder,
    say) must not be imported by surprise: `--path .` says the current folder is meant."""
    queue = new_queue(tmp_path / "queue")
    here = _app(tmp_path / "here")
    refused(
        _burst(queue, "--app", "tasks:registry", cwd=here),
        111,
        "no module named 'tasks' on the search path",
        "--path DIR",
        "it is in the current folder, which is searched only with --path .",
    )
    assert _burst(queue, "--app", "tasks:registry", "--path", ".", cwd=here).code == 0


@pytest.mark.parametrize(
    ("source", "words"),
    [
        ("x = 1 / 0\n", ["raised ZeroDivisionError: division by zero", "tasks.py:1"]),
        ("import json\n\ndef broken(:\n    pass\n", ["raised SyntaxError: invalid syntax", "tasks.py:3"]),
        ("import sys\nsys.exit(3)\n", ["raised SystemExit: 3", "tasks.py:2"]),
        (
            "import no_such_dependency\n",
            ["importing tasks failed: ModuleNotFoundError", "no_such_dependency", "tasks.py:1"],
        ),
        ("raise KeyError('config')\n", ["raised KeyError: 'config'", "tasks.py:1"]),
    ],
    ids=["zero-division", "syntax", "sys-exit", "missing-dependency", "key-error"],
)
def test_an_app_that_fails_to_import_names_the_module_the_error_and_the_line(
    tmp_path: Path, source: str, words: list[str]
) -> None:
    queue = new_queue(tmp_path / "queue")
    code = _app(tmp_path / "code", source)
    result = _burst(queue, "--app", "tasks:registry", "--path", code, cwd=tmp_path)
    refused(result, 111, "--app tasks:registry", *words)


def test_an_app_named_like_a_forkvisor_package_says_so(tmp_path: Path) -> None:
    queue = new_queue(tmp_path / "queue")
    code = _app(tmp_path / "code", name="jobs")
    result = _burst(queue, "--app", "jobs:registry", "--path", code, cwd=tmp_path)
    refused(result, 111, "`jobs` is forkvisor's own package, which hides a module of yours", "rename yours")


def test_a_registry_that_is_not_one(tmp_path: Path) -> None:
    queue = new_queue(tmp_path / "queue")
    code = _app(tmp_path / "code", "registry = {}\n")
    refused(
        _burst(queue, "--app", "tasks:registry", "--path", code, cwd=tmp_path),
        111,
        "tasks.registry is a dict, not a jobs.Registry",
    )


def test_version_has_one_source(tmp_path: Path) -> None:
    assert ok("--version", cwd=tmp_path).lines == [f"forkvisor {jobs.__version__}"]
    from importlib.metadata import version

    assert version("forkvisor") == jobs.__version__


def _python(*args: str, pythonpath: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def test_a_jobs_module_that_shadows_forkvisor_is_refused_at_start(tmp_path: Path) -> None:
    mine = _app(tmp_path / "mine", "registry = None\n", name="jobs")
    done = subprocess.run(
        [*forkvisor_command(), "--version"],
        env={**os.environ, "PYTHONPATH": str(mine)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 111, done
    assert done.stderr.count("\n") == 1, done.stderr
    assert f"the module `jobs` at {mine / 'jobs.py'} is not forkvisor's and shadows it" in done.stderr
    assert "Traceback" not in done.stderr


def test_supervisord_installed_over_forkvisor_is_refused_at_start(tmp_path: Path) -> None:
    """What pip does when supervisord is installed after forkvisor: its `supervisor/__init__.py`
    replaces ours (the rest of our package stays). Here the same tree is made by hand and put
    first on the path; .ci/check-wheel does it with pip and the real supervisord."""
    site = tmp_path / "site"
    shutil.copytree(REPO / "supervisor", site / "supervisor", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "jobs", site / "jobs", ignore=shutil.ignore_patterns("__pycache__"))
    (site / "supervisor" / "__init__.py").write_text("# this is a package\n")  # supervisord's, word for word
    done = _python("-m", "supervisor.cli", "status", str(tmp_path), pythonpath=site, cwd=tmp_path)
    assert done.returncode == 111, done
    assert done.stderr.count("\n") == 1, done.stderr
    assert (
        "is not forkvisor's: supervisord, whose import name is also `supervisor`, was installed over it" in done.stderr
    )
    assert "separate environments" in done.stderr
