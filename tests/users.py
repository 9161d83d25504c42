"""Real users and groups for the tests that need them, made with `useradd` (as root; without
root, or without the tools, `why_no_users` says why and those tests skip).

    fvowner   owns a shared queue and runs its managers: its own group fvowner (the owner
              group of incoming/), and a member of fvteam
    fvalice   a member of the queue's group fvteam (their own group: fvteam)
    fvbob     another member, the one who attacks
    fveve     no member: another local user
"""

from __future__ import annotations

import functools
import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Sequence

TEAM, OWNER, ALICE, BOB, EVE = "fvteam", "fvowner", "fvalice", "fvbob", "fveve"
MEMBERS = (OWNER, ALICE, BOB)


def _run(command: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(command), capture_output=True, text=True, timeout=60, check=False)


@functools.cache
def why_no_users() -> str | None:
    """Why real users cannot be used here (None when they can)."""
    if os.geteuid() != 0:
        return "needs root to create users and groups with useradd"
    if not (shutil.which("useradd") and shutil.which("groupadd") and shutil.which("setpriv")):
        return "needs useradd, groupadd and setpriv"
    for group in (TEAM, OWNER):
        made = _run(["groupadd", "-f", group])
        if made.returncode != 0:
            return f"groupadd {group} failed: {made.stderr.strip()}"
    for name in (*MEMBERS, EVE):
        try:
            pwd.getpwnam(name)
            continue
        except KeyError:
            pass
        group = ["-g", TEAM] if name in MEMBERS else []
        made = _run(["useradd", "-M", "-N", *group, "-s", "/usr/sbin/nologin", name])
        if made.returncode != 0:
            return f"useradd {name} failed: {made.stderr.strip()}"
    # The owner in a group of its own (most systems give every user one), a member of the team:
    made = _run(["usermod", "-g", OWNER, "-G", TEAM, OWNER])
    if made.returncode != 0:
        return f"usermod {OWNER} failed: {made.stderr.strip()}"
    probe = _run([*as_user(ALICE), sys.executable, "-c", "import jobs, supervisor, tests.sample_jobs"])
    if probe.returncode != 0:
        return f"{ALICE} cannot run this Python or read the repository: {probe.stderr.strip()[-300:]}"
    return None


def as_user(name: str) -> list[str]:
    """A command prefix that runs the rest as `name`, with their groups and none of root's rights."""
    return ["setpriv", f"--reuid={name}", f"--regid={pwd.getpwnam(name).pw_gid}", "--init-groups"]
