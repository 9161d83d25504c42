"""Whom a manager and its jobs run as. The only module that changes a process's user.

A manager started as root serves a queue only as that queue's owner: with
`--user NAME` it becomes NAME (its groups, then its group, then its user: the
order in which privileges can still be dropped) before it reads the queue, loads
the app or forks anything, so no job ever runs as root by accident.

Or it stays root and runs each job as the user who submitted it
(`--run-as-submitter`, as `at` and Slurm do): the manager looks the user up
(`Identities`), and the job's child, still root, hands the run's folder and
output files to that user, then becomes them for good before any of the job's
code runs (`become_in_child`). A command job, a program of the submitter's
choosing, starts from a clean environment, not the manager's.
"""

from __future__ import annotations

import os
import pwd
import time
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field, replace

from supervisor.errors import ConfigError, NoSuchUser

IDENTITY_TTL = 60.0  # seconds a looked-up user (and their groups) is reused
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"  # a command job's PATH when it runs as its submitter
KEPT_VARIABLES = ("LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ", "TERM")  # harmless, and what a program expects


def become(name: str) -> None:
    """Run as user `name` from now on, for good; ConfigError if that cannot be done."""
    try:
        user = pwd.getpwnam(name)
    except KeyError:
        raise ConfigError(f"--user {name}: no such user on this host") from None
    if os.geteuid() != 0:
        if os.geteuid() == user.pw_uid:
            return  # already that user
        raise ConfigError(f"--user {name}: only root may become another user (this is uid {os.geteuid()})")
    os.initgroups(name, user.pw_gid)
    os.setgid(user.pw_gid)
    os.setuid(user.pw_uid)  # real, effective and saved: no way back
    if os.geteuid() == 0 or os.getuid() == 0:
        raise ConfigError(f"--user {name}: still root after setuid: refusing to go on")
    os.environ.update(USER=name, LOGNAME=name, HOME=user.pw_dir)


@dataclass(frozen=True)
class Identity:
    """A user of this host a job runs as, looked up by the manager (the child must not wait
    on the user database: it may be a network service)."""

    uid: int
    gid: int
    name: str
    home: str
    shell: str
    groups: tuple[int, ...]
    start: Mapping[str, str] = field(default_factory=dict)  # the whole environment its jobs start from

    @property
    def environment(self) -> dict[str, str]:
        return {"USER": self.name, "LOGNAME": self.name, "HOME": self.home, "SHELL": self.shell}


class Identities:
    """Users by uid, each looked up at most once a minute; `passed`: the manager's variables
    their jobs get too (`--pass-env`)."""

    def __init__(self, passed: Mapping[str, str] | None = None) -> None:
        self._known: dict[int, tuple[float, Identity]] = {}
        self._passed = dict(passed or {})

    def of(self, uid: int) -> Identity:
        """The user with `uid`; NoSuchUser if this host has none."""
        found = self._known.get(uid)
        now = time.monotonic()
        if found is not None and now - found[0] < IDENTITY_TTL:
            return found[1]
        try:
            user = pwd.getpwuid(uid)
        except KeyError:
            raise NoSuchUser(f"its submitter, uid {uid}, is not a user of this host") from None
        groups = tuple(os.getgrouplist(user.pw_name, user.pw_gid))
        identity = Identity(uid, user.pw_gid, user.pw_name, user.pw_dir, user.pw_shell or "/bin/sh", groups)
        identity = replace(identity, start=clean_environment(identity, self._passed))
        self._known[uid] = (now, identity)
        return identity


def hand_over(run_fd: int, names: tuple[str, ...], identity: Identity) -> None:
    """Give the run's folder and the files in it named `names` to `identity` (the job writes
    its result and error there; its output files are its own)."""
    for name in names:
        try:
            os.chown(name, identity.uid, -1, dir_fd=run_fd, follow_symlinks=False)
        except FileNotFoundError:
            continue  # not written (the pid file is optional)
    os.fchown(run_fd, identity.uid, -1)


def become_in_child(identity: Identity) -> None:
    """In a job's child, as root: become `identity` for good, before any of the job's code runs."""
    os.setgroups(list(identity.groups))
    os.setgid(identity.gid)
    os.setuid(identity.uid)  # real, effective and saved: no way back
    if identity.uid != 0 and 0 in (os.getuid(), os.geteuid()):
        raise ConfigError(f"still root after becoming {identity.name}: refusing to run the job")
    os.environ.update(identity.environment)


def clean_environment(identity: Identity, passed: Mapping[str, str]) -> dict[str, str]:
    """What a job running as its submitter starts from, Python or command: not the manager's
    environment (a service's secrets: a job run as its submitter is that user's to read),
    only the submitter's own names, a safe PATH, the locale and what the manager was told
    to pass (`--pass-env`)."""
    kept = {name: os.environ[name] for name in KEPT_VARIABLES if name in os.environ}
    return {"PATH": SAFE_PATH, **kept, **passed, **identity.environment}


def forget_own_variables(environ: MutableMapping[str, str]) -> dict[str, str]:
    """Take the manager's own FORKVISOR_* variables (its options, a token) out of its
    environment, once they are read, so that no job inherits them: each job gets the
    FORKVISOR_* of its run, and nothing else of ours. Return what was taken."""
    ours = [name for name in environ if name.startswith("FORKVISOR_")]
    return {name: environ.pop(name) for name in ours}
