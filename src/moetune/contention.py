"""Who used the CPU while moetune measured: the engine, moetune itself, or something else.

A benchmark on a busy machine measures the machine, not the configuration: llama.cpp's threads
meet at a barrier after every operation, so one thread that another program preempts stalls all
of them (the issue that started this: a compiler on both cores of the testbed turned 325 tok/s
into 9.3, and a calibration on that run into a 37x drop of ``cpu_bw_eff``). So every benchmark
counts, from the kernel's counters (:mod:`moetune.procfs`), where the machine's CPU time went:

- the engine: the watched servers and RPC workers of this machine (for a container, its main
  process and the ``podman run`` client; for a worker on another node, its local ssh client) and
  all their descendants;
- the client: moetune's own process (every thread of it: the benchmark's HTTP client, the
  sampler), counted apart, as neither; its children are not (a hog a test starts is foreign);
- foreign: everything else, as the machine's busy time (/proc/stat, all cores: user, nice, system,
  irq, softirq, steal) minus the two above. Time another virtual machine stole counts here too.

A run whose foreign load averages more than :func:`max_foreign_cores` (0.5 cores by default;
``MOETUNE_MAX_FOREIGN_CORES`` sets it, in cores or as a share of the machine such as ``25%``, or
``off``) is *contended*: its figures describe the machine's load. The threshold is in cores, not a
share of the machine, because what stalls the engine is a core taken from one of its threads. The
top foreign processes are named by command (with their pids), from the per-process counters read
about once a second; a process that starts and ends between two readings adds to the foreign
total but is not named.

A run is *noisy* when a workload's 95% interval of TG or PP is wider than +/- :func:`noisy_limit_pct`
(10% by default, ``MOETUNE_NOISY_PCT``) of its median: a quiet machine repeats within a few percent.

A run that measured for less than :data:`MIN_JUDGED_S` is judged over that span: the readings
before it (:func:`lead`), and where those are too few the seconds after it
(:meth:`moetune.monitor.sampler.RunMonitor.cpu_contention` waits for them).

The split is pure (:func:`split`, :class:`Tally`, :func:`lead`); :func:`census` is the one reader.
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from moetune import procfs
from moetune.errors import InputError

DEFAULT_MAX_FOREIGN_CORES = 0.5
# a run measured for less is judged over this many seconds, the seconds before it (its server
# loading) included, else after it (the engine idle): over a fraction of a second the engine's
# threads, woken, take the cores from whatever else runs (two hogs on both cores measured 0.44
# cores over a 0.5 s run, 0.93-0.97 over seconds): the verdict would describe the scheduler
MIN_JUDGED_S = 3.0
DEFAULT_NOISY_PCT = 10.0
TOP = 5  # foreign commands named
PIDS_NAMED = 6  # pids listed per command
REMEDY = (
    "stop the programs named (or wait for them), then run again; MOETUNE_MAX_FOREIGN_CORES sets the "
    "threshold (cores, N% of the machine, or off)"
)


# -- configuration -----------------------------------------------------------------------------


def max_foreign_cores(cores: int, raw: str | None = None) -> float | None:
    """The foreign load (cores, averaged over a run) above which a run is contended: 0.5 cores,
    or ``MOETUNE_MAX_FOREIGN_CORES`` (``1.5`` cores, ``25%`` of the machine's ``cores``, ``off``:
    never). None: off."""
    text = (os.environ.get("MOETUNE_MAX_FOREIGN_CORES", "") if raw is None else raw).strip().lower()
    if not text:
        return DEFAULT_MAX_FOREIGN_CORES
    if text in ("off", "none", "inf"):
        return None
    try:
        v = float(text[:-1]) / 100 * cores if text.endswith("%") else float(text)
    except ValueError:
        v = -1.0
    if not v >= 0:
        raise InputError(
            f"MOETUNE_MAX_FOREIGN_CORES={text!r}: expected cores (0.5), a share of the machine (25%) or off",
            hint="unset it for the default of 0.5 cores",
        )
    return v


def noisy_limit_pct(raw: str | None = None) -> float:
    """Half the width of a 95% interval, in percent of its median, above which a run is noisy."""
    text = (os.environ.get("MOETUNE_NOISY_PCT", "") if raw is None else raw).strip().rstrip("%")
    try:
        return float(text) if text else DEFAULT_NOISY_PCT
    except ValueError:
        raise InputError(
            f"MOETUNE_NOISY_PCT={text!r}: expected a percentage (10)", hint="unset it for the default of 10%"
        ) from None


# -- readings ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Census:
    """One reading of the machine's CPU counters: all cores' busy ticks and every process's."""

    t: float  # monotonic seconds
    busy_ticks: int
    cores: int
    procs: Mapping[int, procfs.ProcStat]


