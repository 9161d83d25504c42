# The C module supervisor/_vfork.c (see forking.vfork_exec).
STAGE_RUNS: int
STAGE_SETUP: int
STAGE_ORPHANED: int
STAGE_CWD: int
STAGE_EXEC: int

def spawn(
    candidates: list[bytes],
    argv: list[bytes],
    envp: list[bytes],
    stdin: int,
    stdout: int,
    stderr: int,
    cwd: bytes | None,
    manager: int,
    cgroup: int,
    memory: int,
    /,
) -> tuple[int, int, int]: ...
def fork_into(cgroup: int, /) -> int: ...
