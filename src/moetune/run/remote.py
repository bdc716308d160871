"""Processes on other nodes, started and stopped through the system OpenSSH client.

The user's ssh configuration applies (keys, agents, jump hosts, ``Host`` aliases);
``MOETUNE_SSH_COMMAND`` replaces ``ssh`` (as ``GIT_SSH_COMMAND`` does for git, e.g.
``ssh -F ~/lab/ssh_config``). moetune adds ``BatchMode=yes`` (never a password or host-key prompt)
and keep-alives; options the user gives come first and win.

A worker runs under a small ``/bin/sh`` wrapper on its node, whose output travels back over the
ssh session into the run directory's log::

    export NAME='value'...
    <binary> <args> &        (its stdout line-buffered with stdbuf where there is one)
    echo "moetune-pid $! <start ticks>"
    wait $!; echo "moetune-exit $?"

so the worker's pid on its node is recorded (with its start time: a reused pid is not ours), it is
stopped by that pid (``kill`` over ssh, then ``/proc`` or ``kill -0`` polled until it is gone), and
its exit status reaches the log even when it was killed. The local ``ssh`` process lives exactly
as long as the worker: watching it costs nothing, and only once it is gone does a check go over ssh.
The session has a terminal (``ssh -tt``): should it end first (the launching machine lost, the
ssh client killed), the hangup ends the worker too instead of leaving it listening.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from moetune.errors import InputError, RuntimeFailure
from moetune.run.process import LocalProcess

SSH_ENV = "MOETUNE_SSH_COMMAND"
SSH_OPTIONS = (
    "-o",
    "BatchMode=yes",
    "-o",
    "ConnectTimeout=10",
    "-o",
    "ServerAliveInterval=10",
    "-o",
    "ServerAliveCountMax=3",
)
PID_MARK = "moetune-pid"
EXIT_MARK = "moetune-exit"
SSH_FAILED = 255  # what ssh exits with when it could not run the command
START_TIMEOUT_S = 30.0
CHECK_TIMEOUT_S = 30.0
_PID_LINE = re.compile(rf"{PID_MARK} (\d+) ?(\d*)")
_EXIT_LINE = re.compile(rf"{EXIT_MARK} (\d+)")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class RemoteError(RuntimeFailure):
    """ssh could not reach a node or run a command there."""


def ssh_base() -> list[str]:
    """The ssh client and the options every call uses (the target comes after)."""
    return [*shlex.split(os.environ.get(SSH_ENV) or "ssh"), *SSH_OPTIONS]


def ssh_argv(base: Sequence[str], target: str, script: str, tty: bool = False) -> list[str]:
    """ssh running ``script`` under /bin/sh on ``target``, whatever the login shell there is;
    ``tty``: with a terminal, whose hangup ends the script's processes when the session does."""
    return [*base, "-tt" if tty else "-T", target, "exec /bin/sh -c " + shlex.quote(script)]