def census() -> Census:
    """This machine, now (one pass over /proc)."""
    cpus = procfs.read_cpu_times()
    procs = procfs.read_all_proc_stats()
    return Census(time.monotonic(), sum(c.busy for c in cpus), len(cpus) or (os.cpu_count() or 1), procs)


def descendants(procs: Mapping[int, procfs.ProcStat], roots: Collection[int]) -> set[int]:
    """The roots that exist and every process below them."""
    children: dict[int, list[int]] = {}
    for pid, st in procs.items():
        children.setdefault(st.ppid, []).append(pid)
    out: set[int] = set()
    todo = [p for p in roots if p in procs]
    while todo:
        p = todo.pop()
        if p not in out:
            out.add(p)
            todo += children.get(p, [])
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Split:
    """Where the CPU time of one interval went, in core-seconds."""

    seconds: float
    cores: int
    machine: float
    engine: float
    client: float
    foreign: float
    by_process: Mapping[tuple[str, int], float] = field(default_factory=dict)  # (comm, pid): foreign ones
    engine_seen: bool = False  # one of the engine's processes was on this machine


def split(
    before: Census,
    after: Census,
    engine_roots: Collection[int],
    client: Collection[int],
    *,
    clk_tck: int = procfs.CLK_TCK,
) -> Split:
    """The interval between two readings: the engine's processes (``engine_roots`` and their
    descendants), the client's (``client``, not their children), and the rest of the machine."""
    engine = descendants(after.procs, engine_roots) | descendants(before.procs, engine_roots)
    own = set(client) - engine

    def used(pid: int) -> float:
        a = after.procs.get(pid)
        if a is None:
            return 0.0
        b = before.procs.get(pid)
        base = b.cpu_ticks if b is not None and b.start_ticks == a.start_ticks else 0
        return max(0, a.cpu_ticks - base) / clk_tck

    machine = max(0, after.busy_ticks - before.busy_ticks) / clk_tck
    e = sum(used(p) for p in engine)
    c = sum(used(p) for p in own)
    by = {
        (st.comm, pid): u
        for pid, st in after.procs.items()
        if pid not in engine and pid not in own and (u := used(pid)) > 0
    }
    return Split(
        seconds=max(0.0, after.t - before.t),
        cores=after.cores,
        machine=machine,
        engine=e,
        client=c,
        foreign=max(0.0, machine - e - c),
        by_process=by,
        engine_seen=bool(engine),
    )


def lead(before: Sequence[Census], need: float) -> Census | None:
    """The reading to judge a short run from: of ``before`` (readings in time order, the last the
    run's first), the newest at least ``need`` seconds before the last, else the oldest; None when
    nothing is needed or nothing precedes the run."""
    if need <= 0 or len(before) < 2:
        return None
    start = before[-1]
    for c in reversed(before[:-1]):
        if start.t - c.t >= need:
            return c
    return before[0]


