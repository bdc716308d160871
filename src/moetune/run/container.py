"""A launch's process in a container (an engine registered with ``--image``): its name, its main
pid, its removal.

The container runs attached: the process moetune starts and records is ``podman run --rm --name
NAME ...`` (or docker's), whose output is the container's (the log moetune reads) and which passes
a SIGTERM on to the server (a server without a handler for it is ended with SIGKILL: the first
process of a container's pid namespace never sees a signal it does not handle). The server's own pid on this machine (``inspect``'s ``State.Pid``) is
recorded beside it, for the sampler and the doctor. A stop ends the client, then removes the
container by name (``rm -f``, idempotent), so that none is left whatever happened to the client.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from dataclasses import dataclass

from moetune.engine.formats import Command, container_command
from moetune.procfs import catches_signal, read_proc_stat
from moetune.run.process import pid_alive

NAME_PREFIX = "moetune"
RM_TIMEOUT_S = 60.0


def container_name(run_id: str, process: str) -> str:
    """``moetune-<run id>-<process>``, with what a container name cannot hold replaced by ``-``."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", f"{NAME_PREFIX}-{run_id}-{process}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerRun:
    """How a prepared process runs in a container of its engine's image."""

    runtime: str  # podman | docker
    image: str
    entrypoint: str | None = None  # None: the image's own (llama-server)
    gpus: tuple[str, ...] = ()  # the host's GPUs it is given
    host_network: bool = False  # an RPC worker: listens on the host's address
    label: str = "Z"  # the mounts' SELinux label (formats.mount_labels)

    def argv(self, engine_argv: tuple[str, ...], port: int, name: str, env: dict[str, str]) -> tuple[str, ...]:
        """The ``RUNTIME run`` command of ``engine_argv`` (binary first; the binary is the image's)."""
        cmd = Command(name, port, engine_argv)
        return container_command(
            self.runtime,
            self.image,
            cmd,
            gpus=self.gpus,
            name=name,
            entrypoint=self.entrypoint,
            env=env,
            host_network=self.host_network,
            label=self.label,
        ).argv


def _run(argv: list[str], timeout_s: float = 30.0) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None


def main_pid(runtime: str, name: str) -> tuple[int, int | None] | None:
    """The container's main process on this machine (pid, start time in ticks), while it runs."""
    r = _run([runtime, "inspect", "--format", "{{.State.Pid}}", name])
    if r is None or r.returncode != 0 or not r.stdout.strip().isdigit() or int(r.stdout.strip()) <= 0:
        return None
    pid = int(r.stdout.strip())
    st = read_proc_stat(pid)
    return pid, st.start_ticks if st else None


def end_if_deaf(pid: int | None, start_ticks: int | None) -> bool:
    """A container's main process is the first of its pid namespace, which a signal it has no
    handler for does not reach (ggml-rpc-server has none for SIGTERM): where it has none, end it
    as SIGTERM would end it outside a container, with SIGKILL (which does reach it). True when
    it was killed."""
    if pid is None or not pid_alive(pid, start_ticks) or catches_signal(pid, signal.SIGTERM) is not False:
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)
        return True
    return False


def exists(runtime: str, name: str) -> bool:
    r = _run([runtime, "container", "inspect", "--format", "{{.Name}}", name])
    return r is not None and r.returncode == 0


def remove(runtime: str, name: str) -> bool:
    """Kill and remove the container if it is there; True when it is gone (or never was)."""
    kill_now = ["--time", "0"] if runtime == "podman" else []
    _run([runtime, "rm", "-f", *kill_now, name], RM_TIMEOUT_S)
    return not exists(runtime, name)
