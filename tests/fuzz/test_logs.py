"""Fuzzing the log grammars (mainline, legacy, RPC worker): random, mutated and truncated logs parse
without an exception, every finding points at a line of the log, and the relations a reader relies
on hold: a log with lines removed never gains a buffer, a growing log's phases only grow, and line
endings or colours change nothing.

The target is what a launch does with a log it reads: parse it (era detected, or forced) and turn
it into the diagnosis the user sees.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from moetune.engine.logs import detect_era, is_worker_log, parse_log, parse_worker_log, phases_in, split_lines
from moetune.engine.logs.types import ServerLog, WorkerLog
from moetune.kinds import LogEra
from moetune.run import diagnose
from tests.fuzz.budget import fuzz
from tests.fuzz.guard import bounded
from tests.fuzz.log_cases import Log, mutated_logs, removed_lines, server_logs, worker_logs

pytestmark = pytest.mark.fuzz


def _lines_point_into(log: ServerLog | WorkerLog) -> None:
    n = len(log.lines)
    found = [*log.errors, *log.failures]
    if isinstance(log, ServerLog):
        found += [
            *log.buffers,
            *log.devices,
            *log.timings,
            *log.pinned,
            *log.alloc_failures,
            *log.phases,
            *log.memory_breakdowns,
            *log.split_mode_changes,
            *log.warnings,
        ]
        for m in log.cache_misses:
            assert all(1 <= k <= n for k in m.lines), m
        for w in log.slot_waits:
            assert 1 <= w.line <= n and (w.started_line is None or 1 <= w.started_line <= n), w
        assert all(1 <= k <= n for k in log.uncached_requests)
    else:
        found += [*log.devices, *log.rdma_probed, *log.rdma_activated, *log.rdma_errors]
    for item in found:
        assert 1 <= item.line <= n, item
        assert log.evidence(item.line).text == log.lines[item.line - 1]


def read_server_log(text: str, era: str | None = None) -> ServerLog:
    """Parse, derive what launch and doctor derive, and diagnose an exit: no exception allowed."""
    with bounded():
        log = parse_log(text, era)
        _lines_point_into(log)
        log.device_buffers()
        log.pinned_host_mib()
        _ = log.phase, log.failed, log.memory_breakdown
        for t in log.timings:
            _ = t.prompt_tokens_per_s, t.eval_tokens_per_s, t.eval_ms_per_token
        for m in log.cache_misses:
            _ = m.discarded_tokens
        layers = [diagnose.LayerExperts(i, "CUDA0", 100.0) for i in range(4)]
        for loading in (True, False):
            d = diagnose.server_exit("server", log, 1, loading=loading, layers=layers, uniform=(100.0, 4), n_ubatch=512)
            assert d.message and "\n" not in d.message.split(": ", 1)[0]
        diagnose.not_healthy("server", "http://127.0.0.1:1", 1.0, log)
        phases_in(split_lines(text)[-50:], log.era)
    return log


@given(log=mutated_logs(server_logs()), era=st.sampled_from([None, LogEra.MAINLINE, LogEra.LEGACY]))
@fuzz(800)
def test_a_mutated_server_log_parses_and_diagnoses(log: Log, era: str | None) -> None:
    read_server_log(log.text, era)


@given(log=mutated_logs(worker_logs()))
@fuzz(300)
def test_a_mutated_worker_log_parses_and_diagnoses(log: Log) -> None:
    with bounded():
        wlog = parse_worker_log(log.text)
        _lines_point_into(wlog)
        _ = wlog.rdma_in_use
        is_worker_log(list(log.lines))
        diagnose.worker_exit("rpc0", wlog, 1, "127.0.0.1:50052")
        diagnose.worker_exit("rpc0", wlog, None, "127.0.0.1:50052", listening=True)


@example(text="\r")
@example(text="\x1b[")
@example(text="\u2028\x85\x0c")
@given(text=st.text(max_size=400))
@fuzz(300)
def test_any_text_parses_as_every_kind_of_log(text: str) -> None:
    for era in (None, LogEra.MAINLINE, LogEra.LEGACY):
        read_server_log(text, era)
    with bounded():
        _lines_point_into(parse_worker_log(text))


def _buffers(log: ServerLog) -> Counter[tuple[str, str, float]]:
    return Counter((b.device, b.kind, b.size_mib) for b in log.buffers)


@given(case=removed_lines(server_logs()))
@fuzz(300)
def test_a_log_with_lines_removed_never_gains_a_buffer(case: tuple[str, tuple[int, ...]]) -> None:
    name, drop = case
    lines = server_logs()[name].splitlines()
    kept = "\n".join(x for i, x in enumerate(lines) if i not in set(drop))
    full = parse_log(server_logs()[name])
    part = parse_log(kept, full.era)
    assert not _buffers(part) - _buffers(full), "buffers the whole log does not have"
    assert set(part.device_buffers()) <= set(full.device_buffers())
    # read without knowing its era (what a launch does when a server dies early)
    assert set(parse_log(kept).device_buffers()) <= set(full.device_buffers())


@given(
    case=st.sampled_from(sorted(server_logs())).flatmap(
        lambda n: st.tuples(st.just(n), st.integers(0, len(server_logs()[n].splitlines())))
    )
)
@fuzz(200)
def test_a_growing_log_only_gains_phases(case: tuple[str, int]) -> None:
    name, k = case
    lines = server_logs()[name].splitlines()
    full = parse_log(server_logs()[name])
    part = parse_log("\n".join(lines[:k]), full.era)
    assert full.phases[: len(part.phases)] == part.phases
    assert phases_in(lines[:k], full.era) == [p.phase for p in part.phases]


@given(name=st.sampled_from(sorted(server_logs())), colour=st.booleans())
@fuzz(60)
def test_line_endings_and_colours_change_nothing(name: str, colour: bool) -> None:
    text = server_logs()[name]
    lines = text.splitlines()
    if colour:
        lines = [f"\x1b[3{i % 8}m{x}\x1b[0m" for i, x in enumerate(lines)]
    assert parse_log("\r\n".join(lines) + "\r\n") == parse_log(text)
    assert detect_era(split_lines(text)) == parse_log(text).era