# -- a run's verdict ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ForeignLoad:
    """One command's foreign load over a span: its pids (the first few) and cores on average."""

    comm: str
    pids: tuple[int, ...]
    cores: float

    def describe(self, cores: int) -> str:
        pids = ", ".join(map(str, self.pids))
        return (
            f"{self.comm} (pid{'s' if len(self.pids) > 1 else ''} {pids}) {self.cores:.2f} cores "
            f"({100 * self.cores / max(1, cores):.0f}% of the machine)"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Contention:
    """Where the CPU went while a run measured, and whether another program took too much of it."""

    seconds: float
    cores: int  # the machine's
    engine_cores: float  # averages over ``seconds``
    client_cores: float
    foreign_cores: float
    foreign_peak_cores: float  # the busiest interval's (about a second)
    max_foreign_cores: float | None  # the threshold it was judged by (None: off)
    top: tuple[ForeignLoad, ...] = ()
    # False when no process of the engine was seen on this machine (a server elsewhere, or one this
    # user cannot see): its CPU time cannot be told from the rest, and the run is not judged
    judged: bool = True

    @property
    def contended(self) -> bool:
        return self.judged and self.max_foreign_cores is not None and self.foreign_cores > self.max_foreign_cores

    def message(self) -> str:
        """What a person reads: the foreign load, the threshold, the programs."""
        if not self.judged:
            return (
                f"the engine's processes were not seen on this machine: {self.foreign_cores:.2f} cores of other "
                "work (the engine's among it, if it runs here) not judged"
            )
        limit = "" if self.max_foreign_cores is None else f", more than the {self.max_foreign_cores:g} allowed"
        top = "; ".join(f.describe(self.cores) for f in self.top) or "no process named (short-lived ones)"
        return (
            f"foreign load {self.foreign_cores:.2f} cores on average over {self.seconds:.1f} s "
            f"({100 * self.foreign_cores / max(1, self.cores):.0f}% of {self.cores} cores{limit}; the engine "
            f"{self.engine_cores:.2f}, moetune {self.client_cores:.2f}): {top}"
        )

    def to_json(self) -> dict[str, object]:
        return {
            "contended": self.contended,
            "seconds": round(self.seconds, 3),
            "cores": self.cores,
            "engine_cores": round(self.engine_cores, 3),
            "client_cores": round(self.client_cores, 3),
            "foreign_cores": round(self.foreign_cores, 3),
            "foreign_peak_cores": round(self.foreign_peak_cores, 3),
            "max_foreign_cores": self.max_foreign_cores,
            "judged": self.judged,
            "foreign_share_pct": round(100 * self.foreign_cores / max(1, self.cores), 1),
            "top": [
                {
                    "comm": f.comm,
                    "pids": list(f.pids),
                    "cores": round(f.cores, 3),
                    "share_pct": round(100 * f.cores / max(1, self.cores), 1),
                }
                for f in self.top
            ],
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Contention:
        def num(k: str) -> float:
            v = d.get(k)
            return float(v) if isinstance(v, int | float) else 0.0

        limit = d.get("max_foreign_cores")
        return cls(
            seconds=num("seconds"),
            cores=int(num("cores")),
            engine_cores=num("engine_cores"),
            client_cores=num("client_cores"),
            foreign_cores=num("foreign_cores"),
            foreign_peak_cores=num("foreign_peak_cores"),
            max_foreign_cores=float(limit) if isinstance(limit, int | float) else None,
            top=tuple(
                ForeignLoad(
                    str(t.get("comm") or "?"), tuple(int(p) for p in t.get("pids") or ()), float(t.get("cores") or 0.0)
                )
                for t in d.get("top") or ()
            ),
            judged=d.get("judged") is not False,
        )


class Tally:
    """Intervals added up into a :class:`Contention` (the sampler adds one about every second)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.cores = 1
        self.engine = self.client = self.foreign = 0.0
        self.peak = 0.0
        self.engine_seen = False
        self.by_comm: dict[str, float] = {}
        self.pids: dict[str, dict[int, float]] = {}

    def copy(self) -> Tally:
        return copy.deepcopy(self)

    def add(self, s: Split) -> None:
        if s.seconds <= 0:
            return
        self.seconds += s.seconds
        self.cores = s.cores
        self.engine += s.engine
        self.client += s.client
        self.foreign += s.foreign
        self.peak = max(self.peak, s.foreign / s.seconds)
        self.engine_seen |= s.engine_seen
        for (comm, pid), used in s.by_process.items():
            self.by_comm[comm] = self.by_comm.get(comm, 0.0) + used
            per = self.pids.setdefault(comm, {})
            per[pid] = per.get(pid, 0.0) + used

    def result(self, max_foreign: float | None, *, engine: bool = True) -> Contention | None:
        """The span's verdict; None when nothing was measured. ``engine``: an engine ran (a run
        whose engine was never seen on this machine is not judged)."""
        if self.seconds <= 0:
            return None
        t = self.seconds
        top = sorted(self.by_comm.items(), key=lambda kv: -kv[1])[:TOP]
        named = tuple(
            ForeignLoad(
                comm,
                tuple(sorted(sorted(self.pids[comm], key=lambda p: -self.pids[comm][p])[:PIDS_NAMED])),
                round(used / t, 3),
            )
            for comm, used in top
            if used / t >= 0.01
        )
        return Contention(
            seconds=round(t, 3),
            cores=self.cores,
            engine_cores=round(self.engine / t, 3),
            client_cores=round(self.client / t, 3),
            foreign_cores=round(self.foreign / t, 3),
            foreign_peak_cores=round(self.peak, 3),
            max_foreign_cores=max_foreign,
            top=named,
            judged=self.engine_seen or not engine,
        )


# -- noise -------------------------------------------------------------------------------------


def noisy_figures(summary: Mapping[str, Any] | None, limit_pct: float) -> tuple[str, ...]:
    """The figures of a bench run's summary whose interval is wider than +/- ``limit_pct`` of the
    median: ``("tg:d0 +/-23%", ...)``."""
    out = []
    for name, w in ((summary or {}).get("workloads") or {}).items():
        for fam in ("tg", "pp"):
            s = w.get(fam) if isinstance(w, Mapping) else None
            if not s or not s.get("median") or s.get("ci_low") is None or s.get("ci_high") is None:
                continue
            half = (float(s["ci_high"]) - float(s["ci_low"])) / 2 / float(s["median"]) * 100
            if half > limit_pct:
                out.append(f"{fam}:{name} +/-{half:.0f}%")
    return tuple(out)


@dataclass(frozen=True, slots=True)
class RunFlags:
    """What makes a run's figures less trustworthy: contention (stored when it ended) and noise
    (from its summary, on read)."""

    contention: Contention | None
    noisy: tuple[str, ...] = ()
    noisy_limit_pct: float = DEFAULT_NOISY_PCT

    @property
    def contended(self) -> bool:
        return self.contention is not None and self.contention.contended

    @property
    def markers(self) -> tuple[str, ...]:
        return (("contended",) if self.contended else ()) + (("noisy",) if self.noisy else ())

    def warnings(self) -> list[tuple[str, str]]:
        """(message, remedy) per flag."""
        out = []
        if self.contended and self.contention is not None:
            out.append((f"contended: {self.contention.message()}", REMEDY))
        if self.noisy:
            out.append(
                (
                    f"noisy: intervals wider than +/-{self.noisy_limit_pct:g}% of the median: " + ", ".join(self.noisy),
                    "quiet the machine, or raise --repeats (MOETUNE_NOISY_PCT sets the limit)",
                )
            )
        return out

    def to_json(self) -> dict[str, object]:
        return {
            "contended": self.contended,
            "noisy": bool(self.noisy),
            "noisy_figures": list(self.noisy),
            "noisy_limit_pct": self.noisy_limit_pct,
            "contention": None if self.contention is None else self.contention.to_json(),
            "warnings": [{"message": m, "remedy": r} for m, r in self.warnings()],
        }


def run_flags(
    contention: Contention | None, summary: Mapping[str, Any] | None, limit_pct: float | None = None
) -> RunFlags:
    limit = noisy_limit_pct() if limit_pct is None else limit_pct
    return RunFlags(contention, noisy_figures(summary, limit), limit)
