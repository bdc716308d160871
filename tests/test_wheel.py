"""What the package installs is what users run: build the wheel, install it in a clean venv (no
dev extras, no clients or tokenizers extra) and run the commands from it.

The venv is built once per session; its dependencies come from PyPI or pip's cache.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import llama_server

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted(p.name for p in (ROOT / "src/moetune/hardware/examples").glob("*.yaml"))
CLIENT_LIBS = ("httpx", "aiohttp")
Run = Callable[..., "subprocess.CompletedProcess[str]"]


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built from a copy of the tree, so the build leaves nothing in the checkout."""
    d = tmp_path_factory.mktemp("wheel")
    src = d / "src-copy"
    shutil.copytree(ROOT / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(d), str(src)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (whl,) = d.glob("moetune-*.whl")
    return whl


@pytest.fixture(scope="session")
def venv_bin(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("wheel-venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run(
        [str(venv / "bin/python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return venv / "bin"


@pytest.fixture
def moetune(venv_bin: Path, tmp_path: Path) -> Run:
    """Run the installed `moetune` from a directory outside the checkout, with its own data dir."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["MOETUNE_DATA_DIR"] = str(tmp_path / "data")

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(
            [str(venv_bin / "moetune"), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        if check:
            assert r.returncode == 0, f"moetune {' '.join(args)}: {r.stderr[-2000:]}"
        return r

    return run


def test_wheel_holds_the_hardware_examples(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for example in EXAMPLES:
        assert f"moetune/hardware/examples/{example}" in names
    assert "moetune/monitor/grafana/moetune.json" in names
    assert not any(n.startswith(("tests/", "benchmarks/")) for n in names)


def test_installed_wheel_runs_without_dev_or_client_extras(venv_bin: Path, moetune: Run, tmp_path: Path) -> None:
    py = str(venv_bin / "python")
    where = subprocess.run(
        [
            py,
            "-c",
            "import moetune, importlib.util as u; print(moetune.__file__); "
            f"print([m for m in {CLIENT_LIBS!r} if u.find_spec(m)])",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert "site-packages" in where[0] and str(ROOT) not in where[0]
    assert where[1] == "[]", "the clients extra is not installed, so neither library may be there"

    assert "inspect" in moetune("--help").stdout
    listed = moetune("hw", "example").stdout.split()
    assert listed == [e.removesuffix(".yaml") for e in EXAMPLES]
    assert "nodes:" in moetune("hw", "example", "rtx-pro-6000").stdout

    moetune("testmodel", "tiny.gguf", "--layers", "2")
    doc = json.loads(moetune("inspect", "tiny.gguf", "--json").stdout)
    assert doc["n_layer_trunk"] == 2
    plan = json.loads(moetune("plan", "tiny.gguf", "--hw", "rtx-pro-6000", "--json").stdout)
    assert plan, "a plan document"

    for cmd in ("bench", "serve-bench"):
        assert "Usage: moetune " + cmd in moetune(cmd, "--help").stdout
    # serve-bench --tokenizer needs the tokenizers extra, and says how to get it
    (tmp_path / "tokenizer.json").write_text("{}")
    r = moetune("serve-bench", "http://127.0.0.1:9", "--tokenizer", "tokenizer.json", check=False)
    assert r.returncode == 2 and "pip install 'moetune[tokenizers]'" in r.stderr, r.stderr
    assert json.loads(moetune("metrics", "dashboard").stdout)["uid"] == "moetune"


@pytest.mark.server
def test_installed_wheel_benches_a_real_server(moetune: Run, bin_dir: Path, tmp_path: Path) -> None:
    moetune("testmodel", "serve.gguf", "--layers", "2")
    with llama_server(bin_dir, tmp_path / "serve.gguf", tmp_path / "server.log", "-nr", "-c", "1024", "-t", "1") as srv:
        r = moetune("bench", srv.url, "--json", "-r", "1", "--warmup", "0", "--max-tokens", "8", "--ignore-eos")
        assert json.loads(r.stdout)["tg"]["n"] == 1
        r = moetune(
            "serve-bench",
            srv.url,
            "--json",
            "--requests",
            "2",
            "--input-len",
            "64",
            "--output-len",
            "4",
            "--warmup",
            "0",
        )
        assert json.loads(r.stdout)["levels"]