def run_remote(
    base: Sequence[str], target: str, script: str, timeout_s: float = CHECK_TIMEOUT_S, *, stdin: str | None = None
) -> str:
    """Run a short script on ``target`` and return its stdout; RemoteError when ssh fails."""
    try:
        r = subprocess.run(
            ssh_argv(base, target, script),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=None if stdin is not None else subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise RemoteError(f"ssh {target}: no answer after {timeout_s:.0f} s", hint=ssh_hint(target)) from None
    except FileNotFoundError:
        raise RemoteError(
            f"no ssh client ({base[0]})", hint="install OpenSSH's client (Debian: openssh-client)"
        ) from None
    if r.returncode == SSH_FAILED:
        raise RemoteError(f"ssh {target} failed: {last_line(r.stderr) or 'exit 255'}", hint=ssh_hint(target))
    return r.stdout


def ssh_hint(target: str) -> str:
    return (
        f"check that `ssh -o BatchMode=yes {target} true` works without a prompt (key or agent, host key in "
        "known_hosts, the Host entry of your ssh config); set MOETUNE_SSH_COMMAND for other options"
    )


_SSH_LINE = re.compile(r"^(ssh: |Connection .*closed|Timeout, server|client_loop: |packet_write|Broken pipe)")


def ssh_said(log_text: str) -> str:
    """The last line of a session's log that ssh itself wrote (why it ended), if any."""
    lines = [x.strip() for x in log_text.splitlines() if _SSH_LINE.match(x.strip())]
    return lines[-1] if lines else ""


def last_line(text: str) -> str:
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    return lines[-1] if lines else ""


# -- scripts run on the node (pure) ----------------------------------------------------------


def _stat_fields(pid: int) -> str:
    """Shell: the /proc/PID/stat fields after ``pid (comm)``; empty where there is no such process."""
    return f"sed 's/.*) //' /proc/{pid}/stat 2>/dev/null"


def worker_script(argv: Sequence[str], env: Mapping[str, str]) -> str:
    """The wrapper that runs ``argv`` with ``env`` on the node. Every word is quoted; the variables
    are exported rather than given to ``env`` (which takes any word with a ``=`` before the command
    for an assignment, and a leading ``-`` for its option), and a relative binary that starts with
    ``-`` is run as ``./-...``."""
    bad = next((k for k in env if not _ENV_NAME.fullmatch(k)), None)
    if bad is not None:
        raise InputError(f"environment variable {bad!r}: a shell cannot set that name on a remote node")
    binary = f"./{argv[0]}" if argv[0].startswith("-") else argv[0]
    return "\n".join(
        [
            *(f"export {k}={shlex.quote(v)}" for k, v in env.items()),
            'if command -v stdbuf >/dev/null 2>&1; then sb="stdbuf -oL -eL"; else sb=; fi',
            f"$sb {shlex.join([binary, *argv[1:]])} </dev/null &",
            "w=$!",
            f"""echo "{PID_MARK} $w $(sed 's/.*) //' /proc/$w/stat 2>/dev/null | cut -d' ' -f20)" """.rstrip(),
            'wait "$w"',
            "rc=$?",
            f'echo "{EXIT_MARK} $rc"',
            'exit "$rc"',
        ]
    )


def state_script(pid: int) -> str:
    """Prints the process's state and start ticks (``S 4242``), ``alive`` without /proc, or nothing."""
    return (
        f's=$({_stat_fields(pid)} | cut -d\' \' -f1,20); if [ -n "$s" ]; then echo "$s"; '
        f"elif [ ! -d /proc/self ] && kill -0 {pid} 2>/dev/null; then echo alive; fi; true"
    )


def kill_script(pid: int, sig: int, start_ticks: int | None) -> str:
    name = signal.Signals(sig).name.removeprefix("SIG")
    if start_ticks is None:
        return f"kill -s {name} {pid} 2>/dev/null; true"
    return (
        f"t=$({_stat_fields(pid)} | cut -d' ' -f20); "
        f'if [ "$t" = {start_ticks} ] || [ ! -d /proc/self ]; then kill -s {name} {pid} 2>/dev/null; fi; true'
    )


def parse_state(out: str, start_ticks: int | None) -> bool:
    """Whether ``state_script``'s output says the process lives (and is the one we started)."""
    words = out.split()
    if not words:
        return False
    if words[0] == "alive":
        return True
    if words[0] in ("Z", "X"):
        return False
    return start_ticks is None or (len(words) > 1 and words[1] == str(start_ticks))


def pid_line(text: str) -> tuple[int, int | None] | None:
    m = _PID_LINE.search(text)
    if m is None:
        return None
    return int(m[1]), int(m[2]) if m[2] else None


def exit_status(text: str) -> int | None:
    """The worker's exit status the wrapper logged, as Popen reports it (-9: killed by SIGKILL)."""
    found = _EXIT_LINE.findall(text)
    if not found:
        return None
    rc = int(found[-1])
    return -(rc - 128) if rc > 128 else rc


def _tail(path: Path | None, size: int = 1 << 16) -> str:
    if path is None:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(f.tell() - size, 0))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _head(path: Path, size: int = 1 << 16) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(size).decode(errors="replace")
    except OSError:
        return ""


# -- the process -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeProbe:
    """What a node's engine directory holds, looked at over ssh before anything starts."""

    target: str
    bin_dir: str
    binary: str | None  # the RPC server's file name there (ggml-rpc-server, or rpc-server in older builds)
    rdma: bool  # the build has the RDMA transport
    hostname: str

    @property
    def binary_path(self) -> str | None:
        return None if self.binary is None else f"{self.bin_dir.rstrip('/')}/{self.binary}"


def probe_node(base: Sequence[str], target: str, bin_dir: str, binaries: Sequence[str]) -> NodeProbe:
    names = " ".join(shlex.quote(b) for b in binaries)
    libs = f"{names} lib*ggml-rpc* ../lib/lib*ggml-rpc*"
    script = "\n".join(
        [
            'echo "host $(hostname)"',
            f"cd {shlex.quote(bin_dir)} 2>/dev/null || {{ echo nodir; exit 0; }}",
            f'for b in {names}; do if [ -x "$b" ]; then echo "binary $b"; break; fi; done',
            f"if grep -qsF 'RDMA activated' {libs}; then echo rdma; fi",
        ]
    )
    out = run_remote(base, target, script)
    lines = out.splitlines()
    binary = next((x.split(" ", 1)[1] for x in lines if x.startswith("binary ")), None)
    host = next((x.split(" ", 1)[1] for x in lines if x.startswith("host ")), target)
    return NodeProbe(
        target=target, bin_dir=bin_dir, binary=None if "nodir" in lines else binary, rdma="rdma" in lines, hostname=host
    )


