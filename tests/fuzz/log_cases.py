"""Real engine logs to mutate (tests/fixtures/logs and the seed corpus), and the Hypothesis
strategies that mutate them: lines removed, cut, duplicated, numbers replaced by what a number
field must not trip on, random and grammar-shaped lines inserted."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "logs"
CORPUS = Path(__file__).parent / "corpus" / "logs"


@cache
def server_logs() -> dict[str, str]:
    """Server logs (both eras) by file name: the fixtures and the corpus's."""
    paths = [p for p in FIXTURES.glob("*.log") if p.name.endswith((".mainline.log", ".legacy.log"))]
    paths += [p for p in CORPUS.glob("*.log") if "worker" not in p.name]
    return {p.name: p.read_text(errors="replace") for p in sorted(paths)}


@cache
def worker_logs() -> dict[str, str]:
    paths = [p for p in FIXTURES.glob("*.log") if not p.name.endswith((".mainline.log", ".legacy.log"))]
    paths += [p for p in CORPUS.glob("*worker*.log")]
    return {p.name: p.read_text(errors="replace") for p in sorted(paths)}


# what a number in a log line must not trip on
NUMBERS = (
    "",
    ".",
    "1.2.3",
    "-1",
    "0",
    "nan",
    "inf",
    "1e309",
    "99999999999999999999999",
    "٣",
    "1" * 5000,
    "0x1f",
    "1_000",
    " ",
)
# grammar-shaped lines with a hole where the number or name goes
TEMPLATES = (
    "llama_context: n_ctx = {}",
    "llama_context: n_ubatch      = {}",
    "initializing, n_slots = {}",
    "load_tensors:   CPU_Mapped model buffer size = {} MiB",
    "llm_load_tensors:  CUDA_Host buffer size = {} MiB",
    "llama_kv_cache:        CPU KV buffer size = {} MiB",
    "sched_reserve:      CUDA0 compute buffer size = {} MiB",
    "graph: nodes = {}, splits = {}",
    "llama_init_from_model: graph splits = {}",
    "KV self size  = {} MiB",
    "prompt eval time =     {} ms /    {} tokens",
    "       eval time =  {} ms / {} runs",
    "total time = {} ms / {} tokens",
    "slot launch_slot_: id  {} | task {} | processing task",
    "slot get_availabl: id  {} | task 0 |  - checking sim = 0.5 ({}/4)",
    "slot update_slots: id  {} | task 1 | cached n_tokens = {}, memory_seq_rm [0, end)",
    "slot release: id  {} | task 2 | stop processing: n_tokens = {}, truncated = 0",
    "Allocating {} GiB of pinned host memory",
    "done allocating {} GiB in {} ms",
    "======== Cache: cache_size = {}, n_past0 =  {}, n_past1 = {}, n_past_prompt1 = 3,  n_past2 = {}",
    "cached sequence diverges at {}/{}",
    "ggml_backend_cuda_buffer_type_alloc_buffer: allocating {} MiB on device {}: cudaMalloc failed",
    "failed to allocate CUDA0 buffer of size {}",
    "Device {}: NVIDIA X, compute capability 8.9, VMM: yes, VRAM: {} MiB",
    "  - CUDA{} : NVIDIA ({} MiB, {} MiB free)",
    "couldn't bind HTTP server socket, hostname: 127.0.0.1, port: {}",
    "| memory breakdown [MiB] | total   free    self   model   context   compute    unaccounted |",
    "|   - CUDA0 (RTX)        | {} = {} + ( {} = {} + {} + {}) + {} |",
    "|   - Host               | {} = {} + {} + {} |",
    "main: server is listening on http://127.0.0.1:{} - starting the main loop",
    'INFO [                    main] HTTP server listening | tid="1" timestamp={} hostname="127.0.0.1" port="{}"',
    "llama_new_context_with_model: n_batch    = {}",
    "=> changing split mode to '{}'",
    "Split mode '{}' is not supported for this model",
    "Starting RPC server v{}",
    "  CUDA0: NVIDIA ({} MiB, {} MiB free)",
    "  CPU:  {} MiB total, {} MiB free",
    "cache : {}",
    "prompt: {}",
    "new: {}",
    "old: {}",
)
PREFIXES = (
    "",
    "0.00.031.526 I ",
    "0.01.002.000 W ",
    "0.00.000.001 E ",
    "E ",
    "W ",
    "INFO [x] ",
    "ERR [x] ",
    "\x1b[32m",
    "999999999999999999.00.000.000 I ",
)


def _template_line() -> st.SearchStrategy[str]:
    def fill(t: str, p: str, vals: list[str]) -> str:
        return p + t.format(*(vals + ["0"] * t.count("{}"))[: t.count("{}")])

    return st.builds(
        fill,
        st.sampled_from(TEMPLATES),
        st.sampled_from(PREFIXES),
        st.lists(st.one_of(st.sampled_from(NUMBERS), st.text(max_size=6)), max_size=7),
    )


_NUMBER = re.compile(r"\d+(?:\.\d+)?")


@dataclass(frozen=True)
class Log:
    """A mutated log: its base and the edits, in order; shown by those, not by its text."""

    base: str
    ops: tuple[tuple[Any, ...], ...]
    lines: tuple[str, ...] = field(repr=False)

    @property
    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


@st.composite
def mutated_logs(draw: st.DrawFn, logs: dict[str, str]) -> Log:
    name = draw(st.sampled_from(sorted(logs)))
    lines = logs[name].splitlines()
    ops: list[tuple[Any, ...]] = []
    for _ in range(draw(st.integers(1, 6))):
        op = draw(
            st.sampled_from(
                ("number", "number", "cut", "drop", "dup", "insert", "template", "template", "chars", "truncate")
            )
        )
        if not lines and op not in ("insert", "template"):
            continue
        i = draw(st.integers(0, max(0, len(lines) - 1)))
        if op == "number":
            nums = list(_NUMBER.finditer(lines[i]))
            if nums:
                m = draw(st.sampled_from(nums))
                lines[i] = lines[i][: m.start()] + draw(st.sampled_from(NUMBERS)) + lines[i][m.end() :]
        elif op == "cut":
            lines[i] = lines[i][: draw(st.integers(0, len(lines[i])))]
        elif op == "drop":
            del lines[i : i + draw(st.integers(1, 20))]
        elif op == "dup":
            lines[i:i] = lines[i : i + draw(st.integers(1, 5))]
        elif op == "insert":
            lines.insert(i, draw(st.text(max_size=80)))
        elif op == "template":
            lines.insert(i, draw(_template_line()))
        elif op == "chars":
            k = draw(st.integers(0, len(lines[i])))
            lines[i] = lines[i][:k] + draw(st.text(max_size=4)) + lines[i][k:]
        elif op == "truncate":
            del lines[i:]
        ops.append((op, i))
    return Log(name, tuple(ops), tuple(lines))


@st.composite
def removed_lines(draw: st.DrawFn, logs: dict[str, str]) -> tuple[str, tuple[int, ...]]:
    """A real log and the (0-based) lines to remove from it."""
    name = draw(st.sampled_from(sorted(logs)))
    n = len(logs[name].splitlines())
    drop = draw(st.lists(st.integers(0, max(0, n - 1)), max_size=max(1, n // 2), unique=True))
    return name, tuple(sorted(drop))
