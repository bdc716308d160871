"""`moetune plan --format ...` with ordinary and hostile model paths, for one model and for a layout:
every format is run for real (shell scripts by `sh`, against fake llama-server, podman and docker
that record their arguments) or parsed (argv lines by shlex, llama-swap by YAML), and must give the
plan's exact arguments with the model's absolute path."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from moetune.engine.formats import Command, container_command
from moetune.errors import InputError
from moetune.model.archs import Dims
from moetune.model.testmodel import generate
from tests.helpers import run_cli

GPU_HW = (
    "nodes: [{name: local, cpu: {cores: 16, ram_mib: 786432, ram_bw_gbs: 460}, "
    "devices: [{name: CUDA0, kind: gpu, mem_mib: 97247, bw_gbs: 1790}]}]\n"
)
CPU_HW = "nodes: [{name: local, cpu: {cores: 16, ram_mib: 786432, ram_bw_gbs: 460}}]\n"
FORMATS = ("argv", "shell", "podman", "docker", "llama-swap")

# (case, the path as typed, relative to the directory `plan` runs in; shards)
PATHS = [
    ("bare file name", "m.gguf", 1),
    ("relative dir", "sub/dir/m.gguf", 1),
    ("absolute dir", "ABS/m.gguf", 1),
    ("spaces", "my models/m m.gguf", 1),
    ("quotes", "it's \"q\"/m'1.gguf", 1),
    ("dollar", "$HOME/m$1 $x.gguf", 1),
    ("non-ASCII", "modèles/模型 ünï.gguf", 1),
    ("shards, dots in a bare name", "GLM-5.1-IQ3_KS-00001-of-00002.gguf", 2),
]

FAKE = """#!{python}
import json, os, sys
name = os.path.basename(sys.argv[0])
with open(os.path.join(os.environ["FAKE_OUT"], f"{{name}}-{{os.getpid()}}.json"), "w") as f:
    json.dump(sys.argv[1:], f)
"""


def _model(cwd: Path, typed: str, shards: int) -> str:
    """Write the model where ``typed`` points from ``cwd``; return what to pass to `plan`."""
    if typed.startswith("ABS/"):
        typed = str(cwd.parent / "abs" / typed.removeprefix("ABS/"))
    first = cwd / typed
    first.parent.mkdir(parents=True, exist_ok=True)
    out = first.parent / first.name.replace("-00001-of-00002", "") if shards > 1 else first
    g = generate(out, "qwen3moe", Dims(n_layer=4), "f16", shards=shards)
    assert str(g.files[0]) == str(first)
    return typed


def _run_script(text: str, tmp: Path) -> list[list[str]]:
    """Run a generated script with fake binaries on PATH; each invocation's argv[0] (its name) and arguments."""
    fakes, got = tmp / "fakes", tmp / "got"
    fakes.mkdir(exist_ok=True)
    got.mkdir(exist_ok=True)
    for f in got.iterdir():
        f.unlink()
    for name in ("llama-server", "podman", "docker"):
        (fakes / name).write_text(FAKE.format(python=sys.executable))
        (fakes / name).chmod(0o755)
    script = tmp / "run.sh"
    script.write_text(text)
    env = {**os.environ, "PATH": f"{fakes}:{os.environ['PATH']}", "FAKE_OUT": str(got)}
    subprocess.run(["sh", str(script)], env=env, check=True, timeout=30)
    calls = [(f.stem.split("-")[-1], f.stem.rsplit("-", 1)[0], json.loads(f.read_text())) for f in got.iterdir()]
    return [[name, *argv] for _, name, argv in sorted(calls, key=lambda c: int(c[0]))]


def _by_service(calls: list[list[str]], ports: list[int]) -> list[list[str]]:
    """Calls in the plan's service order (background processes start in any order)."""

    def port(argv: list[str]) -> int:
        return next(
            int(a.rsplit(":", 1)[-1])
            for i, a in enumerate(argv)
            if argv[i - 1] in ("--port", "-p") and a.rsplit(":", 1)[-1].isdigit()
        )

    return sorted(calls, key=lambda c: ports.index(port(c)))