class RemoteProcess:
    """A process on another node, started here over ssh or attached to from its record."""

    def __init__(
        self,
        name: str,
        ssh: Sequence[str],
        target: str,
        remote_pid: int | None,
        *,
        remote_start_ticks: int | None,
        local: LocalProcess | None,
        log: Path | None,
    ) -> None:
        self.name = name
        self.ssh = list(ssh)  # the ssh client and options, without the target
        self.target = target
        self.remote_pid = remote_pid
        self.remote_start_ticks = remote_start_ticks
        self.local = local  # the ssh client carrying the session (and the log)
        self.log = log
        self.unreachable: str | None = None  # why its node could not be asked, when it could not

    @classmethod
    def start(
        cls,
        name: str,
        target: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        log: Path,
        ssh: Sequence[str] | None = None,
        timeout_s: float = START_TIMEOUT_S,
        on_spawn: Callable[[RemoteProcess], None] | None = None,
    ) -> RemoteProcess:
        """Start ``argv`` on ``target`` and return once its pid there is known (or ssh gave up).
        ``on_spawn`` sees the process as soon as the local ssh runs (to record it before waiting)."""
        base = list(ssh) if ssh is not None else ssh_base()
        local = LocalProcess.start(name, ssh_argv(base, target, worker_script(argv, env), tty=True), os.environ, log)
        proc = cls(name, base, target, None, remote_start_ticks=None, local=local, log=log)
        if on_spawn is not None:
            on_spawn(proc)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = pid_line(_head(log))
            if found:
                proc.remote_pid, proc.remote_start_ticks = found
                break
            if not local.alive():
                break
            time.sleep(0.02)
        return proc

    @classmethod
    def attach(
        cls,
        name: str,
        ssh: Sequence[str],
        target: str,
        remote_pid: int | None,
        *,
        remote_start_ticks: int | None,
        local: LocalProcess | None,
        log: Path | None,
    ) -> RemoteProcess:
        return cls(name, ssh, target, remote_pid, remote_start_ticks=remote_start_ticks, local=local, log=log)

    # the local side: what the run record's pid, pgid and start ticks describe
    @property
    def pid(self) -> int:
        return self.local.pid if self.local is not None else 0

    @property
    def pgid(self) -> int:
        return self.local.pgid if self.local is not None else 0

    @property
    def start_ticks(self) -> int | None:
        return self.local.start_ticks if self.local is not None else None

    @property
    def started(self) -> bool:
        """The wrapper reported the worker's pid (ssh connected and the command ran)."""
        return self.remote_pid is not None

    @property
    def returncode(self) -> int | None:
        """The worker's exit status (from the wrapper's line in the log), else ssh's own."""
        rc = exit_status(_tail(self.log))
        if rc is not None:
            return rc
        return None if self.local is None else self.local.returncode

    def session_lost(self) -> bool:
        """The ssh session ended without the wrapper logging the worker's exit (ssh killed, network)."""
        return (
            self.local is not None and not self.local.alive() and self.started and exit_status(_tail(self.log)) is None
        )

    def alive(self) -> bool:
        """While the ssh session runs, the worker does: no round trip needed."""
        if self.local is not None:
            return self.local.alive()
        return self.remote_alive()

    def group_alive(self) -> bool:
        """Alive on its node; asked over ssh only once the local session is gone without the
        wrapper having logged the worker's exit."""
        if self.local is not None and self.local.group_alive():
            return True
        if self.remote_pid is None or exit_status(_tail(self.log)) is not None:
            return False
        return self.remote_alive()

    def remote_alive(self) -> bool:
        """Asked on its node; when the node cannot be reached (a partition, the node down) the
        answer is unknown: True, with :attr:`unreachable` saying why (a stop then moves on)."""
        if self.remote_pid is None:
            return False
        try:
            alive = parse_state(
                run_remote(self.ssh, self.target, state_script(self.remote_pid)), self.remote_start_ticks
            )
        except RemoteError as e:
            self.unreachable = str(e)
            return True
        self.unreachable = None
        return alive

    def signal(self, sig: int) -> None:
        """Signal the worker by its pid on the node; before that pid is known, end the session
        (whose hangup ends the worker)."""
        if self.remote_pid is None:
            if self.local is not None:
                self.local.signal(sig)
            return
        with contextlib.suppress(RemoteError):
            run_remote(self.ssh, self.target, kill_script(self.remote_pid, sig, self.remote_start_ticks))

    def describe(self) -> str:
        return f"pid {self.remote_pid} on {self.target}"
