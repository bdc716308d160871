"""What a server log says, as data. Sizes in MiB, times in ms or s, as their names say.

Every item keeps the 1-based number of the line it came from, so that a finding can show its
evidence (``ServerLog.evidence(n)``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from moetune.kinds import LogEra, LogPhase

# Buffer kinds, as llama.cpp names them in "<device> <kind> buffer size = N MiB"
MODEL, KV, RS, COMPUTE, OUTPUT = "model", "kv", "rs", "compute", "output"
BUFFER_KINDS = (MODEL, KV, RS, COMPUTE, OUTPUT)

# Failure kinds the grammars recognise (the line that says so is the evidence)
ALLOC_FAILED = "alloc_failed"  # a buffer could not be allocated (see ServerLog.alloc_failures)
MODEL_OPEN_FAILED = "model_open_failed"  # subject: the path
MODEL_LOAD_FAILED = "model_load_failed"  # the loader gave up (after a more specific line, usually)
BIND_FAILED = "bind_failed"  # subject: host:port
RPC_CONNECT_FAILED = "rpc_connect_failed"  # subject: host:port
RPC_CRASHED = "rpc_crashed"  # the client lost its RPC server mid-call
RPC_PROTOCOL = "rpc_protocol"  # a worker refused a client's handshake (another protocol); subject: its words
BAD_ARGUMENT = "bad_argument"  # subject: the argument
ABORTED = "aborted"  # GGML_ABORT / GGML_ASSERT; subject: the message
SPLIT_DEVICES = "split_devices"  # ik_llama.cpp: -sm graph/attn with one device; subject: the mode
# serving failures: the server runs, but requests fail (not a failed load)
TEMPLATE_UNSUPPORTED = "template_unsupported"  # ik_llama.cpp without --jinja; subject: its words
SERVING_FAILURES = frozenset({TEMPLATE_UNSUPPORTED})


def device_key(name: str) -> str:
    """The device part of a buffer name: ``RPC0[127.0.0.1:50052]`` → ``RPC0``."""
    return name.split("[", 1)[0]


@dataclass(frozen=True, slots=True)
class Evidence:
    line: int  # 1-based
    text: str  # the line without its timestamp/level prefix


@dataclass(frozen=True, slots=True, kw_only=True)
class Device:
    name: str  # CUDA0, RPC0, CPU
    description: str
    total_mib: float | None
    free_mib: float | None
    line: int


@dataclass(frozen=True, slots=True)
class Buffer:
    device: str  # as logged: CUDA0, CUDA_Host, CPU_Mapped, RPC0[127.0.0.1:50052]
    kind: str  # model | kv | rs | compute | output
    size_mib: float
    line: int


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceBuffers:
    device: str
    model_mib: float = 0.0
    kv_mib: float = 0.0
    rs_mib: float = 0.0
    compute_mib: float = 0.0
    output_mib: float = 0.0

    @property
    def total_mib(self) -> float:
        return self.model_mib + self.kv_mib + self.rs_mib + self.compute_mib + self.output_mib


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryRow:
    """One row of mainline's ``memory breakdown [MiB]`` table (whole MiB, as printed)."""

    name: str  # "CUDA0", "RPC0", "Host", "CPU_REPACK"
    description: str  # "RTX 4090", "127.0.0.1:50052", ""
    total_mib: int | None  # devices only
    free_mib: int | None
    self_mib: int
    model_mib: int
    context_mib: int
    compute_mib: int
    unaccounted_mib: int | None  # devices only


@dataclass(frozen=True, slots=True)
class MemoryBreakdown:
    rows: tuple[MemoryRow, ...]
    line: int
    projected: bool = False  # printed by --fit before loading (a projection), not by the loaded server

    def row(self, name: str) -> MemoryRow | None:
        return next((r for r in self.rows if r.name == name), None)


