"""The mainline grammar on logs captured from the real llama-server (build 11434, tests/fixtures/logs/
capture.py) and on the excerpts of reference report 004."""

from __future__ import annotations

from pathlib import Path

import pytest

from moetune.engine.logs import (
    ServerLog,
    detect_era,
    parse_log,
    phases_in,
    split_lines,
)
from moetune.engine.logs.types import (
    ABORTED,
    ALLOC_FAILED,
    BAD_ARGUMENT,
    BIND_FAILED,
    COMPUTE,
    MODEL_LOAD_FAILED,
    MODEL_OPEN_FAILED,
    RPC_CONNECT_FAILED,
    RPC_CRASHED,
)
from moetune.kinds import LogEra

FIX = Path(__file__).parents[1] / "fixtures" / "logs"
LOAD_PHASES = [
    "loading model",
    "fitting to memory",
    "loading model",
    "loading tensors",
    "creating context",
    "allocating compute buffers",
    "warm-up",
    "ready",
]


def log(name: str) -> ServerLog:
    return parse_log((FIX / name).read_text(errors="replace"))  # random models write random bytes


def test_served_request_every_field() -> None:
    g = log("real_serve.mainline.log")
    assert g.era == LogEra.MAINLINE
    assert [p.phase for p in g.phases] == LOAD_PHASES
    assert all(p.t_s is not None for p in g.phases)
    assert g.phases[-1].t_s == pytest.approx(g.times_s[g.phases[-1].line - 1])
    (cpu,) = g.devices
    assert (cpu.name, cpu.total_mib, cpu.free_mib) == ("CPU", 24105, 24105)
    b = g.device_buffers()
    assert b["CPU_Mapped"].model_mib == pytest.approx(4.02)
    assert (b["CPU"].kv_mib, b["CPU"].compute_mib, b["CPU"].output_mib) == pytest.approx((0.5, 4.02, 0.0))
    assert (g.graph_nodes, g.graph_splits) == (111, 1)
    assert (g.context.n_ctx, g.context.n_batch, g.context.n_ubatch, g.context.flash_attn, g.context.n_slots) == (
        512,
        512,
        512,
        "auto",
        1,
    )
    (t,) = g.timings
    assert (t.slot, t.task, t.prompt_tokens, t.eval_tokens, t.total_tokens) == (0, 0, 49, 16, 65)
    assert t.total_ms == pytest.approx(t.prompt_ms + (t.eval_ms or 0), abs=0.02)
    assert g.listening is not None and g.listening.startswith("http://127.0.0.1:")
    projected, final = g.memory_breakdowns
    assert projected.projected and not final.projected
    assert g.memory_breakdown is final
    host = final.row("Host")
    assert host is not None and (host.self_mib, host.model_mib, host.compute_mib, host.total_mib) == (8, 4, 4, None)
    assert [w.text for w in g.warnings] == [g.lines[w.line - 1] for w in g.warnings]
    assert any("no API key" in w.text for w in g.warnings)
    assert g.errors == () and g.failures == () and g.alloc_failures == ()


def test_rpc_device_buffers_and_breakdown() -> None:
    g = log("real_rpc_client.mainline.log")
    assert [d.name for d in g.devices] == ["CPU", "RPC0"]
    b = g.device_buffers()
    key = next(k for k in b if k.startswith("RPC0["))
    endpoint = key[5:-1]
    rpc_dev = g.device(key)
    assert rpc_dev is not None and (rpc_dev.description, rpc_dev.free_mib) == (endpoint, 24105)
    rpc = b[key]
    assert (rpc.model_mib, rpc.kv_mib, rpc.compute_mib) == pytest.approx((3.9, 0.5, 3.51))
    assert b["CPU"].compute_mib == pytest.approx(2.52)
    assert g.graph_splits == 2
    row = g.memory_breakdown.row("RPC0") if g.memory_breakdown else None
    assert row is not None
    assert (
        row.description,
        row.total_mib,
        row.free_mib,
        row.self_mib,
        row.model_mib,
        row.context_mib,
        row.compute_mib,
        row.unaccounted_mib,
    ) == (endpoint, 24105, 24105, 7, 3, 0, 3, -7)


