"""The grammar of current mainline llama.cpp logs (about build 4400 on; checked on build 11434).

Every line a llama.cpp library or server function prints starts with the time since start and a
level: ``0.00.031.526 I load_tensors:   CPU_Mapped model buffer size =  1548.03 MiB``. The load
details (buffers, graph, device list, memory breakdown) need ``-lv 4``; the default verbosity
prints little more than the phases and the per-request timing lines. Names differ from the older
era: ``load_tensors:``, ``llama_kv_cache:``, ``sched_reserve:``, ``llama_context:``,
``graph: nodes = N, splits = M``. Slot debugging (``LLAMA_SERVER_SLOTS_DEBUG=1``) prints the text
around a prefix-cache divergence as ``old: ... | ...`` / ``new: ... | ...``. A request sent with
``cache_prompt: false`` (as benchmarks send) shows as a slot search that finds a common prefix
(``checking sim = 0.933 (335/359)``) followed by ``cached n_tokens = 0``: a choice, not a miss.
"""

from __future__ import annotations

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
    CacheMiss,
    Checkpoint,
    Device,
    Evidence,
    ServerLog,
)
from moetune.kinds import LogEra, LogPhase

PREFIX = re.compile(r"^([0-9]{1,12})\.([0-9]{2})\.([0-9]{3})\.([0-9]{3}) ([IWEDT]) ")
LEVEL_ONLY = re.compile(r"^([IWED]) ")
# a request whose prompt drops more cached tokens than this counts as a prefix-cache miss
# (ik_llama.cpp's own threshold for "Common part does not match fully")
MISS_MIN_DISCARDED = 20
BACKENDS = r"(?:CPU|CUDA|ROCm|HIP|Vulkan|SYCL|Metal|RPC|MUSA|CANN|BLAS|OpenCL|ZDNN|WebGPU)\d*"


def split_prefix(raw: str) -> tuple[str, float | None, str | None]:
    """(text, seconds since start, level) of one line; continuation lines have neither."""
    m = PREFIX.match(raw)
    if m:
        t = int(m[1]) * 60 + int(m[2]) + int(m[3]) / 1e3 + int(m[4]) / 1e6
        return raw[m.end() :], t, m[5]
    m = LEVEL_ONLY.match(raw)
    if m:
        return raw[m.end() :], None, m[1]
    return raw, None, None


def continued(acc: Acc, n: int, first: str) -> str:
    """A message and the prefix-less lines that continue it (a token piece with a newline)."""
    parts = [first]
    k = n + 1
    while k <= len(acc.lines) and acc.levels[k - 1] is None and len(parts) < 8:
        parts.append(acc.text(k))
        k += 1
    return "\n".join(parts)


# -- devices and buffers --------------------------------------------------------------------


@rule(r"(?:^|\s-\s+)(" + BACKENDS + r")\s*: (.+?)\s*(?:\((\d+) MiB, (\d+) MiB free\)|\(\.\.\.\))?\s*$")
def _device(acc: Acc, m: re.Match[str], n: int) -> None:
    if not any(d.name == m[1] for d in acc.devices):
        acc.devices.append(
            Device(
                name=m[1],
                description=m[2],
                total_mib=num(m[3]) if m[3] else None,
                free_mib=num(m[4]) if m[4] else None,
                line=n,
            )
        )


@rule(r"load_tensors:\s+(\S+) model buffer size =\s*([\d.]+) MiB")
def _model_buffer(acc: Acc, m: re.Match[str], n: int) -> None:
    acc.buffer(m[1], MODEL, num(m[2]), n)


@rule(r"graph: nodes = (\d+), splits = (\d+)|graph nodes\s*=\s*(\d+)|graph splits\s*=\s*(\d+)")
def _graph(acc: Acc, m: re.Match[str], n: int) -> None:
    if m[1]:
        acc.graph_nodes, acc.graph_splits = int(m[1]), int(m[2])
    elif m[3]:
        acc.graph_nodes = int(m[3])
    else:
        acc.graph_splits = int(m[4])


@rule(r"llama_context: (n_ctx|n_batch|n_ubatch|flash_attn)\s+= (\S+)")
def _ctx_param(acc: Acc, m: re.Match[str], n: int) -> None:
    acc.set_context(m[1], m[2])


@rule(r"initializing, n_slots = (\d+)")
def _slots(acc: Acc, m: re.Match[str], n: int) -> None:
    acc.set_context("n_slots", m[1])


