"""The store never depends on the process side (STYLE.md section 2).

`jobs/` is filesystem and bookkeeping only: it imports nothing from
`supervisor`, nor `signal`, `psutil` or `setproctitle`, and never calls
`os.fork`, `os.kill` or `os.wait*`. Only `supervisor/forking.py` forks.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN_MODULES = {"supervisor", "signal", "psutil", "setproctitle", "subprocess", "multiprocessing"}
FORBIDDEN_OS_CALLS = {"fork", "kill", "killpg", "wait", "waitpid", "wait4", "_exit", "execv", "execvp"}


def _sources(package: str) -> list[Path]:
    return sorted((ROOT / package).glob("*.py"))


def _imported_modules(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def _os_calls(tree: ast.AST) -> set[str]:
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os"
    }


@pytest.mark.parametrize("source", _sources("jobs"), ids=lambda path: path.name)
def test_jobs_module_stays_in_its_layer(source: Path) -> None:
    tree = ast.parse(source.read_text())
    assert not _imported_modules(tree) & FORBIDDEN_MODULES, f"{source.name} imports the process side"
    assert not _os_calls(tree) & FORBIDDEN_OS_CALLS, f"{source.name} manages processes"


def test_only_forking_module_forks() -> None:
    exempt = {"forking.py", "demo.py"}  # demo.py holds job code, which may crash on purpose
    offenders = [
        source.name
        for source in _sources("supervisor")
        if source.name not in exempt
        and {"fork", "_exit", "wait4", "waitpid", "killpg"} & _os_calls(ast.parse(source.read_text()))
    ]
    assert offenders == []


def test_there_is_something_to_check() -> None:
    assert len(_sources("jobs")) >= 8