def _plan(cwd: Path, args: list[str], fmt: str, *more: str) -> str:
    r = run_cli("plan", *args, "--format", fmt, *more)
    assert r.exit_code == 0, r.stderr
    return r.stdout


def _check_formats(tmp: Path, args: list[str], gpus: bool) -> None:
    """Every format of the plan ``args`` gives each service's argv from the JSON, model paths included."""
    doc = json.loads(run_cli("plan", *args, "--json").stdout)
    want = [["llama-server", *s["argv"]] for s in doc["services"]]
    ports = [s["port"] for s in doc["services"]]
    models = [Path(s["model"]) for s in doc["services"]]
    assert all(m.is_absolute() and m.exists() for m in models)
    assert [w[w.index("-m") + 1] for w in want] == [str(m) for m in models]
    lines = [ln for ln in _plan(tmp, args, "argv").splitlines() if not ln.startswith("#")]
    assert [shlex.split(ln) for ln in lines] == want
    assert _by_service(_run_script(_plan(tmp, args, "shell"), tmp), ports) == want
    swap = yaml.safe_load(_plan(tmp, args, "llama-swap"))["models"]
    assert list(swap) == [s["name"] for s in doc["services"]]
    for w, entry in zip(want, swap.values(), strict=True):
        assert shlex.split(entry["cmd"]) == [("${PORT}" if w[i - 1] == "--port" else a) for i, a in enumerate(w)]
        assert entry["proxy"] == "http://127.0.0.1:${PORT}"
    for runtime in ("podman", "docker"):
        calls = _by_service(_run_script(_plan(tmp, args, runtime, "--image", "img:1"), tmp), ports)
        assert len(calls) == len(want)
        for call, w, model in zip(calls, want, models, strict=True):
            run, inside = call[: call.index("img:1")], call[call.index("img:1") + 1 :]
            assert run[:3] == [runtime, "run", "--rm"]
            # private to its container, shared where another service mounts the same directory
            shared = sum(m.parent == model.parent for m in models) > 1
            assert run[run.index("-v") + 1] == f"{model.parent}:/models:ro,{'z' if shared else 'Z'}"
            assert inside[inside.index("-m") + 1] == f"/models/{model.name}"
            # the rig's one GPU, by its index (CDI for podman)
            gpu_flags = ["--device", "nvidia.com/gpu=0"] if runtime == "podman" else ["--gpus", '"device=0"']
            assert (" ".join(gpu_flags) in " ".join(run)) == gpus
            assert "nvidia.com/gpu=all" not in run and "all" not in run
            # a server on loopback shares the host's network, its address as planned
            assert run[run.index("--network") + 1] == "host" and "-p" not in run
            expect = [("/models/" + model.name if w[i - 1] == "-m" else a) for i, a in enumerate(w)][1:]
            assert inside == expect


@pytest.mark.parametrize(("case", "typed", "shards"), PATHS, ids=[p[0] for p in PATHS])
@pytest.mark.parametrize("gpus", [True, False], ids=["gpu", "cpu-only"])
def test_every_format_keeps_the_model_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str, typed: str, shards: int, gpus: bool
) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    hw = tmp_path / "hw.yaml"
    hw.write_text(GPU_HW if gpus else CPU_HW)
    monkeypatch.chdir(cwd)
    model = _model(cwd, typed, shards)
    _check_formats(tmp_path, [model, "--hw", str(hw), "--strategy", "n-cpu-moe:2"], gpus)