def test_hybrid_model_rs_and_output_buffers() -> None:
    g = log("real_hybrid_rpc_client.mainline.log")
    b = g.device_buffers()
    rpc = next(v for k, v in b.items() if k.startswith("RPC0["))
    assert (rpc.model_mib, rpc.kv_mib, rpc.rs_mib, rpc.compute_mib) == pytest.approx((21.70, 0.50, 0.54, 5.52))
    assert b["CPU"].output_mib == pytest.approx(0.24)
    assert b["CPU_Mapped"].model_mib == pytest.approx(40.13)
    assert (g.graph_nodes, g.graph_splits, g.context.n_slots) == (320, 6, 2)


def test_default_verbosity_has_phases_and_timings_only() -> None:
    g = log("real_serve_default_verbosity.mainline.log")
    assert [p.phase for p in g.phases] == ["loading model", "ready"]
    assert g.buffers == () and g.devices == ()
    assert [t.eval_tokens for t in g.timings] == [16]


@pytest.mark.parametrize(
    ("name", "device"), [("real_oom_compute_cpu.mainline.log", "CPU"), ("real_oom_compute_rpc.mainline.log", "RPC0[")]
)
def test_compute_buffer_oom(name: str, device: str) -> None:
    g = log(name)
    (f,) = g.alloc_failures
    assert f.device.startswith(device) and f.what == COMPUTE
    assert f.size_mib is not None and f.size_mib > 80000
    assert ALLOC_FAILED in [x.kind for x in g.failures]
    assert g.phase == "allocating compute buffers"
    assert g.context.n_ubatch == 65536
    assert any("failed to allocate compute" in e.text for e in g.errors)


@pytest.mark.parametrize(
    ("name", "kind", "subject"),
    [
        ("real_missing_model.mainline.log", MODEL_OPEN_FAILED, "missing.gguf"),
        ("real_port_busy.mainline.log", BIND_FAILED, "127.0.0.1:"),
        ("real_bad_argument.mainline.log", BAD_ARGUMENT, "--no-such-flag"),
        ("real_rpc_unreachable.mainline.log", RPC_CONNECT_FAILED, "127.0.0.1:"),
        ("ref004_rdma_shutdown_crash.mainline.log", RPC_CRASHED, None),
    ],
)
def test_failures(name: str, kind: str, subject: str | None) -> None:
    g = log(name)
    f = next(x for x in g.failures if x.kind == kind)
    if subject is not None:
        assert f.subject is not None and subject in f.subject
    assert g.evidence(f.line).text


def test_missing_model_and_abort_details() -> None:
    assert MODEL_LOAD_FAILED in [f.kind for f in log("real_missing_model.mainline.log").failures]
    g = log("real_rpc_unreachable.mainline.log")
    assert ABORTED in [f.kind for f in g.failures]


def test_queue_behind_one_slot() -> None:
    g = log("real_queue_parallel1.mainline.log")
    assert g.context.n_slots == 1
    assert len(g.slot_waits) == 2
    for w in g.slot_waits:
        assert "skipping, is_processing = 1" in g.evidence(w.line).text
        assert w.started_line is not None and "processing task" in g.evidence(w.started_line).text
        assert w.waited_s is not None and w.waited_s > 0
    assert len(g.timings) == 3


def test_think_mismatch_with_slot_debugging() -> None:
    g = log("real_think_mismatch.mainline.log")
    (m,) = g.cache_misses
    released = [int(x.rsplit("n_tokens = ", 1)[1].split(",")[0]) for x in g.lines if "stop processing" in x]
    asked = [int(x.rsplit("task.n_tokens = ", 1)[1]) for x in g.lines if "new prompt," in x]
    assert m.cached_tokens == released[0]  # what the first turn left in the slot
    assert m.common_tokens is not None and m.discarded_tokens is not None and m.discarded_tokens > 20
    assert m.reevaluated_tokens == asked[1] - m.common_tokens
    assert f"cached n_tokens = {m.common_tokens}" in g.evidence(m.line).text
    assert m.cache_text is not None and "think>" in m.cache_text  # the <think></think> the client dropped
    assert m.prompt_text is not None and "think" not in m.prompt_text
    assert len(m.lines) == 4  # old:, new:, the cached line, the prompt eval line


