"""Read llama.cpp and ik_llama.cpp logs into data. One grammar per log era.

    from moetune.engine.logs import parse_log
    log = parse_log(text)                  # the era is detected
    log.era                                # "mainline" or "legacy"
    log.device_buffers()["CUDA0"].compute_mib
    log.memory_breakdown.row("RPC0")       # mainline's table (the last one printed)
    log.timings[-1].eval_tokens_per_s
    log.phase                              # "loading tensors", "warm-up", "ready", ...

    parse_worker_log(text)                 # a ggml-rpc-server / rpc-server log
    phases_in(lines, era)                  # the load phases some new lines go through (for progress)

Eras: ``mainline`` is llama.cpp from about build 4400 on (``0.00.031.526 I load_tensors: ...``,
``sched_reserve:``, the memory breakdown table, ``print_timing``); ``legacy`` is ik_llama.cpp and
older llama.cpp (``llm_load_tensors:``, ``llama_kv_cache_init:``, ``llama_init_from_model:``).
Every function here is pure: text in, frozen dataclasses out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from moetune.engine.logs import legacy, mainline
from moetune.engine.logs.common import Acc, run_grammar
from moetune.engine.logs.rpc import is_worker_log, parse_worker_log
from moetune.engine.logs.types import (
    ANSI,
    BUFFER_KINDS,
    AllocFailure,
    Buffer,
    CacheMiss,
    Checkpoint,
    ContextParams,
    Device,
    DeviceBuffers,
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
    WorkerLog,
    device_key,
)
from moetune.kinds import LogEra, LogPhase

__all__ = [
    "BUFFER_KINDS",
    "AllocFailure",
    "Buffer",
    "CacheMiss",
    "Checkpoint",
    "ContextParams",
    "Device",
    "DeviceBuffers",
    "Evidence",
    "Failure",
    "MemoryBreakdown",
    "MemoryRow",
    "PhaseMark",
    "PinnedAlloc",
    "RequestTiming",
    "ServerLog",
    "SlotWait",
    "SplitModeChange",
    "WorkerLog",
    "detect_era",
    "device_key",
    "is_worker_log",
    "parse_log",
    "parse_worker_log",
    "phases_in",
    "split_lines",
]

_MAINLINE_MARK = re.compile(
    r"^\d+\.\d{2}\.\d{3}\.\d{3} [IWEDT] |^(?:load_tensors|sched_reserve|llama_context|"
    r"llama_kv_cache|common_memory_breakdown_print|print_info):"
)
_LEGACY_MARK = re.compile(
    r"^(?:llm_load_tensors|llm_load_print_meta|llama_kv_cache_init|llama_new_context_with_model|"
    r"llama_init_from_model|ggml_cuda_init):|^(?:INFO|WARN|ERR|VERB) \[|of pinned host memory|"
    r"Common part does not match fully|======== Cache:"
)
_GRAMMARS = {LogEra.MAINLINE: mainline, LogEra.LEGACY: legacy}


def split_lines(text: str) -> list[str]:
    """Lines without colours and carriage returns."""
    return ANSI.sub("", text).replace("\r\n", "\n").replace("\r", "\n").splitlines()


def detect_era(lines: Sequence[str]) -> LogEra:
    """``mainline`` or ``legacy``, by which era's marks the log carries more of (mainline on a tie)."""
    head = lines[:5000]
    n_main = sum(1 for x in head if _MAINLINE_MARK.search(x))
    n_legacy = sum(1 for x in head if _LEGACY_MARK.search(x))
    return LogEra.LEGACY if n_legacy > n_main else LogEra.MAINLINE


def _era(era: str | None, lines: Sequence[str]) -> LogEra:
    if era is None:
        return detect_era(lines)
    if era not in _GRAMMARS:
        raise ValueError(f"unknown log era {era!r} (known: {', '.join(LogEra)})")
    return LogEra(era)


def parse_log(text: str, era: str | None = None) -> ServerLog:
    """Parse a server log; ``era`` forces a grammar (default: detected)."""
    lines = split_lines(text)
    log: ServerLog = _GRAMMARS[_era(era, lines)].parse(lines)
    return log


def phases_in(lines: Sequence[str], era: str | None = None) -> list[LogPhase]:
    """The load phases these lines (say, the ones a log gained since the last look) go through, in order."""
    lines = [ANSI.sub("", x) for x in lines]
    era_ = _era(era, lines)
    grammar = _GRAMMARS[era_]
    texts = grammar.texts(lines)
    acc = Acc(era_, texts, [None] * len(texts))
    run_grammar(acc, grammar.PHASE_ONLY_RULES)
    return [p.phase for p in acc.phases]