@dataclass(frozen=True, slots=True)
class PinnedAlloc:
    """ik_llama.cpp's ``Allocating 299.91 GiB of pinned host memory`` (and its ``done`` line)."""

    size_mib: float
    took_ms: float | None
    line: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestTiming:
    """The server's per-request timing lines (``prompt eval time``, ``eval time``, ``total time``)."""

    prompt_ms: float
    prompt_tokens: int
    eval_ms: float | None
    eval_tokens: int | None
    total_ms: float | None
    total_tokens: int | None
    slot: int | None
    task: int | None
    line: int

    @property
    def prompt_tokens_per_s(self) -> float | None:
        return self.prompt_tokens / self.prompt_ms * 1e3 if self.prompt_ms > 0 else None

    @property
    def eval_tokens_per_s(self) -> float | None:
        if self.eval_ms is None or self.eval_tokens is None or self.eval_ms <= 0:
            return None
        return self.eval_tokens / self.eval_ms * 1e3

    @property
    def eval_ms_per_token(self) -> float | None:
        if self.eval_ms is None or not self.eval_tokens:
            return None
        return self.eval_ms / self.eval_tokens


@dataclass(frozen=True, slots=True)
class AllocFailure:
    device: str  # as logged (CUDA0, RPC0[127.0.0.1:50052], CPU); "device 0" becomes CUDA0
    size_mib: float | None  # None where the line does not say
    what: str  # compute | kv | model | output | unknown
    line: int


@dataclass(frozen=True, slots=True)
class Failure:
    kind: str  # one of the *_FAILED / ABORTED constants
    subject: str | None
    line: int


@dataclass(frozen=True, slots=True)
class SplitModeChange:
    requested: str  # graph
    actual: str  # layer
    reason: str
    line: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheMiss:
    """A request whose prompt matched the slot's cached tokens only in part."""

    line: int
    slot: int | None
    cached_tokens: int | None  # tokens the slot held before the request
    common_tokens: int | None  # of those, the prefix the new prompt shares
    reevaluated_tokens: int | None  # prompt tokens the request then evaluated
    cache_text: str | None  # text around the divergence, cache side (when the engine prints it)
    prompt_text: str | None  # ... and prompt side
    lines: tuple[int, ...]  # all evidence lines

    @property
    def discarded_tokens(self) -> int | None:
        if self.cached_tokens is None or self.common_tokens is None:
            return None
        return max(self.cached_tokens - self.common_tokens, 0)


@dataclass(frozen=True, slots=True, kw_only=True)
class Checkpoint:
    """A context checkpoint the server created or restored (hybrid recurrent and sliding-window
    models keep them: their state cannot be rolled back to an earlier token otherwise)."""

    line: int
    slot: int | None
    pos_max: int  # the last position the checkpoint covers
    size_mib: float
    index: int | None = None  # created: how many the slot holds with it ("created context checkpoint 3 of 32")
    n_past: int | None = None  # restored: the cached tokens the request went on from (mainline says it)

    @property
    def tokens_kept(self) -> int:
        """Restored: the cached tokens not evaluated again (ik_llama.cpp resumes at about ``pos_max``)."""
        return self.n_past if self.n_past is not None else self.pos_max


@dataclass(frozen=True, slots=True)
class SlotWait:
    """A request that found every slot busy and waited in the queue."""

    line: int
    waited_s: float | None  # until a slot took it (None when the log has no usable times)
    started_line: int | None


