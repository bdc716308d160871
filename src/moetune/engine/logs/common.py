"""What both eras share: the accumulator the grammars fill, and the lines ggml and the server
print the same way in both (timing lines, allocation failures, aborts, RPC connects).

A grammar is a list of rules ``(pattern, action)``; each line is tried against every rule with
``re.search``. Actions write into :class:`Acc`; :meth:`Acc.finish` freezes it into a ServerLog.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from moetune.engine.logs.types import (
    ABORTED,
    ALLOC_FAILED,
    BAD_ARGUMENT,
    COMPUTE,
    KV,
    MODEL,
    MODEL_LOAD_FAILED,
    MODEL_OPEN_FAILED,
    OUTPUT,
    RPC_CONNECT_FAILED,
    RPC_CRASHED,
    AllocFailure,
    Buffer,
    CacheMiss,
    Checkpoint,
    ContextParams,
    Device,
    Evidence,
    Failure,
    MemoryBreakdown,
    MemoryRow,
    PhaseMark,
    PinnedAlloc,
    RequestTiming,
    ServerLog,
    SlotWait,
    SplitModeChange,
)
from moetune.kinds import LogEra, LogPhase

Action = Callable[["Acc", re.Match[str], int], None]
Rule = tuple[re.Pattern[str], Action]

GIB = 1024.0
MIB_PER_BYTE = 1.0 / (1024 * 1024)


def rule(pattern: str, flags: int = 0) -> Callable[[Action], Rule]:
    """Decorator: ``@rule(r"...")`` turns an action into a (pattern, action) rule."""

    def wrap(action: Action) -> Rule:
        return re.compile(pattern, flags), action

    return wrap


def phase_rule(pattern: str, phase: LogPhase) -> Rule:
    """A rule that marks the load phase a line announces."""
    return re.compile(pattern), lambda acc, m, n: acc.phase(phase, n)


@dataclass(slots=True, kw_only=True)
class _Timing:
    """The timing lines of one request as they arrive: (ms, tokens) of each."""

    line: int
    slot: int | None
    task: int | None
    prompt: tuple[float, int] | None = None
    eval: tuple[float, int] | None = None
    total: tuple[float, int] | None = None

    def done(self) -> RequestTiming | None:
        if self.prompt is None:
            return None
        ev, tot = self.eval or (None, None), self.total or (None, None)
        return RequestTiming(
            prompt_ms=self.prompt[0],
            prompt_tokens=self.prompt[1],
            eval_ms=ev[0],
            eval_tokens=ev[1],
            total_ms=tot[0],
            total_tokens=tot[1],
            slot=self.slot,
            task=self.task,
            line=self.line,
        )


class Acc:
    """Mutable collection of what a log says; one per parse."""

    def __init__(
        self,
        era: LogEra,
        lines: Sequence[str],
        times: Sequence[float | None],
        levels: Sequence[str | None] | None = None,
    ) -> None:
        self.era = era
        self.lines = tuple(lines)
        self.times = tuple(times)
        self.levels = tuple(levels) if levels is not None else (None,) * len(self.lines)
        self.devices: list[Device] = []
        self.buffers: list[Buffer] = []
        self.kv_self_mib: float | None = None
        self.graph_nodes: int | None = None
        self.graph_splits: int | None = None
        self.context = ContextParams()
        self.pinned: list[PinnedAlloc] = []
        self.timings: list[RequestTiming] = []
        self.tables: list[MemoryBreakdown] = []
        self.warnings: list[Evidence] = []
        self.errors: list[Evidence] = []
        self.alloc_failures: list[AllocFailure] = []
        self.failures: list[Failure] = []
        self.split_changes: list[SplitModeChange] = []
        self.misses: list[CacheMiss] = []
        self.uncached: list[int] = []
        self.waits: list[SlotWait] = []
        self.ckpt_created: list[Checkpoint] = []
        self.ckpt_restored: list[Checkpoint] = []
        self.full_reprocessing: list[int] = []
        self.phases: list[PhaseMark] = []
        self.listening: str | None = None
        # state shared between lines
        self.slot_task: tuple[int | None, int | None] = (None, None)
        self.pending_timing: _Timing | None = None
        self.pending_miss: CacheMiss | None = None  # waits for its prompt eval line
        self.queued: list[int] = []  # lines of requests waiting for a slot, oldest first
        self.era_state: object = None  # what one era's grammar keeps between lines

    # -- helpers for actions --------------------------------------------------------------
    def time(self, n: int) -> float | None:
        return self.times[n - 1]

    def text(self, n: int) -> str:
        return self.lines[n - 1]

    def phase(self, name: LogPhase, n: int) -> None:
        if not self.phases or self.phases[-1].phase != name:
            self.phases.append(PhaseMark(name, n, self.time(n)))

    def current_phase(self) -> LogPhase | None:
        return self.phases[-1].phase if self.phases else None

    def buffer(self, device: str, kind: str, mib: float, n: int) -> None:
        self.buffers.append(Buffer(device, kind, mib, n))

    def fail(self, kind: str, subject: str | None, n: int) -> None:
        if not any(f.kind == kind and f.subject == subject for f in self.failures):
            self.failures.append(Failure(kind, subject, n))

    def alloc_failure(self, device: str, size_mib: float | None, n: int) -> None:
        for f in self.alloc_failures:  # CUDA's own line and ggml-alloc's line report the same failure
            if f.device == device and n - f.line <= 3:
                return
        phase = self.current_phase()
        what = (
            {LogPhase.LOADING_TENSORS: MODEL, LogPhase.CREATING_CONTEXT: KV, LogPhase.ALLOCATING_COMPUTE: COMPUTE}.get(
                phase, "unknown"
            )
            if phase
            else "unknown"
        )
        self.alloc_failures.append(AllocFailure(device, size_mib, what, n))
        self.fail(ALLOC_FAILED, device, n)

    def alloc_failure_is(self, what: str) -> None:
        """A later line says what the failed allocation was for."""
        self.alloc_failures = [replace(f, what=what) if f.what == "unknown" else f for f in self.alloc_failures]

    def start_queue_wait(self, n: int) -> None:
        self.queued.append(n)

    def slot_started(self, n: int) -> None:
        """A slot took a task: the oldest waiting request (if any) stops waiting."""
        if not self.queued:
            return
        q = self.queued.pop(0)
        t0, t1 = self.time(q), self.time(n)
        self.waits.append(SlotWait(q, (t1 - t0) if t0 is not None and t1 is not None else None, n))

    def set_context(self, key: str, value: str) -> None:
        """A context parameter as logged: ``n_ctx``, ``n_batch``, ``n_ubatch``, ``n_slots`` (ints), ``flash_attn``."""
        change: dict[str, Any] = {key: value if key == "flash_attn" else int(value)}
        self.context = replace(self.context, **change)

    def timing(self, what: str, ms: float, tokens: int, n: int) -> None:
        if what == "prompt eval" or self.pending_timing is None:
            self.flush_timing()
            slot, task = self.slot_task
            self.pending_timing = _Timing(line=n, slot=slot, task=task)
        key = {"prompt eval": "prompt", "eval": "eval", "total": "total"}[what]
        setattr(self.pending_timing, key, (ms, tokens))
        if what == "prompt eval" and self.pending_miss is not None:
            self.misses.append(
                replace(self.pending_miss, reevaluated_tokens=tokens, lines=(*self.pending_miss.lines, n))
            )
            self.pending_miss = None
        if what == "total":
            self.flush_timing()

    def flush_timing(self) -> None:
        p, self.pending_timing = self.pending_timing, None
        t = p.done() if p is not None else None
        if t is not None:
            self.timings.append(t)

    def miss(self, m: CacheMiss) -> None:
        if self.pending_miss is not None:
            self.misses.append(self.pending_miss)
        self.pending_miss = m

    def finish(self) -> ServerLog:
        self.flush_timing()
        if self.pending_miss is not None:
            self.misses.append(self.pending_miss)
        for q in self.queued:  # still waiting when the log ends
            self.waits.append(SlotWait(q, None, None))
        return ServerLog(
            era=self.era,
            lines=self.lines,
            times_s=self.times,
            devices=tuple(self.devices),
            buffers=tuple(self.buffers),
            kv_self_mib=self.kv_self_mib,
            graph_nodes=self.graph_nodes,
            graph_splits=self.graph_splits,
            context=self.context,
            pinned=tuple(self.pinned),
            timings=tuple(self.timings),
            memory_breakdowns=tuple(self.tables),
            warnings=tuple(self.warnings),
            errors=tuple(self.errors),
            alloc_failures=tuple(self.alloc_failures),
            failures=tuple(self.failures),
            split_mode_changes=tuple(self.split_changes),
            cache_misses=tuple(self.misses),
            uncached_requests=tuple(self.uncached),
            slot_waits=tuple(self.waits),
            checkpoints_created=tuple(self.ckpt_created),
            checkpoint_restores=tuple(self.ckpt_restored),
            full_reprocessing=tuple(self.full_reprocessing),
            phases=tuple(self.phases),
            listening=self.listening,
        )


def run_grammar(acc: Acc, rules: Sequence[Rule]) -> None:
    for n, text in enumerate(acc.lines, 1):
        for pattern, action in rules:
            m = pattern.search(text)
            if m:
                try:
                    action(acc, m, n)
                except (ValueError, OverflowError):
                    # a number the pattern admits but that does not read as one ("1.2.3", "." or thousands
                    # of digits, too many for a float, from a damaged or interleaved log): the line is not
                    # one this rule reads
                    continue


def num(text: str) -> float:
    """A number of a log line; ValueError for one no real log prints (infinite: thousands of digits),
    so that the rule skips the line (run_grammar)."""
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"not a finite number: {text[:20]}")
    return v


def to_mib(size: str, unit: str) -> float:
    v = num(size)
    return {"GiB": v * GIB, "MiB": v, "MB": v, "KiB": v / 1024, "B": v * MIB_PER_BYTE}[unit]


# -- lines ggml and the server print alike in both eras -------------------------------------


@rule(r"\bid\s+(\d+) \| task (-?\d+) \|")
def _slot_task(acc: Acc, m: re.Match[str], n: int) -> None:
    acc.slot_task = (int(m[1]), int(m[2]))


@rule(r"\b(prompt eval|eval|total) time\s*=\s*([\d.]+) ms /\s*(\d+) (?:tokens|runs)")
def _timing(acc: Acc, m: re.Match[str], n: int) -> None:
    acc.timing(m[1], num(m[2]), int(m[3]), n)


@rule(r"failed to allocate (\S+) buffer of size (\d+)")
def _alloc_named(acc: Acc, m: re.Match[str], n: int) -> None:
    acc.alloc_failure(m[1], int(m[2]) * MIB_PER_BYTE, n)


@rule(r"allocating ([\d.]+) MiB on device (\d+): cudaMalloc failed")
def _alloc_cuda(acc: Acc, m: re.Match[str], n: int) -> None:
    acc.alloc_failure(f"CUDA{m[2]}", num(m[1]), n)


@rule(r"unable to allocate (\S+) buffer")
def _alloc_model(acc: Acc, m: re.Match[str], n: int) -> None:
    acc.alloc_failure(m[1], None, n)
    acc.alloc_failure_is(MODEL)


@rule(r"failed to allocate compute(?: pp| tg)? buffers")
def _alloc_was_compute(acc: Acc, m: re.Match[str], n: int) -> None:
    acc.alloc_failure_is(COMPUTE)


@rule(r"failed to allocate buffer for kv cache")
def _alloc_was_kv(acc: Acc, m: re.Match[str], n: int) -> None:
    acc.alloc_failure_is(KV)


@rule(r"failed to allocate output buffer of size ([\d.]+) MiB")
def _alloc_was_output(acc: Acc, m: re.Match[str], n: int) -> None:
    acc.alloc_failure("output", num(m[1]), n)
    acc.alloc_failure_is(OUTPUT)


@rule(r"failed to open (?:GGUF file )?'([^']*)'")
def _model_open(acc: Acc, m: re.Match[str], n: int) -> None:
    acc.fail(MODEL_OPEN_FAILED, m[1], n)


@rule(r"error loading model|failed to load model")
def _model_load(acc: Acc, m: re.Match[str], n: int) -> None:
    acc.fail(MODEL_LOAD_FAILED, None, n)


@rule(r"Failed to connect to (\S+)")
def _rpc_connect(acc: Acc, m: re.Match[str], n: int) -> None:
    acc.fail(RPC_CONNECT_FAILED, m[1], n)


@rule(r"Remote RPC server crashed or returned malformed response")
def _rpc_crashed(acc: Acc, m: re.Match[str], n: int) -> None:
    acc.fail(RPC_CRASHED, None, n)


@rule(
    r"error: invalid argument: (.+)|error while handling argument \"([^\"]+)\"(?:: (.+))?|unknown argument: (\S+)"
    r"|error: invalid parameter for argument: (\S+)"
)
def _bad_argument(acc: Acc, m: re.Match[str], n: int) -> None:
    """Subject: the argument, and the engine's reason where it gives one (``-ot: unknown buffer type``;
    ik_llama.cpp: ``invalid parameter`` for a value it cannot take)."""
    if m[5]:
        acc.fail(BAD_ARGUMENT, f"{m[5]}: invalid value", n)
        return
    arg = (m[1] or m[2] or m[4]).strip()
    acc.fail(BAD_ARGUMENT, f"{arg}: {m[3].strip()}" if m[3] else arg, n)


@rule(r"^\S+\.(?:c|cc|cpp|cu|h):\d+: (.+)$")
def _abort(acc: Acc, m: re.Match[str], n: int) -> None:
    acc.fail(ABORTED, m[1].strip(), n)


@rule(r"Allocating ([\d.]+) (GiB|MiB) of pinned host memory")
def _pinned(acc: Acc, m: re.Match[str], n: int) -> None:
    acc.pinned.append(PinnedAlloc(to_mib(m[1], m[2]), None, n))
    acc.phase(LogPhase.ALLOCATING_PINNED, n)


@rule(r"done allocating ([\d.]+) (GiB|MiB) in ([\d.]+) ms")
def _pinned_done(acc: Acc, m: re.Match[str], n: int) -> None:
    if acc.pinned:
        acc.pinned[-1] = replace(acc.pinned[-1], took_ms=num(m[3]))


@rule(r"(?:^|\s)(\S+)\s+(KV|RS|compute|output) buffer size =\s*([\d.]+) MiB")
def _context_buffer(acc: Acc, m: re.Match[str], n: int) -> None:
    acc.buffer(m[1], m[2].lower(), num(m[3]), n)
    if m[2] == "compute":
        acc.phase(LogPhase.ALLOCATING_COMPUTE, n)


# the shared rules that mark a load phase (a grammar's phase-only scan needs them too)
PHASE_SHARED_RULES: tuple[Rule, ...] = (_pinned, _context_buffer)

SHARED_RULES: tuple[Rule, ...] = (
    _slot_task,
    _timing,
    _alloc_named,
    _alloc_cuda,
    _alloc_model,
    _alloc_was_compute,
    _alloc_was_kv,
    _alloc_was_output,
    _model_open,
    _model_load,
    _rpc_connect,
    _rpc_crashed,
    _bad_argument,
    _abort,
    _pinned,
    _pinned_done,
    _context_buffer,
)

# A memory breakdown table row (mainline, but ik_llama.cpp may adopt it; the grammar decides)
TABLE_HEADER = re.compile(r"\|\s*memory breakdown \[MiB\]\s*\|")
TABLE_DEVICE = re.compile(
    r"\|\s+- (?P<name>\S+)(?: \((?P<desc>[^|]*)\))?\s*\|\s*(?P<total>-?\d+) = (?P<free>-?\d+) \+ \(\s*(?P<self>-?\d+) ="
    r"\s*(?P<model>-?\d+) \+\s*(?P<ctx>-?\d+) \+\s*(?P<compute>-?\d+)\) \+\s*(?P<unacc>-?\d+) \|"
)
TABLE_OTHER = re.compile(
    r"\|\s+- (?P<name>\S+)(?: \((?P<desc>[^|]*)\))?\s*\|\s*(?P<self>-?\d+) =\s*(?P<model>-?\d+) \+\s*(?P<ctx>-?\d+)"
    r" \+\s*(?P<compute>-?\d+)\s*\|"
)


def table_row(text: str) -> MemoryRow | None:
    m = TABLE_DEVICE.search(text)
    if m:
        return MemoryRow(
            name=m["name"],
            description=(m["desc"] or "").strip(),
            total_mib=int(m["total"]),
            free_mib=int(m["free"]),
            self_mib=int(m["self"]),
            model_mib=int(m["model"]),
            context_mib=int(m["ctx"]),
            compute_mib=int(m["compute"]),
            unaccounted_mib=int(m["unacc"]),
        )
    m = TABLE_OTHER.search(text)
    if m:
        return MemoryRow(
            name=m["name"],
            description=(m["desc"] or "").strip(),
            total_mib=None,
            free_mib=None,
            self_mib=int(m["self"]),
            model_mib=int(m["model"]),
            context_mib=int(m["ctx"]),
            compute_mib=int(m["compute"]),
            unaccounted_mib=None,
        )
    return None


def collect_tables(acc: Acc) -> None:
    """Group header + row lines into MemoryBreakdown tables (after the rules ran: needs the phases)."""
    rows: list[MemoryRow] = []
    start = 0

    def close() -> None:
        if start and rows:
            before = [p.phase for p in acc.phases if p.line < start]
            projected = LogPhase.FITTING in before and LogPhase.LOADING_TENSORS not in before
            acc.tables.append(MemoryBreakdown(tuple(rows), start, projected))

    for n, text in enumerate(acc.lines, 1):
        if TABLE_HEADER.search(text):
            close()
            rows, start = [], n
            continue
        if start:
            row = table_row(text)
            if row is not None:
                rows.append(row)
                continue
            close()
            rows, start = [], 0
    close()


# Where a log has no level prefix, a line's words say whether it reports an error or a warning.
ERROR_WORDS = re.compile(r"^ERR \[|\b(?:error|failed|failure|out of memory|GGML_ASSERT|GGML_ABORT)\b", re.I)
WARNING_WORDS = re.compile(
    r"^WARN \[|\bwarning\b|=> changing|not supported for this model|does not match fully|-- ignoring"
    r"|is not in special_eog_ids",
    re.I,
)


def classify_by_words(acc: Acc) -> None:
    for n, text in enumerate(acc.lines, 1):
        if ERROR_WORDS.search(text):
            acc.errors.append(Evidence(n, text))
        elif WARNING_WORDS.search(text):
            acc.warnings.append(Evidence(n, text))
