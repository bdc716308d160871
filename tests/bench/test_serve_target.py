"""--match-slots: a plan's server argv rewritten for a concurrency level (pure)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moetune.bench.serve_target import (
    CTX,
    PARALLEL,
    flag_value,
    is_url,
    load_plan_launch,
    match_slots,
    set_flag,
    slot_context,
)
from moetune.engine.launchspec import LaunchSpec, ProcessSpec
from moetune.errors import InputError


def server(*argv: str, name: str = "main") -> ProcessSpec:
    return ProcessSpec(name=name, role="server", engine="llama.cpp", argv=("-m", "m.gguf", *argv),
                       host="127.0.0.1", port=8080, after=("rpc0",))


RPC = ProcessSpec(name="rpc0", role="rpc", engine="llama.cpp", argv=("-p", "50052"), host="127.0.0.1", port=50052)


@pytest.mark.parametrize(("argv", "names", "value"), [
    (("-c", "4096"), CTX, "4096"),
    (("--ctx-size=8192",), CTX, "8192"),
    (("-c", "1", "--ctx-size", "2"), CTX, "2"),
    (("-np", "4"), PARALLEL, "4"),
    ((), PARALLEL, None),
])
def test_flag_value(argv: tuple[str, ...], names: tuple[str, ...], value: str | None) -> None:
    assert flag_value(argv, names) == value


@pytest.mark.parametrize(("argv", "expected"), [
    (("-m", "x", "-c", "4096", "-ngl", "99"), ("-m", "x", "--ctx-size", "9", "-ngl", "99")),
    (("--ctx-size=4096", "-fa"), ("--ctx-size", "9", "-fa")),
    (("-c", "1", "-t", "8", "--ctx-size", "2"), ("--ctx-size", "9", "-t", "8")),
    (("-t", "8"), ("-t", "8", "--ctx-size", "9")),
])
def test_set_flag(argv: tuple[str, ...], expected: tuple[str, ...]) -> None:
    assert set_flag(argv, CTX, "9") == expected


@pytest.mark.parametrize(("argv", "per_slot"), [
    (("-c", "8192", "--parallel", "4"), 2048),
    (("-c", "8192",), 8192),
    (("-c", "0",), None),
    ((), None),
    (("-c", "8192", "-np", "2", "--kv-unified"), 4096),
])
def test_slot_context(argv: tuple[str, ...], per_slot: int | None) -> None:
    assert slot_context(server(*argv)) == per_slot


@pytest.mark.parametrize(("argv", "c", "need", "parallel", "ctx"), [
    # the plan's per-slot share kept when larger than needed
    (("-c", "8192", "--parallel", "1"), 4, 600, "4", "32768"),
    # grown to what the workload needs
    (("-c", "2048", "-np", "4"), 2, 1000, "2", "2000"),
    # no -c in the plan: just what is needed
    (("-ngl", "99"), 8, 512, "8", "4096"),
])
def test_match_slots(argv: tuple[str, ...], c: int, need: int, parallel: str, ctx: str) -> None:
    spec = LaunchSpec((RPC, server(*argv)))
    out = match_slots(spec, c, need_per_slot=need)
    s = out.servers()[0]
    assert flag_value(s.argv, PARALLEL) == parallel
    assert flag_value(s.argv, CTX) == ctx
    assert s.argv[:2] == ("-m", "m.gguf")
    assert out.workers() == [RPC]  # workers untouched
    assert spec.servers()[0].argv == ("-m", "m.gguf", *argv)  # input untouched


def test_match_slots_needs_one_server() -> None:
    b = ProcessSpec(name="b", role="server", engine="llama.cpp", argv=(), host="127.0.0.1", port=8081)
    spec = LaunchSpec((RPC, server(name="a"), b))
    with pytest.raises(InputError, match="one server"):
        match_slots(spec, 2, need_per_slot=100)
    assert match_slots(spec, 2, need_per_slot=100, server="b").servers()[1].argv == ("--parallel", "2",
                                                                                     "--ctx-size", "200")


def test_targets(tmp_path: Path) -> None:
    assert is_url("http://127.0.0.1:8080") and is_url("https://h/v1")
    assert not is_url("plan.json") and not is_url("ftp://x")
    p = tmp_path / "plan.json"
    p.write_text(json.dumps({"launch": LaunchSpec((RPC, server())).to_json()}))
    assert load_plan_launch(p).servers()[0].name == "main"
    p.write_text(json.dumps({"placement": {}}))
    with pytest.raises(InputError, match="no launch section"):
        load_plan_launch(p)