@dataclass(frozen=True, slots=True)
class PhaseMark:
    phase: LogPhase
    line: int
    t_s: float | None  # seconds since the engine started, where the log has timestamps


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextParams:
    n_ctx: int | None = None
    n_batch: int | None = None
    n_ubatch: int | None = None
    flash_attn: str | None = None
    n_slots: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerLog:
    """A llama-server (or ik_llama.cpp server) log, parsed."""

    era: LogEra
    lines: tuple[str, ...]  # the text of every line, prefix removed (index = line number - 1)
    times_s: tuple[float | None, ...]  # each line's timestamp where the era has one
    devices: tuple[Device, ...] = ()
    buffers: tuple[Buffer, ...] = ()
    kv_self_mib: float | None = None  # legacy "KV self size"
    graph_nodes: int | None = None
    graph_splits: int | None = None
    context: ContextParams = field(default_factory=ContextParams)
    pinned: tuple[PinnedAlloc, ...] = ()
    timings: tuple[RequestTiming, ...] = ()
    memory_breakdowns: tuple[MemoryBreakdown, ...] = ()
    warnings: tuple[Evidence, ...] = ()
    errors: tuple[Evidence, ...] = ()
    alloc_failures: tuple[AllocFailure, ...] = ()
    failures: tuple[Failure, ...] = ()
    split_mode_changes: tuple[SplitModeChange, ...] = ()
    cache_misses: tuple[CacheMiss, ...] = ()
    # lines of requests that did not use the prompt cache although it matched (``cache_prompt: false``,
    # as benchmarks send): the engine found a common prefix and reused none of it; not misses
    uncached_requests: tuple[int, ...] = ()
    slot_waits: tuple[SlotWait, ...] = ()
    checkpoints_created: tuple[Checkpoint, ...] = ()
    checkpoint_restores: tuple[Checkpoint, ...] = ()
    full_reprocessing: tuple[int, ...] = ()  # lines: no cache data nor checkpoint to go on from (SWA, hybrid)
    phases: tuple[PhaseMark, ...] = ()
    listening: str | None = None  # the URL the server said it listens on

    @property
    def phase(self) -> str:
        return self.phases[-1].phase if self.phases else LogPhase.STARTING

    @property
    def memory_breakdown(self) -> MemoryBreakdown | None:
        """The last memory breakdown table (mainline prints one at fit time and one at exit)."""
        return self.memory_breakdowns[-1] if self.memory_breakdowns else None

    @property
    def failed(self) -> bool:
        """The server failed to start (serving failures such as TEMPLATE_UNSUPPORTED do not count)."""
        return any(f.kind not in SERVING_FAILURES for f in self.failures)

    def evidence(self, line: int) -> Evidence:
        return Evidence(line, self.lines[line - 1])

    def device(self, name: str) -> Device | None:
        key = device_key(name)
        return next((d for d in self.devices if d.name == key), None)

    def device_buffers(self) -> dict[str, DeviceBuffers]:
        """Buffers summed per device name as logged (``RPC0[host:port]`` and ``CUDA_Host`` kept apart).

        A reserve that runs twice (mainline reserves again after a failed pipeline-parallel try)
        logs its compute buffers twice; only the last report per device and kind counts.
        """
        last: dict[tuple[str, str], float] = {}
        sums: dict[tuple[str, str], float] = {}
        for b in self.buffers:
            if b.kind == COMPUTE:
                last[(b.device, b.kind)] = b.size_mib
            else:
                sums[(b.device, b.kind)] = sums.get((b.device, b.kind), 0.0) + b.size_mib
        sums.update(last)
        out: dict[str, dict[str, float]] = {}
        for (dev, kind), mib in sums.items():
            out.setdefault(dev, {})[kind] = mib
        return {
            dev: DeviceBuffers(device=dev, **{f"{k}_mib": v for k, v in kinds.items()}) for dev, kinds in out.items()
        }

    def pinned_host_mib(self) -> float:
        """Host memory the engine pinned: ik_llama.cpp's explicit allocations, else CUDA_Host buffers."""
        if self.pinned:
            return sum(p.size_mib for p in self.pinned)
        return sum(b.size_mib for b in self.buffers if b.device.endswith("_Host") and b.kind != COMPUTE)


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerLog:
    """A ggml-rpc-server (rpc-server) log."""

    lines: tuple[str, ...]
    version: str | None = None
    endpoint: str | None = None
    devices: tuple[Device, ...] = ()
    transport: str | None = None  # as the banner says: "TCP", "TCP (RDMA auto-negotiate enabled)"
    rdma_probed: tuple[Evidence, ...] = ()
    rdma_activated: tuple[Evidence, ...] = ()
    rdma_errors: tuple[Evidence, ...] = ()
    connections: int = 0
    errors: tuple[Evidence, ...] = ()
    failures: tuple[Failure, ...] = ()

    @property
    def rdma_in_use(self) -> bool:
        return bool(self.rdma_activated)

    def evidence(self, line: int) -> Evidence:
        return Evidence(line, self.lines[line - 1])


ANSI = re.compile(r"\x1b\[[0-9;]*m")
