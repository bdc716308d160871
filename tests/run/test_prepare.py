"""From a plan to exact commands: reading plans, the argv moetune runs, the start order."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from moetune.engine.launchspec import LaunchSpec, ProcessSpec
from moetune.errors import InputError
from moetune.kinds import EngineKind
from moetune.paths import runs_dir
from moetune.run.prepare import (
    check_fits,
    final_argv,
    model_paths,
    read_plan,
    rpc_endpoints,
    start_order,
    ubatch,
)
from tests.helpers import free_port, run_cli
from tests.run.conftest import server

BIN = Path("/opt/llama/bin/llama-server")


def proc(
    name: str, role: str = "server", argv: tuple[str, ...] = (), port: int = 8080, after: tuple[str, ...] = ()
) -> ProcessSpec:
    return ProcessSpec(
        name=name, role=role, engine="llama.cpp-b11434", argv=argv, host="127.0.0.1", port=port, after=after
    )


@pytest.mark.parametrize(
    ("p", "kind", "tail"),
    [
        (
            proc("main", argv=("-m", "m.gguf")),
            EngineKind.MAINLINE,
            ["--host", "127.0.0.1", "--port", "8080", "-lv", "4", "--metrics"],
        ),
        # ik logs load details anyway
        (proc("main", argv=("-m", "m.gguf")), EngineKind.IK, ["--host", "127.0.0.1", "--port", "8080", "--metrics"]),
        (
            proc("main", argv=("-m", "m.gguf", "--port", "8080", "-lv", "3")),
            EngineKind.MAINLINE,
            ["--port", "8080", "-lv", "3", "--metrics"],
        ),
        (
            proc("main", argv=("-m", "m.gguf", "--verbose", "--metrics")),
            EngineKind.MAINLINE,
            ["--verbose", "--metrics", "--host", "127.0.0.1", "--port", "8080"],
        ),  # --metrics once
        (proc("rpc0", role="rpc", port=50052), EngineKind.MAINLINE, ["-H", "127.0.0.1", "-p", "50052"]),
        (
            proc("rpc0", role="rpc", argv=("-H", "10.0.0.2", "-p", "50052"), port=50052),
            EngineKind.MAINLINE,
            ["-p", "50052"],
        ),
    ],
)
def test_final_argv(p: ProcessSpec, kind: str, tail: list[str]) -> None:
    argv = final_argv(p, BIN, kind)
    assert argv[0] == str(BIN) and list(argv[1 : len(p.argv) + 1]) == list(p.argv)
    assert list(argv[-len(tail) :]) == tail


def test_final_argv_port_disagreement() -> None:
    with pytest.raises(InputError, match="says port 8080 but its arguments say 9090"):
        final_argv(proc("main", argv=("--port", "9090")), BIN, EngineKind.MAINLINE)


def test_start_order() -> None:
    spec = LaunchSpec(
        (
            proc("orch", after=("rpc0", "coder"), port=1),
            proc("coder", port=2),
            proc("rpc0", role="rpc", port=3),
            proc("rpc1", role="rpc", port=4),
        )
    )
    assert [p.name for p in start_order(spec)] == ["rpc0", "rpc1", "coder", "orch"]
    cycle = LaunchSpec((proc("a", after=("b",), port=1), proc("b", after=("a",), port=2)))
    with pytest.raises(InputError, match="wait for each other"):
        start_order(cycle)


def test_argument_readers() -> None:
    argv = (
        "-m",
        "/m/a-00001-of-00002.gguf",
        "--rpc",
        "10.0.0.2:50052,10.0.0.3:50052",
        "--rpc=127.0.0.1:1",
        "-md",
        "draft.gguf",
        "-ub",
        "4096",
    )
    assert rpc_endpoints(argv) == ["10.0.0.2:50052", "10.0.0.3:50052", "127.0.0.1:1"]
    assert model_paths(argv) == ["/m/a-00001-of-00002.gguf", "draft.gguf"]
    assert ubatch(argv) == 4096 and ubatch(()) is None


def test_read_plan(tmp_path: Path) -> None:
    spec = LaunchSpec((proc("rpc0", role="rpc", port=50052), proc("main", after=("rpc0",))))
    full = tmp_path / "plan.json"
    full.write_text(json.dumps({"schema_version": 1, "fits": True, "launch": spec.to_json()}))
    got, doc = read_plan(full)
    assert got == spec and doc["fits"] is True
    plain = tmp_path / "launch.json"
    plain.write_text(json.dumps(spec.to_json()))
    assert read_plan(plain)[0] == spec


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("{", "not JSON"),
        ("[]", "a plan is a JSON object"),
        ('{"fits": true}', "no launch section"),
        ('{"launch": {"processes": [{"name": "x"}]}}', "malformed"),
        (json.dumps({"launch": LaunchSpec((proc("rpc0", role="rpc"),)).to_json()}), "starts no server"),
    ],
)
def test_bad_plans(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "plan.json"
    path.write_text(text)
    with pytest.raises(InputError, match=words):
        read_plan(path)
    with pytest.raises(InputError, match="no such plan file"):
        read_plan(tmp_path / "none.json")


SHORT = {
    "device": "CUDA0",
    "mib": 5652.5,
    "what": "compute",
    "needed_mib": 103539.5,
    "capacity_mib": 97887.0,
    "margin_mib": 1024.0,
}


@pytest.mark.parametrize(
    ("doc", "said"),
    [
        ({"fits": True, "shortfalls": []}, []),
        ({}, []),  # a bare launch spec has no verdict
        ({"fits": False, "shortfalls": [SHORT]}, ["CUDA0 is short by 5,653 MiB: needs 103,540 of 97,887 MiB"]),
        (
            {
                "fits": False,
                "shortfalls": [{**SHORT, "margin_mib": None}, {**SHORT, "device": "CPU", "what": "margin"}],
            },
            ["CUDA0 is short by 5,653 MiB: needs 103,540 of 97,887 MiB; it runs out", "CPU is short by 5,653 MiB"],
        ),
        ({"fits": False}, ["the plan says it does not fit"]),
    ],
)
def test_check_fits(doc: dict[str, object], said: list[str]) -> None:
    got = check_fits(doc, Path("p.json"), force=True)
    assert len(got) == len(said) and all(g.startswith(s) for g, s in zip(got, said, strict=True))
    if not said:
        assert check_fits(doc, Path("p.json"), force=False) == []
        return
    with pytest.raises(InputError) as e:
        check_fits(doc, Path("p.json"), force=False)
    assert str(e.value) == f"p.json: the plan does not fit: {got[0]}" and e.value.details == tuple(got[1:])
    assert "--force" in (e.value.hint or "")


def test_launch_of_a_plan_that_does_not_fit_exits_2_before_starting_anything(
    tmp_path: Path, plan_file: Callable[..., Path]
) -> None:
    missing = tmp_path / "not-there.gguf"
    plan = plan_file(server(missing, port=free_port()), extra={"fits": False, "shortfalls": [SHORT]})
    r = run_cli("launch", str(plan))
    assert r.exit_code == 2, r.stderr
    assert "the plan does not fit: CUDA0 is short by 5,653 MiB" in r.stderr and "--force" in r.stderr
    assert "not-there.gguf" not in r.stderr  # refused before the checks that precede starting processes
    assert not runs_dir().exists() or not list(runs_dir().iterdir())  # no run was recorded
    r = run_cli("launch", str(plan), "--force")
    assert "launching a plan that does not fit (--force): CUDA0 is short by 5,653 MiB" in r.stderr
    assert r.exit_code == 1 and "not-there.gguf does not exist" in r.stderr  # it went on, to those checks
