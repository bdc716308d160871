"""The kernel's own view of processes and the machine, from /proc: parsers of its text (pure) and
the readers of this machine's files; the one reader of /proc/PID/stat (the launcher's liveness
checks, the sampler, the history's writer). A node over ssh sends the same text, read by the same
parsers.

Counters are cumulative (clock ticks, faults); the sampler turns two readings into rates with
:func:`cpu_busy_pct` and :func:`proc_cpu_pct`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(frozen=True, slots=True)
class CpuTimes:
    """One core's (or all cores') cumulative ticks: busy and total."""

    busy: int
    total: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcStat:
    """What /proc/PID/stat says of one process."""

    state: str  # R S D Z T ...
    pgrp: int
    minflt: int
    majflt: int
    cpu_ticks: int  # utime + stime
    threads: int
    start_ticks: int
    rss_pages: int
    ppid: int = 0
    comm: str = ""  # the command name (at most 15 characters, as the kernel keeps it)


def parse_cpu_times(text: str) -> tuple[CpuTimes, ...]:
    """Per-core times from /proc/stat (the ``cpuN`` lines, in order; the ``cpu`` total line is skipped).
    Idle is idle + iowait; guest time is already inside user time and not counted twice."""
    out: list[CpuTimes] = []
    for line in text.splitlines():
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        f = [int(x) for x in line.split()[1:]]
        counted = f[:8]  # user nice system idle iowait irq softirq steal
        idle = counted[3] + (counted[4] if len(counted) > 4 else 0)
        total = sum(counted)
        out.append(CpuTimes(total - idle, total))
    return tuple(out)


def cpu_busy_pct(before: tuple[CpuTimes, ...], after: tuple[CpuTimes, ...]) -> tuple[float, ...] | None:
    """Busy percent per core between two readings; None when they do not pair (a core went offline)."""
    if len(before) != len(after) or not after:
        return None
    out = []
    for a, b in zip(before, after, strict=True):
        dt = b.total - a.total
        out.append(0.0 if dt <= 0 else round(100.0 * max(0, b.busy - a.busy) / dt, 1))
    return tuple(out)


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo in bytes, by field name (``MemTotal``, ``MemAvailable``, ``Mlocked``...)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[name.strip()] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    return out


def parse_proc_stat(text: str) -> ProcStat | None:
    """/proc/PID/stat; None for an empty or garbled line (the process is gone)."""
    try:
        end = text.rindex(")")
        rest = text[end + 2 :].split()  # after "pid (comm) ": field 3 is rest[0]
        return ProcStat(
            state=rest[0],
            pgrp=int(rest[2]),
            minflt=int(rest[7]),
            majflt=int(rest[9]),
            cpu_ticks=int(rest[11]) + int(rest[12]),
            threads=int(rest[17]),
            start_ticks=int(rest[19]),
            rss_pages=int(rest[21]),
            ppid=int(rest[1]),
            comm=text[text.index("(") + 1 : end],
        )
    except (ValueError, IndexError):
        return None


def proc_cpu_pct(
    before: ProcStat | None, after: ProcStat | None, seconds: float, clk_tck: int = CLK_TCK
) -> float | None:
    """Percent of one core a process used between two readings ``seconds`` apart."""
    if before is None or after is None or seconds <= 0 or before.start_ticks != after.start_ticks:
        return None
    return round(100.0 * max(0, after.cpu_ticks - before.cpu_ticks) / clk_tck / seconds, 1)


# -- this machine's files -----------------------------------------------------------------------


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def read_cpu_times() -> tuple[CpuTimes, ...]:
    return parse_cpu_times(_read(PROC / "stat"))


def read_meminfo() -> dict[str, int]:
    return parse_meminfo(_read(PROC / "meminfo"))


def read_load1() -> float | None:
    parts = _read(PROC / "loadavg").split()
    try:
        return float(parts[0])
    except (IndexError, ValueError):
        return None


def read_proc_stat(pid: int) -> ProcStat | None:
    return parse_proc_stat(_read(PROC / str(pid) / "stat"))


def read_all_proc_stats() -> dict[int, ProcStat]:
    """Every process this machine shows, by pid (one pass over /proc; a process that ends during
    the pass is left out). About 20 us a process (raw reads: a text-mode open costs twice that)."""
    out: dict[int, ProcStat] = {}
    try:
        names = os.listdir(PROC)
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            fd = os.open(f"{PROC}/{name}/stat", os.O_RDONLY)
            try:
                raw = os.read(fd, 4096)
            finally:
                os.close(fd)
        except OSError:
            continue
        st = parse_proc_stat(raw.decode("utf-8", "replace"))
        if st is not None:
            out[int(name)] = st
    return out


def catches_signal(pid: int, sig: int) -> bool | None:
    """Whether the process has a handler for ``sig`` (``SigCgt`` in /proc/PID/status); None when it
    cannot be read (gone)."""
    for line in _read(PROC / str(pid) / "status").splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return None


def own_start_ticks() -> int | None:
    """This process's start time (clock ticks after boot): with the pid, what tells it from a
    later process that reuses the pid."""
    st = read_proc_stat(os.getpid())
    return st.start_ticks if st else None


def listening_pid(port: int, host: str = "127.0.0.1") -> int | None:
    """The local process listening on TCP ``port`` (a server moetune did not launch), found through
    the socket's inode in /proc/net/tcp{,6} and the processes' open files; None where it is not
    visible (another user's process, a container)."""
    inodes: set[str] = set()
    for table in ("tcp", "tcp6"):
        for line in _read(PROC / "net" / table).splitlines()[1:]:
            f = line.split()
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f[9])
    if not inodes:
        return None
    targets = {f"socket:[{i}]" for i in inodes}
    for d in PROC.iterdir():
        if not d.name.isdigit():
            continue
        try:
            for fd in (d / "fd").iterdir():
                if os.readlink(fd) in targets:
                    return int(d.name)
        except OSError:
            continue
    return None
