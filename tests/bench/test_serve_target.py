"""What a benchmark points at (one rule for every command), and --match-slots: a plan's server
argv rewritten for a concurrency level (pure)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moetune.bench.target import (
    CTX,
    PARALLEL,
    choose_server,
    flag_value,
    match_slots,
    resolve,
    set_flag,
    slot_context,
)
from moetune.engine.launchspec import LaunchSpec, ProcessSpec
from moetune.errors import InputError


def server(*argv: str, name: str = "main") -> ProcessSpec:
    return ProcessSpec(
        name=name,
        role="server",
        engine="llama.cpp",
        argv=("-m", "m.gguf", *argv),
        host="127.0.0.1",
        port=8080,
        after=("rpc0",),
    )


RPC = ProcessSpec(name="rpc0", role="rpc", engine="llama.cpp", argv=("-p", "50052"), host="127.0.0.1", port=50052)


@pytest.mark.parametrize(
    ("argv", "names", "value"),
    [
        (("-c", "4096"), CTX, "4096"),
        (("--ctx-size=8192",), CTX, "8192"),
        (("-c", "1", "--ctx-size", "2"), CTX, "2"),
        (("-np", "4"), PARALLEL, "4"),
        ((), PARALLEL, None),
    ],
)
def test_flag_value(argv: tuple[str, ...], names: tuple[str, ...], value: str | None) -> None:
    assert flag_value(argv, names) == value


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (("-m", "x", "-c", "4096", "-ngl", "99"), ("-m", "x", "--ctx-size", "9", "-ngl", "99")),
        (("--ctx-size=4096", "-fa"), ("--ctx-size", "9", "-fa")),
        (("-c", "1", "-t", "8", "--ctx-size", "2"), ("--ctx-size", "9", "-t", "8")),
        (("-t", "8"), ("-t", "8", "--ctx-size", "9")),
    ],
)
def test_set_flag(argv: tuple[str, ...], expected: tuple[str, ...]) -> None:
    assert set_flag(argv, CTX, "9") == expected


@pytest.mark.parametrize(
    ("argv", "per_slot"),
    [
        (("-c", "8192", "--parallel", "4"), 2048),
        (
            (
                "-c",
                "8192",
            ),
            8192,
        ),
        (
            (
                "-c",
                "0",
            ),
            None,
        ),
        ((), None),
        (("-c", "8192", "-np", "2", "--kv-unified"), 4096),
    ],
)
def test_slot_context(argv: tuple[str, ...], per_slot: int | None) -> None:
    assert slot_context(server(*argv)) == per_slot


@pytest.mark.parametrize(
    ("argv", "c", "need", "parallel", "ctx"),
    [
        # the plan's per-slot share kept when larger than needed
        (("-c", "8192", "--parallel", "1"), 4, 600, "4", "32768"),
        # grown to what the workload needs
        (("-c", "2048", "-np", "4"), 2, 1000, "2", "2000"),
        # no -c in the plan: just what is needed
        (("-ngl", "99"), 8, 512, "8", "4096"),
    ],
)
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
    with pytest.raises(InputError, match="say which one"):
        match_slots(spec, 2, need_per_slot=100)
    assert match_slots(spec, 2, need_per_slot=100, server="b").servers()[1].argv == (
        "--parallel",
        "2",
        "--ctx-size",
        "200",
    )


@pytest.mark.parametrize(
    ("typed", "url"),
    [
        ("http://127.0.0.1:8080", "http://127.0.0.1:8080"),
        ("http://127.0.0.1:8080/", "http://127.0.0.1:8080"),
        ("http://127.0.0.1:8080/v1", "http://127.0.0.1:8080"),  # an OpenAI base URL names the same server
        ("127.0.0.1:8080", "http://127.0.0.1:8080"),
        ("https://h:443/v1/", "https://h:443"),
    ],
)
def test_urls(typed: str, url: str) -> None:
    t = resolve(typed)
    assert (t.url, t.plan_path, t.name, t.label) == (url, None, url, None)


def _plan(tmp_path: Path, *procs: ProcessSpec, label: str | None = None) -> Path:
    p = tmp_path / "plan.json"
    doc: dict[str, object] = {"launch": LaunchSpec(procs).to_json()}
    if label:
        doc["label"] = label
    p.write_text(json.dumps(doc))
    return p


B = ProcessSpec(name="b", role="server", engine="llama.cpp", argv=(), host="127.0.0.1", port=8081)


@pytest.mark.parametrize(
    ("procs", "server_arg", "chosen", "error"),
    [
        ((RPC, server()), None, "main", None),  # one server: no choice to make
        ((RPC, server()), "main", "main", None),
        ((RPC, server()), "b", None, "no such server"),
        ((RPC, server(), B), None, None, "starts 2 servers .*say which one"),  # the one rule: never the first silently
        ((RPC, server(), B), "b", "b", None),
        ((RPC,), None, None, "starts no server"),
    ],
)
def test_one_rule_for_a_plan_with_several_servers(
    tmp_path: Path, procs: tuple[ProcessSpec, ...], server_arg: str | None, chosen: str | None, error: str | None
) -> None:
    p = _plan(tmp_path, *procs)
    if error:
        with pytest.raises(InputError, match=error):
            resolve(str(p), server_arg)
        return
    t = resolve(str(p), server_arg)
    assert (t.server, t.url, t.label, t.name) == (chosen, None, "plan", str(p.resolve()))
    assert choose_server(LaunchSpec(procs), server_arg, "x").name == chosen


def test_bad_targets(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="neither a server URL nor a plan"):
        resolve("nothing-here")
    with pytest.raises(InputError, match="TARGET is a URL"):
        resolve("http://127.0.0.1:1", "main")
    with pytest.raises(InputError, match="is a directory, not a plan file"):
        resolve(str(tmp_path))
    p = tmp_path / "plan.json"
    p.write_text(json.dumps({"placement": {}}))
    with pytest.raises(InputError, match="no launch section"):
        resolve(str(p))
    assert resolve(str(_plan(tmp_path, RPC, server(), label="cpu-moe"))).label == "cpu-moe"
