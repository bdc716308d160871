"""No test leaves a process behind, passing or failing.

Two nets, both wired in tests/conftest.py:

- after each test, the processes of every launch under the test's moetune home (each process
  moetune starts carries ``MOETUNE_RUN=<run id>`` in its environment) are stopped, and the test
  errors naming them;
- the session marks its environment with ``MOETUNE_TEST_SESSION=<token>``, which every process the
  tests start inherits (servers, workers, launchers, sshd); at the end, whatever still carries the
  token, or the run id of any launch under the session's temporary directory (a worker started over
  ssh has only that), is killed and the run fails naming it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from moetune.run.process import RUN_ENV, cmdline, pid_alive, with_env

SESSION_ENV = "MOETUNE_TEST_SESSION"


@dataclass(frozen=True, slots=True)
class Stray:
    pid: int
    cmdline: str
    marker: str  # the environment entry it was found by

    def __str__(self) -> str:
        return f"pid {self.pid} ({self.marker}): {self.cmdline or '?'}"


def run_ids(root: Path) -> list[str]:
    """Run ids of the launches under ``root`` (moetune homes are ``<root>/<home>/runs/<id>``; the
    depth is bounded so that a large temporary directory is not walked)."""
    found = {*root.glob("runs/*/run.json"), *root.glob("*/runs/*/run.json"), *root.glob("*/*/runs/*/run.json")}
    return sorted({p.parent.name for p in found})


def find_strays(session: str | None, runs: Iterable[str] = ()) -> list[Stray]:
    """Live processes carrying the session token or one of the run ids (never this process)."""
    markers = [(SESSION_ENV, session)] if session else []
    markers += [(RUN_ENV, r) for r in runs]
    seen: dict[int, Stray] = {}
    for key, value in markers:
        for pid in with_env(key, value):
            seen.setdefault(pid, Stray(pid, cmdline(pid), f"{key}={value}"))
    return sorted(seen.values(), key=lambda s: s.pid)


def kill(strays: Iterable[Stray], grace_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL whatever is still alive after ``grace_s``."""
    pids = [s.pid for s in strays]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while (pids := [p for p in pids if pid_alive(p)]) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not pids:
            return


def report(strays: list[Stray], where: str) -> str:
    return f"{where} left {len(strays)} process(es) running (now killed):\n" + "\n".join(f"  {s}" for s in strays)
