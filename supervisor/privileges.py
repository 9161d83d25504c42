"""Whom a manager runs as. The only module that changes a process's user.

A manager started as root serves a queue only as that queue's owner: with
`--user NAME` it becomes NAME (its groups, then its group, then its user: the
order in which privileges can still be dropped) before it reads the queue, loads
the app or forks anything, so no job ever runs as root by accident.
"""

from __future__ import annotations

import os
import pwd

from supervisor.errors import ConfigError


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
