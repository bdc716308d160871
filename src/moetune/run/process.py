"""Processes moetune starts: started in their own session (so a signal reaches the whole group and
Ctrl-C in the terminal reaches only moetune), logged to a file, and found again by pid from
another moetune process.

A process is alive while its pid exists, is not a zombie and still has the start time recorded
when it was started (a pid the kernel reused is not ours). ``LocalProcess`` runs here;
``remote.RemoteProcess`` (which builds on this module) runs on another node over ssh. Both have
the same small interface: ``pid``, ``alive()``, ``signal()``, ``group_alive()``, ``returncode``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from moetune.procfs import read_proc_stat

PROC = Path("/proc")
RUN_ENV = "MOETUNE_RUN"  # every process of a launch carries its run id in its environment
NAME_ENV = "MOETUNE_PROCESS"

# Popen objects of the processes this Python process started, by pid: kept so that they are not
# collected while running and so that a stop from the same process reaps them (no zombies).
_children: dict[int, subprocess.Popen[bytes]] = {}


def end(p: subprocess.Popen[Any], grace_s: float = 10.0) -> None:
    """Stop a short-lived child (a dry run, a sweep): SIGTERM, SIGKILL after ``grace_s``, reaped."""
    if p.poll() is not None:
        return
    p.terminate()
    try:
        p.wait(grace_s)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def pid_alive(pid: int, start_ticks: int | None = None) -> bool:
    child = _children.get(pid)
    if child is not None:
        child.poll()  # reaps it if it has exited
    st = read_proc_stat(pid)
    if st is None or st.state in ("Z", "X"):
        return False
    return start_ticks is None or st.start_ticks == start_ticks


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in a process group."""
    out = []
    for d in PROC.iterdir():
        if d.name.isdigit():
            st = read_proc_stat(int(d.name))
            if st is not None and st.pgrp == pgid and st.state not in ("Z", "X"):
                out.append(int(d.name))
    return out


def with_env(key: str, value: str) -> list[int]:
    """Live processes whose environment holds ``key=value`` (the strays of a launch)."""
    needle = f"{key}={value}".encode()
    out = []
    for d in PROC.iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            env = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if needle in env and pid_alive(int(d.name)):
            out.append(int(d.name))
    return out


def cmdline(pid: int) -> str:
    try:
        return (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


class Process(Protocol):
    name: str

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    def alive(self) -> bool: ...

    def group_alive(self) -> bool: ...

    def signal(self, sig: int) -> None: ...


class LocalProcess:
    """A process on this machine, started here or attached to from its record."""

    def __init__(self, name: str, pid: int, pgid: int, start_ticks: int | None) -> None:
        self.name = name
        self._pid = pid
        self.pgid = pgid
        self.start_ticks = start_ticks
        self._popen = _children.get(pid)  # when this Python process started it

    @classmethod
    def start(
        cls, name: str, argv: Sequence[str], env: Mapping[str, str], log: Path, *, cwd: Path | None = None
    ) -> LocalProcess:
        with open(log, "ab") as f:
            p = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=f,
                stderr=subprocess.STDOUT,
                env=dict(env),
                cwd=cwd,
                start_new_session=True,
            )
        _children[p.pid] = p
        st = read_proc_stat(p.pid)
        return cls(name, p.pid, p.pid, st.start_ticks if st else None)

    @classmethod
    def attach(cls, name: str, pid: int, pgid: int, start_ticks: int | None) -> LocalProcess:
        return cls(name, pid, pgid, start_ticks)

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def returncode(self) -> int | None:
        """The exit status, where this Python process started it (and it has exited)."""
        return None if self._popen is None else self._popen.poll()

    def alive(self) -> bool:
        return pid_alive(self._pid, self.start_ticks)

    def group_alive(self) -> bool:
        if self.alive():
            return True
        if self._popen is not None and self._popen.poll() is not None:
            _children.pop(self._pid, None)  # reaped: nothing left to keep
        return bool(group_members(self.pgid))

    def signal(self, sig: int) -> None:
        """Signal the whole process group (a server's helpers, such as gdb printing a backtrace)."""
        if not self.group_alive():
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, sig)


TERM, KILL = signal.SIGTERM, signal.SIGKILL
