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


def _module_name(source: Path) -> str:
    parts = source.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports_within(source: Path, known: set[str]) -> set[str]:
    """The modules of `known` that `source` imports anywhere: at its top, under TYPE_CHECKING,
    inside a function (an import put off to dodge a circle is still an arrow)."""
    name = _module_name(source)
    package = name if source.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]) if node.level else ""
            module = ".".join(part for part in (base, node.module or "") if part)
            for alias in node.names:
                if f"{module}.{alias.name}" in known:
                    found.add(f"{module}.{alias.name}")
                elif module in known:
                    found.add(module)
    return found - {name, name.split(".")[0]}  # a package's own exports are no arrow back


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of more than one module (Tarjan's, iterative enough here)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            part = []
            while (top := stack.pop()) != module:
                part.append(top)
            if part:
                found.append(sorted([module, *part]))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


@pytest.mark.parametrize("package", ["jobs", "supervisor"])
def test_no_module_imports_itself_round_a_circle(package: str) -> None:
    sources = _sources(package)
    known = {_module_name(source) for source in sources}
    graph = {_module_name(source): _imports_within(source, known) for source in sources}
    assert sum(len(targets) for targets in graph.values()) > len(sources), "the imports were not found"
    assert _circles(graph) == [], f"modules of {package} that import each other, through others or not"


def test_the_circle_finder_finds_a_circle() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


RENAMES = {("files", "move"), ("os", "rename"), ("os", "replace"), ("os", "renames"), ("shutil", "move")}
# Modules that rename files, never a job's folder, and how many renames each makes: a new
# one there is looked at (a job folder's move belongs in jobs/moves.py).
FILE_RENAMES = {
    "files.py": 2,  # the primitive (`move`) and an atomic file replace (`replace_file`)
    "incoming.py": 7,  # a member's submission files, inside their folder
    "stats.py": 1,  # a gone manager's counters file, adopted
    "claim.py": 2,  # result.json's link, and a staged run folder put in place, inside the job folder
    "counter.py": 1,  # a staged count put in place, inside the job folder
    "output.py": 1,  # a run's output file, compacted
}


def _renames(tree: ast.AST) -> int:
    return sum(
        1
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and (node.func.value.id, node.func.attr) in RENAMES
    )


def test_only_the_moves_module_renames_a_job_folder() -> None:
    found = {source.name: count for source in _sources("jobs") if (count := _renames(ast.parse(source.read_text())))}
    assert found.pop("moves.py", 0) >= 1, "jobs/moves.py renames through files.move"
    assert found == FILE_RENAMES, "a rename outside jobs/moves.py: a job folder's move belongs there"
    elsewhere = {_relative(source) for source in _sources("supervisor") if _renames(ast.parse(source.read_text()))}
    assert elsewhere == {"supervisor/metrics.py"}, "only the metrics textfile is renamed (into place) by supervisor/"


def test_a_queue_method_s_docstring_is_written_once() -> None:
    """`Queue` is the user's API and `Serving` its owner's side: each says what a method is
    for; the modules they call into say how, never the same words again."""
    api_docs: set[str] = set()
    elsewhere: dict[str, str] = {}
    for source in _sources("jobs"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.ClassDef) and node.name in ("Queue", "Serving"):
                api_docs |= {doc.strip() for item in node.body if (doc := _docstring(item))}
            elif isinstance(node, ast.FunctionDef) and source.name not in API_MODULES and (doc := _docstring(node)):
                elsewhere[doc.strip()] = f"{source.name}:{node.lineno}"
    assert len(api_docs) > 50, "Queue's and Serving's docstrings were not found"
    copied = sorted(elsewhere[doc] for doc in api_docs & elsewhere.keys())
    assert copied == [], f"docstrings copied from Queue or Serving: {copied}"


API_MODULES = {"store.py", "serving.py"}
CLASS_LINES = 300  # a class longer than this does more than one thing (the house's rule)
MANAGER_LINES = 200  # the manager reads as its loop


def _class_lengths(package: str) -> dict[str, int]:
    return {
        f"{_relative(source)}:{node.name}": (node.end_lineno or node.lineno) - node.lineno + 1
        for source in _sources(package)
        for node in ast.walk(ast.parse(source.read_text()))
        if isinstance(node, ast.ClassDef)
    }


@pytest.mark.parametrize("package", ["jobs", "supervisor"])
def test_no_class_is_longer_than_the_house_allows(package: str) -> None:
    lengths = _class_lengths(package)
    assert len(lengths) > 10, "the classes were not found"
    assert {name: lines for name, lines in lengths.items() if lines > CLASS_LINES} == {}
    if package == "supervisor":
        assert lengths["supervisor/manager.py:Manager"] <= MANAGER_LINES


def _docstring(node: ast.AST) -> str | None:
    return ast.get_docstring(node) if isinstance(node, ast.FunctionDef) else None


@pytest.mark.parametrize(("package", "root"), [("jobs", "JobsError"), ("supervisor", "SupervisorError")])
def test_every_exception_a_package_defines_is_under_its_root(package: str, root: str) -> None:
    """One `except` catches whatever a package raises on purpose (but `CannotComplete`,
    which a job raises to say something, not an error of ours)."""
    import importlib

    errors = importlib.import_module(f"{package}.errors")
    base = getattr(errors, root)
    stray = []
    for source in _sources(package):
        if source.name == "__main__.py":
            continue
        module = importlib.import_module(_module_name(source))
        for name, value in vars(module).items():
            defined_here = isinstance(value, type) and value.__module__ == module.__name__
            if defined_here and issubclass(value, BaseException) and not issubclass(value, base):
                stray.append(f"{module.__name__}.{name}")
    assert stray == (["jobs.errors.CannotComplete"] if package == "jobs" else [])


# -- tests and benchmarks use the seams, not the rooms -------------------------------------

# The modules inside the packages that tests and benchmarks may import, and why: each is a
# contract that outlives a reshaping of the house (the format, the crash hooks, a child's
# end as its manager reads it) or a piece a benchmark times against its bare reference.
# Everything else is reached through `jobs`, `supervisor` and `supervisor.cli`, or by the
# test named for the module it tests (`tests/jobs/test_retry.py` may import `jobs.retry`).
SEAMS = {
    "jobs.files": "the one move primitive, the checkpoints and the barriers: crash tests patch and count them here",
    "jobs.job": "the names and limits of docs/FORMAT.md (ready and scheduled entries, a spec's size, job ids)",
    "jobs.lease": "the owner file of docs/FORMAT.md: tests write, age and fence owners by hand",
    "jobs.ticks": "how a schedule's tick ids are derived: tests predict them, as a member would",
    "jobs.incoming": "the rules of incoming/: how far ahead a member's `created` may be, when a cut take-in is resumed",
    "jobs.context": "inside a running job: the `current()` it keeps, which a test forgets between two runs",
    "jobs.index": "the ready index's clock and batch, which tests fix to say when it rescans",
    "supervisor.served": "a queue as its manager serves it: the legs benchmark profiles its claim and fork",
    "supervisor.sweeper": "a sweep as the sweeper child runs it, ending a dead owner's runs first",
    "supervisor.snapshot": "what `status` and the page read of a queue: attacked and timed in process",
    "supervisor.web": "the status page in process: attacked with hostile documents, timed by its benchmark",
    "supervisor.forking": "the exit codes a job's child ends with, as its harvest reads them",
    "supervisor.running": "a child as its manager holds it: tests end runs without a manager's loop",
    "supervisor.outcomes": "the harvest of a child's end (and the cancel window it holds an unsent SIGTERM for)",
    "supervisor.health": "what the harvest reports its store's failures to",
    "supervisor.containment": "how a run is contained: the run-cost test and its benchmark compare the two modes",
    "supervisor.watch": "the ready folder's watch: benchmarks time a wake-up against inotify alone",
    "supervisor.spawner": "how a command job's process starts: benchmarks compare it with a bare fork and exec",
}
PUBLIC = {"jobs", "supervisor", "supervisor.cli"}


def _internal_imports(tree: ast.AST) -> set[str]:
    """The modules inside `jobs` and `supervisor` a file imports (`from jobs import files`
    counts as `jobs.files` when `files` is a module)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name.split(".")[0] in ("jobs", "supervisor") and _is_module(name)}


def _is_module(name: str) -> bool:
    parts = name.split(".")
    base = ROOT.joinpath(*parts)
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _allowed(module: str, user: Path) -> bool:
    if module in PUBLIC or module in SEAMS or module.startswith("supervisor.cli."):
        return True
    if module.startswith("jobs.") and module.removeprefix("jobs.") in jobs.__all__:
        return True  # a module `jobs` exports (`run_folder`, `output`)
    own = module.rsplit(".", 1)[-1]
    return user.stem.startswith(f"test_{own}")  # the module a test file is named for


USERS = sorted(path for folder in ("tests", "benchmarks", "examples") for path in (ROOT / folder).rglob("*.py"))


def test_tests_and_benchmarks_reach_inside_only_through_the_seams() -> None:
    rooms = {
        f"{user.relative_to(ROOT)}: {module}"
        for user in USERS
        for module in _internal_imports(ast.parse(user.read_text()))
        if not _allowed(module, user)
    }
    assert not rooms, "import these through `jobs` or `supervisor`, or make them a seam (SEAMS):\n" + "\n".join(
        sorted(rooms)
    )


def test_every_seam_is_a_module_and_is_used() -> None:
    used = set().union(*(_internal_imports(ast.parse(user.read_text())) for user in USERS))
    assert [seam for seam in SEAMS if not _is_module(seam)] == []
    assert [seam for seam in SEAMS if seam not in used] == [], "a seam no test uses is not one"
