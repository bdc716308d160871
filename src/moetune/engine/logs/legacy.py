"""The grammar of the older log era: ik_llama.cpp and llama.cpp before about build 4400.

Lines carry no time or level prefix; functions are named ``llm_load_tensors:`` (model buffers,
written ``<device> buffer size``), ``llama_kv_cache_init:``, ``llama_init_from_model:`` or
``llama_new_context_with_model:`` (context, compute buffers, ``graph splits = N``). ik_llama.cpp
adds ``Allocating 299.91 GiB of pinned host memory``, the ``-sm graph`` fallback
(``Split mode 'graph' is not supported for this model`` / ``=> changing split mode to 'layer'``),
its prefix-cache report (``======== Cache: cache_size = N, n_past = M``, ``Common part does not
match fully``, then ``cache :`` and ``prompt:`` with the text around the divergence) and server
lines like ``INFO [   launch_slot_with_task] slot is processing task | tid=... timestamp=...``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from moetune.engine.logs.common import (
    PHASE_SHARED_RULES,
    SHARED_RULES,
    Acc,
    Rule,
    classify_by_words,
    collect_tables,
    num,
    phase_rule,
    rule,
    run_grammar,
)
from moetune.engine.logs.types import (
    BIND_FAILED,
    MODEL,
    SPLIT_DEVICES,
    TEMPLATE_UNSUPPORTED,
    CacheMiss,
    Checkpoint,
    Device,
    ServerLog,
    SplitModeChange,
)
from moetune.kinds import LogEra, LogPhase

TIMESTAMP = re.compile(r"\btimestamp=(\d+)")
# where a detokenized "cache :" / "prompt:" text stops: the next line that looks like a log statement
STATEMENT = re.compile(
    r"^(?:INFO|WARN|ERR|VERB) \[|^[A-Za-z_][\w]*: |^slot |^srv |^\s*(?:prompt eval|eval|total) time"
    r"|^=+|^prompt: |^cache : "
)


def _text_block(acc: Acc, n: int, first: str) -> tuple[str, int]:
    """A detokenized text that may span lines; returns it and its last line."""
    parts, k = [first], n
    while k < len(acc.lines) and len(parts) < 8 and not STATEMENT.search(acc.text(k + 1)):
        k += 1
        parts.append(acc.text(k))
    return "\n".join(parts), k


@rule(r"\bid_slot=(\d+) id_task=(-?\d+)")
def _slot_task(acc: Acc, m: re.Match[str], n: int) -> None:
    acc.slot_task = (int(m[1]), int(m[2]))


@rule(r"^\s*Device (\d+): (.+?), compute capability .*?VRAM: (\d+) MiB")
def _cuda_device(acc: Acc, m: re.Match[str], n: int) -> None:
    acc.devices.append(Device(name=f"CUDA{m[1]}", description=m[2], total_mib=num(m[3]), free_mib=None, line=n))


@rule(r"^llm_load_tensors:\s+(\S+) (?:model )?buffer size =\s*([\d.]+) MiB")
def _model_buffer(acc: Acc, m: re.Match[str], n: int) -> None:
    acc.buffer(m[1], MODEL, num(m[2]), n)


@rule(r"KV self size\s*=\s*([\d.]+) MiB")
def _kv_self(acc: Acc, m: re.Match[str], n: int) -> None:
    acc.kv_self_mib = num(m[1])


@rule(r"graph nodes\s*=\s*(\d+)|graph splits\s*=\s*(\d+)")
def _graph(acc: Acc, m: re.Match[str], n: int) -> None:
    if m[1]:
        acc.graph_nodes = int(m[1])
    else:
        acc.graph_splits = int(m[2])


@rule(r"^(?:llama_init_from_model|llama_new_context_with_model): (n_ctx|n_batch|n_ubatch|flash_attn)\s+= (\S+)")
def _ctx_param(acc: Acc, m: re.Match[str], n: int) -> None:
    acc.set_context(m[1], m[2])


@rule(r"initializing slots.*\bn_slots=(\d+)|initializing, n_slots = (\d+)")
def _slots(acc: Acc, m: re.Match[str], n: int) -> None:
    acc.set_context("n_slots", m[1] or m[2])


PHASE_RULES: tuple[Rule, ...] = (
    phase_rule(r"^llama_model_loader: loaded meta data|^llm_load_print_meta:", LogPhase.LOADING_MODEL),
    phase_rule(r"^llm_load_tensors:", LogPhase.LOADING_TENSORS),
    phase_rule(
        r"^llama_kv_cache_init:|^(?:llama_init_from_model|llama_new_context_with_model): n_ctx",
        LogPhase.CREATING_CONTEXT,
    ),
    phase_rule(r"warming up the model", LogPhase.WARMUP),
    phase_rule(r"\bmodel loaded\b", LogPhase.READY),
)


@rule(r"HTTP server listening.*?hostname=\"?([^\" ]+)\"?.*?port=\"?(\d+)")
def _listening(acc: Acc, m: re.Match[str], n: int) -> None:
    acc.listening = f"http://{m[1]}:{m[2]}"
    acc.phase(LogPhase.READY, n)


@rule(r"couldn't bind to server socket: hostname=(\S+) port=(\d+)")
def _bind(acc: Acc, m: re.Match[str], n: int) -> None:
    acc.fail(BIND_FAILED, f"{m[1]}:{m[2]}", n)


@rule(r"It is not possible to use split mode '(\w+)' with less than 2 devices")
def _split_devices(acc: Acc, m: re.Match[str], n: int) -> None:
    acc.fail(SPLIT_DEVICES, m[1], n)


@rule(r"chat template parsing error: (.+)")
def _template(acc: Acc, m: re.Match[str], n: int) -> None:
    acc.fail(TEMPLATE_UNSUPPORTED, m[1].strip(), n)


@rule(r"=> changing split mode to '(\w+)'")
def _split_mode(acc: Acc, m: re.Match[str], n: int) -> None:
    for k in range(n - 1, max(n - 4, 0), -1):
        said = re.search(r"Split mode '(\w+)' (.+)", acc.text(k))
        if said:
            acc.split_changes.append(SplitModeChange(said[1], m[1], said[2].strip(), k))
            return
    acc.split_changes.append(SplitModeChange("?", m[1], "", n))


# -- prefix cache ---------------------------------------------------------------------------


class _Cache:
    def __init__(self) -> None:
        self.report: tuple[int, int, int] | None = None  # (line, cache_size, n_past) of "======== Cache:"


def _cache_state(acc: Acc) -> _Cache:
    assert isinstance(acc.era_state, _Cache)
    return acc.era_state


@rule(
    r"======== Cache: cache_size = (\d+), n_past0? =\s*(\d+)(?:, n_past1 =\s*(\d+), n_past_prompt1 =\s*\d+,"
    r"\s*n_past2 =\s*(\d+))?"
)
def _cache_report(acc: Acc, m: re.Match[str], n: int) -> None:
    n_past = int(m[2])
    if m[3] is not None:  # older form: the exact match (n_past1) unless the non-exact one is much longer
        n_past = int(m[3]) if int(m[3]) + 20 >= int(m[4]) else int(m[4])
    _cache_state(acc).report = (n, int(m[1]), n_past)


@rule(r"Common part does not match fully|cached sequence diverges at (\d+)/(\d+)")
def _cache_miss(acc: Acc, m: re.Match[str], n: int) -> None:
    rep = _cache_state(acc).report
    lines: tuple[int, ...]
    if m[1] is not None:
        cached, common, lines = int(m[2]), int(m[1]), (n,)
    elif rep is not None and n - rep[0] <= 3:
        cached, common, lines = rep[1], rep[2], (rep[0], n)
    else:
        cached, common, lines = None, None, (n,)
    acc.miss(
        CacheMiss(
            line=n,
            slot=acc.slot_task[0],
            cached_tokens=cached,
            common_tokens=common,
            reevaluated_tokens=None,
            cache_text=None,
            prompt_text=None,
            lines=lines,
        )
    )


@rule(r"^(cache :|prompt:) ?(.*)$")
def _cache_text(acc: Acc, m: re.Match[str], n: int) -> None:
    miss = acc.pending_miss
    if miss is None or n - miss.lines[-1] > 10:
        return
    text, last = _text_block(acc, n, m[2])
    lines = (*miss.lines, *range(n, last + 1))
    if m[1] == "cache :":
        acc.pending_miss = CacheMiss(
            line=miss.line,
            slot=miss.slot,
            cached_tokens=miss.cached_tokens,
            common_tokens=miss.common_tokens,
            reevaluated_tokens=None,
            cache_text=text,
            prompt_text=miss.prompt_text,
            lines=lines,
        )
    else:
        acc.pending_miss = CacheMiss(
            line=miss.line,
            slot=miss.slot,
            cached_tokens=miss.cached_tokens,
            common_tokens=miss.common_tokens,
            reevaluated_tokens=None,
            cache_text=miss.cache_text,
            prompt_text=text,
            lines=lines,
        )


# -- context checkpoints (ik_llama.cpp's server, for recurrent models) ---------------------------

_SLOT = r"(?:id\s+(\d+) \| task -?\d+ \| )?"


@rule(_SLOT + r"created context checkpoint (\d+) of \d+ \(pos_min = -?\d+, pos_max = (-?\d+), size = ([\d.]+) MiB")
def _checkpoint_created(acc: Acc, m: re.Match[str], n: int) -> None:
    slot = int(m[1]) if m[1] else acc.slot_task[0]
    acc.ckpt_created.append(Checkpoint(line=n, slot=slot, pos_max=int(m[3]), size_mib=num(m[4]), index=int(m[2])))


@rule(_SLOT + r"restored context checkpoint took\s+[\d.]+ ms \(pos_min = -?\d+, pos_max = (-?\d+), size = ([\d.]+) MiB")
def _checkpoint_restored(acc: Acc, m: re.Match[str], n: int) -> None:
    slot = int(m[1]) if m[1] else acc.slot_task[0]
    acc.ckpt_restored.append(Checkpoint(line=n, slot=slot, pos_max=int(m[2]), size_mib=num(m[3])))


@rule(r"forcing full prompt re-processing")
def _full_reprocessing(acc: Acc, m: re.Match[str], n: int) -> None:
    acc.full_reprocessing.append(n)


# -- slots ----------------------------------------------------------------------------------


@rule(r"no slot is available")
def _no_slot(acc: Acc, m: re.Match[str], n: int) -> None:
    acc.start_queue_wait(n)


@rule(r"slot is processing task|launch_slot_\w*: .*processing task")
def _slot_start(acc: Acc, m: re.Match[str], n: int) -> None:
    acc.slot_started(n)


RULES: tuple[Rule, ...] = (
    *SHARED_RULES,
    _slot_task,
    _cuda_device,
    _model_buffer,
    _kv_self,
    _graph,
    _ctx_param,
    _slots,
    *PHASE_RULES,
    _listening,
    _bind,
    _split_devices,
    _template,
    _split_mode,
    _cache_report,
    _cache_miss,
    _cache_text,
    _no_slot,
    _slot_start,
    _checkpoint_created,
    _checkpoint_restored,
    _full_reprocessing,
)

# the rules a progress display needs: which phase the new lines reach
PHASE_ONLY_RULES: tuple[Rule, ...] = (*PHASE_RULES, _listening, *PHASE_SHARED_RULES)


def texts(raw_lines: Sequence[str]) -> list[str]:
    return list(raw_lines)


def parse(raw_lines: Sequence[str]) -> ServerLog:
    times: list[float | None] = []
    for raw in raw_lines:
        m = TIMESTAMP.search(raw)
        t = float(m[1]) if m else None
        times.append(t if t is not None and math.isfinite(t) else None)  # thousands of digits: no time
    acc = Acc(LogEra.LEGACY, raw_lines, times)
    acc.era_state = _Cache()
    run_grammar(acc, RULES)
    collect_tables(acc)
    classify_by_words(acc)
    return acc.finish()
