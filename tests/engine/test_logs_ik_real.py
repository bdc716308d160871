"""The ik_llama.cpp log era, from the real server: logs captured from the ik build moetune makes
(tests/fixtures/logs/capture_ik.py) parsed, diagnosed and examined by `doctor`."""

from __future__ import annotations

from pathlib import Path

import pytest

from moetune.engine.logs import parse_log, parse_worker_log
from moetune.engine.logs.types import TEMPLATE_UNSUPPORTED
from moetune.kinds import LogEra, LogPhase
from moetune.run import diagnose
from tests.run.test_doctor import codes, findings

LOGS = Path(__file__).parent.parent / "fixtures" / "logs"


def log(name: str):  # type: ignore[no-untyped-def]
    return parse_log((LOGS / name).read_text(errors="replace"))


def test_a_served_session_over_rpc() -> None:
    s = log("real_ik_rpc_client.legacy.log")
    assert s.era == LogEra.LEGACY and s.phase == LogPhase.READY and not s.failed
    bufs = s.device_buffers()
    rpc = [d for d in bufs if d.startswith("RPC0[")]
    assert len(rpc) == 1 and bufs[rpc[0]].model_mib > 0 and bufs["CPU"].model_mib > 0  # -ot blk.1 experts=CPU
    assert bufs[rpc[0]].kv_mib > 0 and bufs[rpc[0]].compute_mib > 0
    assert len(s.timings) == 1 and s.timings[0].eval_tokens > 0
    w = parse_worker_log((LOGS / "real_ik_rpc_worker.log").read_text())
    assert w.endpoint is not None and w.endpoint.startswith("127.0.0.1:")


def test_slots_and_the_prompt_cache() -> None:
    """Six requests on one slot: each one a slot task with its timings; the ones whose prompt
    differs from the cached one early are misses, the one that only grows past it reuses it."""
    s = log("real_ik_slots.legacy.log")
    assert len(s.timings) == 6
    misses = s.cache_misses
    assert len(misses) == 5 and all(m.cached_tokens and m.common_tokens is not None for m in misses)
    assert [m.common_tokens for m in misses][-1] == 13  # "Today is day 2." ahead of the stable text
    fs = findings("real_ik_slots.legacy.log")
    (cache,) = [f for f in fs if f.code == "prefix_cache_miss"]
    assert "<think>" not in cache.title  # they diverge in the user's text, before the template's <think>


@pytest.mark.parametrize(
    ("name", "code", "says", "hint"),
    [
        ("real_ik_bad_fa.legacy.log", diagnose.BAD_ARGS, "-fa: invalid value", "takes a value"),
        ("real_ik_missing_model.legacy.log", diagnose.MODEL_MISSING, "missing.gguf", "-m path"),
        ("real_ik_port_busy.legacy.log", diagnose.PORT_IN_USE, "port is in use", "moetune ps"),
        ("real_ik_sm_graph_one_device.legacy.log", diagnose.SPLIT_MODE_DEVICES, "two or more devices", "-sm graph"),
    ],
)
def test_failures_are_diagnosed(name: str, code: str, says: str, hint: str) -> None:
    s = log(name)
    assert s.failed
    d = diagnose.server_exit("ik", s, 1, loading=True)
    assert d.cause == code and says in d.message and hint in d.hint, d
    assert codes(findings(name)) == ["load_failed"]


def test_a_server_without_jinja_answers_500() -> None:
    s = log("real_ik_no_jinja.legacy.log")
    assert not s.failed and s.phase == LogPhase.READY  # it serves, but chat requests fail
    assert [f.kind for f in s.failures] == [TEMPLATE_UNSUPPORTED]
    assert codes(findings("real_ik_no_jinja.legacy.log")) == ["template_unsupported"]


def test_split_mode_graph_over_rpc_aborts_at_load() -> None:
    s = log("real_ik_sm_graph.legacy.log")
    assert s.failed and s.phase != LogPhase.READY
    d = diagnose.server_exit("ik", s, 134, loading=True)
    assert d.cause == diagnose.EXITED_DURING_LOAD and "GGML_ASSERT" in " ".join(e.text for e in d.evidence)
