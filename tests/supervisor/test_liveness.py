"""Liveness is decided only on the same kernel and pid namespace; elsewhere the lease decides."""

from __future__ import annotations

import dataclasses
import os
import socket

from supervisor import liveness


def test_this_process_is_alive() -> None:
    assert liveness.is_alive(liveness.this_owner(30.0, 0.0)) is True


def test_a_dead_pid_is_dead() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    owner = dataclasses.replace(liveness.this_owner(30.0, 0.0), pid=pid)
    assert liveness.is_alive(owner) is False


def test_same_host_name_in_another_pid_namespace_cannot_be_judged() -> None:
    owner = dataclasses.replace(liveness.this_owner(30.0, 0.0), pid_namespace="pid:[1]", pid=2**22 - 1)
    assert liveness.is_alive(owner) is None  # a container sharing our host name: the lease decides


def test_another_boot_or_host_cannot_be_judged() -> None:
    me = liveness.this_owner(30.0, 0.0)
    assert liveness.is_alive(dataclasses.replace(me, boot_id="another-boot")) is None
    assert liveness.is_alive(dataclasses.replace(me, host=socket.gethostname() + "-elsewhere")) is None