def test_requests_without_the_prompt_cache_are_not_misses() -> None:
    # bench sends cache_prompt false: the engine finds 335 common tokens and reuses none of them
    g = log("real_bench_no_cache.mainline.log")
    assert [x for x in g.uncached_requests] == [n for n, t in enumerate(g.lines, 1) if "cached n_tokens = 0" in t][
        1:
    ]  # the first found an empty slot
    assert len(g.uncached_requests) == 2
    (m,) = g.cache_misses  # the last client had the cache on and changed its prompt early
    assert m.common_tokens == 13 and m.cached_tokens == 374


def test_a_forced_reprocessing_stays_a_miss() -> None:
    # a hybrid/SWA model that cannot reuse part of its cache re-processes everything: a miss, not a choice
    text = "\n".join(
        [
            "0.00.000.001 I srv          init: initializing, n_slots = 1",
            "0.00.000.100 I slot      release: id  0 | task 0 | stop processing: n_tokens = 300, truncated = 0",
            "0.00.000.200 I slot get_availabl: id  0 | task -1 |  - checking sim = 0.900 (250/278) > 0.100",
            "0.00.000.300 W slot update_slots: id  0 | task 9 | forcing full prompt re-processing due to lack of cache "
            "data (likely due to SWA or hybrid/recurrent memory, see x)",
            "0.00.000.400 I slot   operator(): id  0 | task 9 | cached n_tokens = 0, memory_seq_rm [0, end)",
        ]
    )
    g = parse_log(text)
    assert len(g.cache_misses) == 1 and g.uncached_requests == ()


def test_report_excerpt_without_prefixes() -> None:
    g = log("ref004_glm52_rpc_client.mainline.log")
    assert g.era == LogEra.MAINLINE
    assert [(d.name, d.description, d.total_mib) for d in g.devices] == [
        ("CUDA0", "NVIDIA GB10", None),
        ("RPC0", "<NODE_B_CX7_IP>:50052", None),
    ]
    assert [w.line for w in g.warnings] == [3, 4]  # no level prefix: judged by their words


def test_era_detection_and_colours() -> None:
    assert detect_era(split_lines((FIX / "ref000_glm51_1gpu_cpu_moe.legacy.log").read_text())) == LogEra.LEGACY
    assert detect_era(split_lines((FIX / "real_serve.mainline.log").read_text())) == LogEra.MAINLINE
    coloured = (
        "\x1b[34m0.00.031.526\x1b[0m \x1b[32mI \x1b[0mload_tensors:   CPU_Mapped model buffer size =  1548.03 MiB\r\n"
    )
    g = parse_log(coloured)
    assert g.era == LogEra.MAINLINE and g.buffers[0].size_mib == pytest.approx(1548.03)
    assert g.times_s[0] == pytest.approx(0.031526)


def test_forced_era() -> None:
    g = parse_log((FIX / "ref000_glm51_oom_n_cpu_moe_58.legacy.log").read_text(), era=LogEra.MAINLINE)
    assert g.era == LogEra.MAINLINE and g.alloc_failures[0].device == "CUDA0"
    with pytest.raises(ValueError):
        parse_log("", era="future")


def test_phases_in_chunks() -> None:
    lines = split_lines((FIX / "real_serve.mainline.log").read_text())
    k = next(i for i, x in enumerate(lines) if "loading model tensors" in x)
    assert phases_in(lines[:k])[-1] == "loading model"
    assert phases_in(lines[k : k + 1], LogEra.MAINLINE) == ["loading tensors"]
    assert phases_in(lines[k + 1 :], LogEra.MAINLINE)[-1] == "ready"
    legacy = split_lines((FIX / "ref000_glm51_1gpu_cpu_moe.legacy.log").read_text())
    assert phases_in(legacy) == [
        "loading tensors",
        "creating context",
        "allocating compute buffers",
        "allocating pinned memory",
    ]
