# The C module supervisor/_vfork.c (see forking.vfork_exec).
STAGE_RUNS: int
STAGE_SETUP: int
STAGE_ORPHANED: int
STAGE_CWD: int
STAGE_EXEC: int
SPAWNS_INTO: int  # 1 where `spawn` can start its child in a cgroup (`into`), else 0

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
    into: int = -1,
    /,
) -> tuple[int, int, int]: ...
def fork_into(cgroup: int, /) -> int: ...