# -- phases ---------------------------------------------------------------------------------

PHASE_RULES: tuple[Rule, ...] = (
    phase_rule(r"load_model: loading model|llama_model_loader: loaded meta data", LogPhase.LOADING_MODEL),
    phase_rule(r"common_init_\w*: fitting params", LogPhase.FITTING),
    phase_rule(r"load_tensors: loading model tensors", LogPhase.LOADING_TENSORS),
    phase_rule(r"llama_context: constructing llama_context", LogPhase.CREATING_CONTEXT),
    phase_rule(r"sched_reserve: reserving", LogPhase.ALLOCATING_COMPUTE),
    phase_rule(r"warming up the model", LogPhase.WARMUP),
    phase_rule(r"llama_server: model loaded|main: model loaded", LogPhase.READY),
)


@rule(r"listening on (https?://\S+)")
def _listening(acc: Acc, m: re.Match[str], n: int) -> None:
    acc.listening = m[1]
    acc.phase(LogPhase.READY, n)


@rule(r"couldn't bind HTTP server socket, hostname: (\S+), port: (\d+)")
def _bind(acc: Acc, m: re.Match[str], n: int) -> None:
    acc.fail(BIND_FAILED, f"{m[1]}:{m[2]}", n)


# -- slots: queueing and prefix-cache misses --------------------------------------------------


class _Slots:
    """Per-slot state the slot lines need; kept on the accumulator."""

    def __init__(self) -> None:
        self.cached: dict[int, int | None] = {}  # tokens the slot held after its last request
        self.debug: dict[int, list[tuple[int, str]]] = {}  # old:/new: lines of the current request
        self.all_busy = False  # every slot the current slot search looked at was processing
        self.restored = False  # the prompt cache swapped in another prompt: the slot's size is unknown
        self.common: dict[int, int] = {}  # the prefix the slot search found in common with the new prompt
        self.forced: set[int] = set()  # slots the engine made re-process the whole prompt (SWA, hybrid)


def _slots_state(acc: Acc) -> _Slots:
    assert isinstance(acc.era_state, _Slots)
    return acc.era_state


@rule(
    r"get_availabl\w*: id\s+(\d+) \| task -?\d+ \|\s+- (skipping, is_processing = 1|skipping, slot is empty|checking)"
)
def _slot_search(acc: Acc, m: re.Match[str], n: int) -> None:
    st = _slots_state(acc)
    slot = int(m[1])
    if slot == 0:
        st.all_busy = True
    if not m[2].startswith("skipping, is_processing"):
        st.all_busy = False  # this search found a usable slot
    elif slot == (acc.context.n_slots or 1) - 1 and st.all_busy:  # every slot busy: the request waits
        acc.start_queue_wait(n)


@rule(r"launch_slot_\w*: id\s+\d+ \| task -?\d+ \| processing task")
def _slot_launch(acc: Acc, m: re.Match[str], n: int) -> None:
    acc.slot_started(n)


@rule(r"id\s+(\d+) \| task -?\d+ \| stop processing: n_tokens = (\d+)")
def _slot_release(acc: Acc, m: re.Match[str], n: int) -> None:
    _slots_state(acc).cached[int(m[1])] = int(m[2])


@rule(r"found better prompt")
def _prompt_restored(acc: Acc, m: re.Match[str], n: int) -> None:
    _slots_state(acc).restored = True


@rule(r"get_availabl\w*: id\s+(\d+) \| task -?\d+ \|\s+- checking sim = [\d.]+ \((\d+)/\d+\)")
def _slot_similarity(acc: Acc, m: re.Match[str], n: int) -> None:
    _slots_state(acc).common[int(m[1])] = int(m[2])


@rule(r"id\s+(\d+) \| task -?\d+ \| forcing full prompt re-processing")
def _slot_forced(acc: Acc, m: re.Match[str], n: int) -> None:
    _slots_state(acc).forced.add(int(m[1]))
    acc.full_reprocessing.append(n)


@rule(
    r"id\s+(\d+) \| task -?\d+ \| created context checkpoint (\d+) of \d+ \(pos_min = -?\d+, pos_max = (-?\d+),"
    r" n_tokens = \d+, size = ([\d.]+) MiB\)"
)
def _checkpoint_created(acc: Acc, m: re.Match[str], n: int) -> None:
    acc.ckpt_created.append(Checkpoint(line=n, slot=int(m[1]), pos_max=int(m[3]), size_mib=num(m[4]), index=int(m[2])))


