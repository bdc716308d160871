"""The legacy-era grammar on the log excerpts of reference report 000 (ik_llama.cpp, GLM-5.1 on two
RTX PRO 6000) and on synthetic ik_llama.cpp server logs."""

from __future__ import annotations

from pathlib import Path

import pytest

from moetune.engine.logs import ServerLog, parse_log
from moetune.engine.logs.types import ALLOC_FAILED, COMPUTE
from moetune.kinds import LogEra

FIX = Path(__file__).parents[1] / "fixtures" / "logs"


def log(name: str) -> ServerLog:
    return parse_log((FIX / name).read_text())


def test_two_gpu_load_every_field() -> None:
    g = log("ref000_glm51_2gpu_exps_cpu.legacy.log")
    assert g.era == LogEra.LEGACY
    assert [(d.name, d.total_mib) for d in g.devices] == [("CUDA0", 97247), ("CUDA1", 97247)]
    assert "RTX PRO 6000" in g.devices[0].description
    b = g.device_buffers()
    assert b["CUDA_Host"].model_mib == pytest.approx(307110.47)
    assert b["CUDA0"].model_mib == pytest.approx(7378.05)
    assert b["CUDA1"].model_mib == pytest.approx(7120.90)
    assert (b["CUDA0"].kv_mib, b["CUDA1"].kv_mib) == pytest.approx((784.15, 707.64))
    assert g.kv_self_mib == pytest.approx(1491.75)
    assert (b["CUDA0"].compute_mib, b["CUDA1"].compute_mib, b["CUDA_Host"].compute_mib) == pytest.approx(
        (5418.03, 5032.00, 704.09)
    )
    assert b["CUDA0"].total_mib == pytest.approx(7378.05 + 784.15 + 5418.03)
    assert (g.graph_nodes, g.graph_splits) == (10250, 190)
    assert (g.context.n_ctx, g.context.n_batch, g.context.n_ubatch, g.context.flash_attn) == (32768, 8192, 8192, "1")
    assert len(g.pinned) == 1
    assert g.pinned[0].size_mib == pytest.approx(299.91 * 1024)
    assert g.pinned[0].took_ms == pytest.approx(51786.7)
    assert g.pinned_host_mib() == pytest.approx(299.91 * 1024)
    assert [(c.requested, c.actual) for c in g.split_mode_changes] == [("graph", "layer")]
    assert g.evidence(g.split_mode_changes[0].line).text == "Split mode 'graph' is not supported for this model"
    assert any("changing split mode" in w.text for w in g.warnings)
    assert g.errors == () and g.failures == ()


def test_two_gpu_timings() -> None:
    t = log("ref000_glm51_2gpu_exps_cpu.legacy.log").timings
    assert [(x.prompt_tokens, x.eval_tokens, x.total_tokens) for x in t] == [
        (30, 61, 91),
        (1, 355, 356),
        (43, 2048, 2091),
        (43, 4096, 4139),
    ]
    first = t[0]
    assert (first.prompt_ms, first.eval_ms, first.total_ms) == pytest.approx((1323.95, 3238.59, 4562.54))
    assert first.eval_tokens_per_s == pytest.approx(18.84, abs=0.01)
    assert first.prompt_tokens_per_s == pytest.approx(22.66, abs=0.01)
    assert first.eval_ms_per_token == pytest.approx(53.09, abs=0.01)


def test_one_gpu_and_phases() -> None:
    g = log("ref000_glm51_1gpu_cpu_moe.legacy.log")
    b = g.device_buffers()
    assert b["CUDA0"].model_mib == pytest.approx(14498.95)
    assert b["CUDA0"].kv_mib == pytest.approx(1491.79)
    assert g.graph_splits == 152
    assert g.pinned[0].took_ms == pytest.approx(46485.7)
    assert [p.phase for p in g.phases] == [
        "loading tensors",
        "creating context",
        "allocating compute buffers",
        "allocating pinned memory",
    ]
    assert [x.eval_tokens for x in g.timings] == [63, 2048, 4096]


@pytest.mark.parametrize(
    ("name", "pinned_mib"),
    [
        ("ref000_glm51_n_cpu_moe_64.legacy.log", 244.02 * 1024),
        ("ref000_glm51_head_tail.legacy.log", 218045.0),  # written in MiB in this report
    ],
)
def test_pinned_sizes_in_both_units(name: str, pinned_mib: float) -> None:
    g = log(name)
    assert g.pinned_host_mib() == pytest.approx(pinned_mib)
    assert g.pinned[0].took_ms is None
    assert len(g.timings) == 3


def test_compute_buffer_oom() -> None:
    g = log("ref000_glm51_oom_n_cpu_moe_58.legacy.log")
    assert g.era == LogEra.LEGACY
    (f,) = g.alloc_failures  # cudaMalloc's line and ggml-alloc's line are one failure
    assert (f.device, f.what) == ("CUDA0", COMPUTE)
    assert f.size_mib == pytest.approx(5418.03)
    assert [x.kind for x in g.failures] == [ALLOC_FAILED]
    assert len(g.errors) == 3


def test_ik_prefix_cache_misses() -> None:
    g = log("synthetic_ik_prefix_cache_misses.legacy.log")
    assert g.era == LogEra.LEGACY
    assert len(g.cache_misses) == 26
    m = g.cache_misses[0]
    assert (m.slot, m.cached_tokens, m.common_tokens, m.discarded_tokens) == (0, 2210, 1898, 312)
    assert m.reevaluated_tokens == 452  # the next prompt eval line
    assert m.cache_text is not None and "<think>The contract" in m.cache_text
    assert m.prompt_text is not None and m.prompt_text.endswith("<|user|>")
    assert "<think>" not in m.prompt_text
    assert g.evidence(m.line).text == "Common part does not match fully"
    assert sum(1 for x in g.cache_misses if "<think>" in (x.cache_text or "")) == 24
    assert g.context.n_slots == 1
    assert g.listening == "http://0.0.0.0:8000"
    assert g.phase == "ready"
    assert len(g.timings) == 26


def test_ik_slot_queue_with_unix_timestamps() -> None:
    g = log("synthetic_ik_slot_queue.legacy.log")
    assert [(w.waited_s, g.evidence(w.started_line or 0).text.split("] ")[1][:23]) for w in g.slot_waits] == [
        (3.0, "slot is processing task"),
        (7.0, "slot is processing task"),
    ]
    assert [t.task for t in g.timings] == [1, 2, 3]