@pytest.mark.parametrize("gpus", [True, False], ids=["gpu", "cpu-only"])
def test_every_format_gives_every_service_of_a_layout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpus: bool
) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    hw = tmp_path / "hw.yaml"
    hw.write_text(GPU_HW if gpus else CPU_HW)
    monkeypatch.chdir(cwd)
    _model(cwd, "models/big.gguf", 1)
    _model(cwd, "other dir/it's $x.gguf", 1)
    (cwd / "layout.yaml").write_text(
        "services:\n  - {name: orchestrator, model: models/big.gguf, strategy: auto}\n"
        '  - {name: coder1, model: "other dir/it\'s $x.gguf", strategy: cpu-moe, port: 9101}\n'
        '  - {name: coder2, model: "other dir/it\'s $x.gguf", strategy: cpu-moe, port: 9102, engine: ik_llama.cpp}\n'
    )
    args = ["--layout", "layout.yaml", "--hw", str(hw)]
    _check_formats(tmp_path, args, gpus)
    doc = json.loads(run_cli("plan", *args, "--json").stdout)
    # the ik service speaks ik's dialect, the others mainline's
    assert ["-fit" in s["argv"] for s in doc["services"]] == [True, True, False]
    assert ["--jinja" in s["argv"] for s in doc["services"]] == [False, False, True]
    table = _plan(tmp_path, args, "table")
    assert table.count("llama-server") == 3 and all(f"--port {p}" in table for p in (8080, 9101, 9102))
    # the memory table names the service of each line
    rows = [r.split("│") for r in table.splitlines() if r.startswith("│")]
    named = {(c[2].strip(), c[3].strip()) for c in rows if len(c) > 4 and c[3].strip() not in ("", "total")}
    assert {("orchestrator", "weights"), ("coder1", "weights"), ("coder2", "weights"), ("(all)", "margin")} <= named


@pytest.mark.parametrize(
    ("engine", "gpus", "image", "fit_off"),
    [
        ("llama.cpp", True, "ghcr.io/ggml-org/llama.cpp:server-cuda", True),
        ("llama.cpp", False, "ghcr.io/ggml-org/llama.cpp:server", True),
        ("ik_llama.cpp", True, "ik_llama.cpp:latest", False),
    ],
)
def test_container_image_and_flags_follow_the_engine(
    tmp_path: Path, engine: str, gpus: bool, image: str, fit_off: bool
) -> None:
    g = generate(tmp_path / "m.gguf", "qwen3moe", Dims(n_layer=4), "f16")
    hw = tmp_path / "hw.yaml"
    hw.write_text(GPU_HW if gpus else CPU_HW)
    for runtime in ("podman", "docker"):
        words = shlex.split(
            _plan(tmp_path, [str(g.files[0]), "--hw", str(hw), "--engine", engine], runtime)
            .split("exec ", 1)[1]
            .replace("\\\n", " ")
        )
        assert words[words.index("-m") - 1] == image
        assert ("-fit" in words) == fit_off


def test_container_refuses_a_directory_it_cannot_mount_and_shares_the_network_for_loopback_rpc() -> None:
    cmd = Command("main", 8080, ("llama-server", "-m", "/a:b/m.gguf", "--host", "127.0.0.1", "--port", "8080"))
    with pytest.raises(InputError, match="cannot be mounted"):
        container_command("podman", "img", cmd)
    cmd = Command(
        "main",
        8080,
        (
            "llama-server",
            "-m",
            "/m/x.gguf",
            "-md",
            "/d/y.gguf",
            "--rpc",
            "127.0.0.1:50052",
            "--host",
            "127.0.0.1",
            "--port",
            "8080",
        ),
    )
    got = container_command("docker", "img", cmd, gpus=("CUDA0",)).argv
    assert got == (
        "docker",
        "run",
        "--rm",
        "--gpus",
        '"device=0"',
        "--network",
        "host",
        "-v",
        "/m:/models:ro,Z",
        "-v",
        "/d:/models2:ro,Z",
        "img",
        "-m",
        "/models/x.gguf",
        "-md",
        "/models2/y.gguf",
        "--rpc",
        "127.0.0.1:50052",
        "--host",
        "127.0.0.1",
        "--port",
        "8080",
    )