@rule(
    r"id\s+(\d+) \| task -?\d+ \| restored context checkpoint \(pos_min = -?\d+, pos_max = (-?\d+), n_tokens = \d+,"
    r" n_past = (\d+), size = ([\d.]+) MiB\)"
)
def _checkpoint_restored(acc: Acc, m: re.Match[str], n: int) -> None:
    acc.ckpt_restored.append(
        Checkpoint(line=n, slot=int(m[1]), pos_max=int(m[2]), size_mib=num(m[4]), n_past=int(m[3]))
    )


@rule(r"id\s+(\d+) \| task -?\d+ \| new prompt, ")
def _slot_new_prompt(acc: Acc, m: re.Match[str], n: int) -> None:
    _slots_state(acc).debug[int(m[1])] = []


@rule(r"id\s+(\d+) \| task -?\d+ \| ((?:old|new): .*)$")
def _slot_debug(acc: Acc, m: re.Match[str], n: int) -> None:
    _slots_state(acc).debug.setdefault(int(m[1]), []).append((n, continued(acc, n, m[2])))


@rule(r"id\s+(\d+) \| task -?\d+ \| cached n_tokens = (\d+), memory_seq_rm \[(\d+), end\)")
def _slot_cached(acc: Acc, m: re.Match[str], n: int) -> None:
    st = _slots_state(acc)
    slot, common = int(m[1]), int(m[2])
    # the slot's tokens before this request; read once: a prompt processed in several batches (as
    # around a context checkpoint) logs this line again for each, with the tokens done so far
    before = None if st.restored else st.cached.pop(slot, None)
    st.restored = False
    matched, forced = st.common.pop(slot, 0), slot in st.forced
    st.forced.discard(slot)
    if common == 0 and matched > 1 and not forced:  # the request asked for no cache (cache_prompt false)
        acc.uncached.append(n)
        return
    if before is None or before - common <= MISS_MIN_DISCARDED:
        return
    debug = st.debug.get(slot, [])
    old = next((t[5:] for _, t in debug if t.startswith("old: ")), None)
    new = next((t[5:] for _, t in debug if t.startswith("new: ")), None)
    lines = tuple(k for k, t in debug if t.startswith(("old: ", "new: ")))
    acc.miss(
        CacheMiss(
            line=n,
            slot=slot,
            cached_tokens=before,
            common_tokens=common,
            reevaluated_tokens=None,
            cache_text=old,
            prompt_text=new,
            lines=(*lines, n),
        )
    )


SLOT_RULES: tuple[Rule, ...] = (
    _slot_search,
    _slot_launch,
    _slot_release,
    _prompt_restored,
    _slot_similarity,
    _slot_forced,
    _slot_new_prompt,
    _slot_debug,
    _slot_cached,
    _checkpoint_created,
    _checkpoint_restored,
)

RULES: tuple[Rule, ...] = (
    *SHARED_RULES,
    _device,
    _model_buffer,
    _graph,
    _ctx_param,
    _slots,
    *PHASE_RULES,
    _listening,
    _bind,
    *SLOT_RULES,
)

# the rules a progress display needs: which phase the new lines reach
PHASE_ONLY_RULES: tuple[Rule, ...] = (*PHASE_RULES, _listening, *PHASE_SHARED_RULES)


def texts(raw_lines: Sequence[str]) -> list[str]:
    return [split_prefix(x)[0] for x in raw_lines]


def parse(raw_lines: Sequence[str]) -> ServerLog:
    texts, times, levels = [], [], []
    for raw in raw_lines:
        text, t, level = split_prefix(raw)
        texts.append(text)
        times.append(t)
        levels.append(level)
    acc = Acc(LogEra.MAINLINE, texts, times, levels)
    acc.era_state = _Slots()
    run_grammar(acc, RULES)
    collect_tables(acc)
    if any(lv is not None for lv in levels):
        for n, (text, level) in enumerate(zip(texts, levels, strict=True), 1):
            if level == "E":
                acc.errors.append(Evidence(n, text))
            elif level == "W":
                acc.warnings.append(Evidence(n, text))
    else:  # an excerpt without prefixes (copied from a report): judge by the words
        classify_by_words(acc)
    return acc.finish()
