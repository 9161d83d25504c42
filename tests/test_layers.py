"""The layers (STYLE.md section 2, docs/ARCHITECTURE.md).

`jobs/` is filesystem and bookkeeping only: it imports nothing from
`supervisor`, nor `signal`, `psutil` or `setproctitle`, and never calls
`os.fork`, `os.kill` or `os.wait*`. `supervisor/` (its CLI included) uses
`jobs` only through the names `jobs` exports, never a module inside it nor a
queue's private parts. Only `supervisor/forking.py` forks.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import jobs

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN_MODULES = {"supervisor", "signal", "psutil", "setproctitle", "subprocess", "multiprocessing"}
FORBIDDEN_OS_CALLS = {"fork", "kill", "killpg", "wait", "waitpid", "wait4", "_exit", "execv", "execvp"}
FORKING_CALLS = {"fork", "_exit", "wait4", "waitpid", "killpg"}


def _sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


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


def _jobs_imports(tree: ast.AST) -> list[str]:
    """What a module takes from `jobs`: `jobs.X` for a submodule, else the imported names."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.startswith("jobs.")]  # `import jobs` is fine
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "jobs":
                found += [alias.name for alias in node.names]
            elif node.module.startswith("jobs."):
                found.append(node.module)
    return found


def _relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("source", _sources("jobs"), ids=_relative)
def test_jobs_module_stays_in_its_layer(source: Path) -> None:
    tree = ast.parse(source.read_text())
    assert not _imported_modules(tree) & FORBIDDEN_MODULES, f"{source.name} imports the process side"
    assert not _os_calls(tree) & FORBIDDEN_OS_CALLS, f"{source.name} manages processes"


@pytest.mark.parametrize("source", _sources("supervisor"), ids=_relative)
def test_supervisor_uses_only_what_jobs_exports(source: Path) -> None:
    tree = ast.parse(source.read_text())
    private = [name for name in _jobs_imports(tree) if name not in jobs.__all__ and name != "__version__"]
    assert private == [], f"{_relative(source)} reaches inside jobs: {private}; export what it needs from jobs"
    reaching = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in ("folder", "_claimer", "_index", "_publisher")
    ]
    assert reaching == [], f"{_relative(source)} reaches into a Queue's parts at lines {reaching}"


@pytest.mark.parametrize("source", _sources("supervisor"), ids=_relative)
def test_only_the_forking_module_forks(source: Path) -> None:
    exempt = {"forking.py", "demo.py"}  # demo.py holds job code, which may crash on purpose
    if source.name not in exempt:
        assert not FORKING_CALLS & _os_calls(ast.parse(source.read_text())), f"{_relative(source)} forks or reaps"


def test_there_is_something_to_check() -> None:
    assert len(_sources("jobs")) >= 8
    assert any(path.parent.name == "cli" for path in _sources("supervisor")), "the CLI is checked too"
