"""One sample of the machine, as the sampler takes it and the history stores it (``metrics`` rows).

Rates (CPU %, PCIe bytes/s) are computed by the sampler over the interval since its previous
sample, so every snapshot stands alone; a first snapshot has no rates (None). Units are in the
field names: bytes, percent of one core (``cpu_pct``, so 800 is eight busy cores), watts, seconds
since the epoch. Readers use :meth:`Snapshot.from_json`; a field absent from an older row reads as
None.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

SNAPSHOT_SCHEMA = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class HostSample:
    cpu_pct: tuple[float, ...] | None = None  # per core, 0-100 each
    mem_total_bytes: int | None = None
    mem_used_bytes: int | None = None  # MemTotal - MemAvailable
    mlocked_bytes: int | None = None  # Mlocked: pinned / mlock'ed pages (--mlock, CUDA pinned host buffers)
    load1: float | None = None

    @property
    def cpu_total_pct(self) -> float | None:
        """Busy share of all cores, 0-100."""
        return None if not self.cpu_pct else sum(self.cpu_pct) / len(self.cpu_pct)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcSample:
    """One engine process (a server or an RPC worker; local, or on a node over ssh)."""

    name: str  # the launch's process name
    role: str  # server | rpc
    node: str  # "local" or the node's name in the hardware file
    pid: int
    cpu_pct: float | None = None  # percent of one core over the interval
    rss_bytes: int | None = None
    threads: int | None = None
    minflt: int | None = None  # cumulative page faults
    majflt: int | None = None
    gpu_mem_bytes: int | None = None  # its memory on GPUs, where NVML tells
    alive: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSample:
    index: int
    name: str
    util_pct: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    power_w: float | None = None
    pcie_rx_bytes_per_s: float | None = None
    pcie_tx_bytes_per_s: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    t: float  # wall clock, seconds since the epoch
    host: HostSample = field(default_factory=HostSample)
    procs: tuple[ProcSample, ...] = ()
    gpus: tuple[GpuSample, ...] = ()
    # llama-server's own /metrics per server name: {"llamacpp:requests_processing": 2.0, ...}
    servers: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    # what the running benchmark says it is doing, by its Prometheus name after moetune_load_:
    # {"requests_in_flight": 4, "requests_done_total": 120, "errors_total": 0, ...} (bench.serve.load.LoadMeter)
    load: Mapping[str, float] = field(default_factory=dict)
    phase: str | None = None  # the benchmark's phase when taken ("pp512", "c=4", "loading tensors")

    def to_json(self) -> dict[str, object]:
        d = asdict(self)
        d["schema"] = SNAPSHOT_SCHEMA
        d["servers"] = {k: dict(v) for k, v in self.servers.items()}
        d["load"] = dict(self.load)
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Snapshot:
        def pick(kind: type, x: Any) -> Any:
            names = kind.__dataclass_fields__  # type: ignore[attr-defined]
            return kind(**{k: v for k, v in (x or {}).items() if k in names})

        host = dict(d.get("host") or {})
        if host.get("cpu_pct") is not None:
            host["cpu_pct"] = tuple(host["cpu_pct"])
        return cls(
            t=float(d["t"]),
            host=pick(HostSample, host),
            procs=tuple(pick(ProcSample, p) for p in d.get("procs") or ()),
            gpus=tuple(pick(GpuSample, g) for g in d.get("gpus") or ()),
            servers={
                str(k): {str(m): float(v) for m, v in (s or {}).items()} for k, s in (d.get("servers") or {}).items()
            },
            load={str(k): float(v) for k, v in (d.get("load") or {}).items()},
            phase=d.get("phase"),
        )
