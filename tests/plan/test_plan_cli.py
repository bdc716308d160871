"""`moetune plan` and `moetune hw` as a user runs them: the JSON contract, exit codes, formats."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from moetune.model.archs import Dims
from moetune.model.profile import ModelProfile
from moetune.model.testmodel import generate
from tests.helpers import run_cli

HW = "nodes: [{name: local, cpu: {cores: 16, ram_mib: 786432, ram_bw_gbs: 460}, devices: [{name: CUDA0, kind: gpu, mem_mib: 97247, bw_gbs: 1790}]}]"


@pytest.fixture
def hw(tmp_path: Path) -> Path:
    p = tmp_path / "hw.yaml"
    p.write_text(HW + "\n")
    return p


def test_plan_json_contract(glm51: ModelProfile, hw: Path) -> None:
    r = run_cli(
        "plan",
        str(glm51.files[3]),
        "--hw",
        str(hw),
        "--strategy",
        "n-cpu-moe:64",
        "--ctx",
        "32768",
        "--ctk",
        "q8_0",
        "--ctv",
        "q8_0",
        "--json",
    )
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert isinstance(doc["fits"], bool)
    for d in doc["devices"]:
        assert {"name", "capacity_mib", "used_mib", "items"} <= set(d)
        assert {i["what"] for i in d["items"]} >= (
            {"weights", "kv", "compute"} if d["name"] == "CUDA0" else {"weights"}
        )
    assert doc["predicted"]["tg_tok_s"] > 0 and doc["predicted"]["pp_tok_s"] > 0
    assert doc["argv"][0] == "llama-server" and "-ot" in doc["argv"]
    assert doc["launch"]["processes"][0]["role"] == "server"
    assert doc["shortfalls"] == [] if doc["fits"] else doc["shortfalls"]


def test_plan_that_does_not_fit_exits_0_and_names_the_shortfall(glm51: ModelProfile, hw: Path) -> None:
    r = run_cli("plan", str(glm51.files[0]), "--hw", str(hw), "--strategy", "n-cpu-moe:40", "--json")
    assert r.exit_code == 0
    doc = json.loads(r.stdout)
    assert not doc["fits"]
    (sf,) = doc["shortfalls"]
    assert sf["device"] == "CUDA0" and sf["what"] == "weights" and sf["mib"] > 10000
    assert sf["mib"] == pytest.approx(sf["needed_mib"] - sf["capacity_mib"], abs=0.11)
    r = run_cli("plan", str(glm51.files[0]), "--hw", str(hw), "--strategy", "n-cpu-moe:40")
    assert r.exit_code == 0 and "does not fit: CUDA0 is short by" in r.stdout
    # the verdict's numbers add up, and the table's free column says the same
    m = re.search(r"short by ([\d,]+) MiB: needs ([\d,]+) of ([\d,]+) MiB \(1,024 MiB of margin included\)", r.stdout)
    assert m, r.stdout
    short, need, cap = (int(g.replace(",", "")) for g in m.groups())
    assert short == need - cap
    assert re.search(rf"│\s+{cap:,}\s+│\s+-{short:,}\s+│", r.stdout)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--strategy", "bogus"], "--strategy 'bogus'"),
        (["--strategy", "layers:CUDA7=3-4"], "CUDA7=3-4"),
        (["--ctk", "q5_1"], "--ctk q5_1"),
        (["-ub", "4096", "-b", "512"], "-ub 4096 is larger than -b 512"),
        (["--speed", "warp=9"], "unknown constant"),
    ],
)
def test_bad_input_exits_2(glm51: ModelProfile, hw: Path, args: list[str], message: str) -> None:
    r = run_cli("plan", str(glm51.files[0]), "--hw", str(hw), *args)
    assert r.exit_code == 2
    assert message in r.stderr and "Traceback" not in r.stderr


def test_bad_hardware_file(glm51: ModelProfile, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes: [{name: x, cpu: {cores: 0, ram_mib: 1, ram_bw_gbs: 1}}]\n")
    r = run_cli("plan", str(glm51.files[0]), "--hw", str(bad))
    assert r.exit_code == 2 and "nodes.0.cpu.cores" in r.stderr
    r = run_cli("plan", str(glm51.files[0]), "--hw", str(tmp_path / "missing.yaml"))
    assert r.exit_code == 2 and "no such hardware file" in r.stderr


def test_formats(tmp_path: Path, hw: Path) -> None:
    g = generate(tmp_path / "my model's.gguf", "qwen3moe", Dims(n_layer=4), "f16")
    base = ["plan", str(g.files[0]), "--hw", str(hw), "--strategy", "n-cpu-moe:2"]
    sh = run_cli(*base, "--format", "shell").stdout
    argv = json.loads(run_cli(*base, "--json").stdout)["argv"]
    joined = sh.split("exec ", 1)[1].replace("\\\n", " ")
    assert shlex.split(joined) == argv  # the script quotes the path with its quote safely
    pod = run_cli(*base, "--format", "podman", "--image", "ik:latest").stdout
    assert "nvidia.com/gpu=0" in pod and "/models:ro,Z" in pod and "--network host" in pod.replace(" \\\n  ", " ")
    swap = yaml.safe_load(run_cli(*base, "--format", "llama-swap").stdout)
    assert "${PORT}" in swap["models"]["main"]["cmd"]
    ik = json.loads(run_cli(*base, "--engine", "ik_llama.cpp", "--json").stdout)
    assert ik["argv"][ik["argv"].index("-fa") + 1] == "on"  # ik 0.1.5's -fa takes a value
    assert "--jinja" in ik["argv"] and "-nr" not in ik["argv"]
    attention, *notes = ik["services"][0]["notes"]  # first: why flash attention and the cache type
    assert attention.startswith("flash attention on, f16/f16 cache: no variant predicted")  # a GPU: the default
    # one device: both engines keep the first N layers' experts (ik shares N among devices only with two or more)
    assert [n.split(":")[0] for n in notes[:2]] == ["ik_llama.cpp", "llama.cpp"]
    assert all("layers 0-1 on the CPU" in n for n in notes[:2]), notes


def test_hw_commands(tmp_path: Path) -> None:
    r = run_cli("hw", "example")
    assert {"rtx-pro-6000x2", "dgx-spark-x2"} <= set(r.stdout.split())
    r = run_cli("hw", "show", "dgx-spark-x2", "--json")
    devs = json.loads(r.stdout)
    assert [d["name"] for d in devs] == ["RPC0[192.168.100.2:50052]", "CUDA0", "CPU"]
    out = tmp_path / "probed.yaml"
    r = run_cli("hw", "probe", "--no-measure", "-o", str(out))
    assert r.exit_code == 0
    doc = yaml.safe_load(out.read_text())
    assert doc["nodes"][0]["cpu"]["ram_mib"] > 1000 and doc["nodes"][0]["cpu"]["cores"] >= 1
    assert run_cli("hw", "show", str(out)).exit_code == 0


def test_layout_file(tmp_path: Path) -> None:
    """Models are found relative to the layout file; ports default to --port, --port + 1, ...;
    the plan is also written with -o; bad layouts are one line and exit 2."""
    generate(tmp_path / "a.gguf", "qwen3moe", Dims(n_layer=4), "f16")
    layout = tmp_path / "layout.yaml"
    layout.write_text(
        "services:\n  - {name: big, model: a.gguf, strategy: auto}\n"
        "  - {name: small, model: a.gguf, strategy: cpu-moe, ctx: 2048, engine: ik_llama.cpp}\n"
    )
    out = tmp_path / "plan.json"
    r = run_cli("plan", "--layout", str(layout), "--hw", "rtx-pro-6000", "--port", "9000", "-o", str(out), "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert json.loads(out.read_text()) == doc
    assert [(s["name"], s["port"], s["settings"]["ctx"]) for s in doc["services"]] == [
        ("big", 9000, 4096),
        ("small", 9001, 2048),
    ]
    servers = [p for p in doc["launch"]["processes"] if p["role"] == "server"]
    assert [p["engine"] for p in servers][1].startswith("ik_llama.cpp")  # moetune's ik build, built or not
    # a service on its own engine gets that engine's flags
    assert ["--jinja" in p["argv"] for p in servers] == [False, True]
    assert [s["settings"]["engine"] for s in doc["services"]] == ["llama.cpp", "ik_llama.cpp"]
    layout.write_text("services:\n  - {name: x, model: a.gguf, ctx: -1}\n")
    r = run_cli("plan", "--layout", str(layout), "--hw", "rtx-pro-6000")
    assert r.exit_code == 2 and "services.0.ctx" in r.stderr
    r = run_cli("plan", "a.gguf", "--layout", str(layout), "--hw", "rtx-pro-6000")
    assert r.exit_code == 2 and "not both" in r.stderr


def test_plans_store_paths_that_work_from_another_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model, a layout and a hardware file given relative to the current directory are stored
    absolute (what was typed is kept beside), so `launch` of the plan works from anywhere."""
    from moetune.run.prepare import model_paths, prepare, read_plan
    from tests.helpers import free_port

    work = tmp_path / "work"
    (work / "models").mkdir(parents=True)
    generate(work / "models" / "tiny.gguf", "qwen3moe", Dims(n_layer=2), "f16")
    (work / "hw.yaml").write_text(HW + "\n")
    (work / "layout.yaml").write_text(
        "services:\n  - {name: a, model: models/tiny.gguf, strategy: cpu-moe}\n"
        "  - {name: b, model: ./models/../models/tiny.gguf, strategy: cpu-moe}\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    model = str(work / "models" / "tiny.gguf")
    monkeypatch.chdir(tmp_path)
    port = str(free_port())
    for args, given in [
        (["work/models/tiny.gguf"], ["work/models/tiny.gguf"]),
        (["--layout", "work/layout.yaml"], ["models/tiny.gguf", "./models/../models/tiny.gguf"]),
    ]:
        r = run_cli("plan", *args, "--hw", "work/hw.yaml", "--port", port, "-o", "work/plan.json")
        assert r.exit_code == 0, r.stderr
        monkeypatch.chdir(elsewhere)
        spec, doc = read_plan(work / "plan.json")
        assert [s["model"] for s in doc["services"]] == [model] * len(given)
        assert [s["model_given"] for s in doc["services"]] == given
        assert [model_paths(p.argv) for p in spec.servers()] == [[model]] * len(given)
        assert doc["hardware"] == str(work / "hw.yaml")
        assert [p.name for p in prepare(spec)] == [s["name"] for s in doc["services"]]  # the model files are found
        monkeypatch.chdir(tmp_path)


HW2 = (
    "nodes: [{name: local, cpu: {cores: 16, ram_mib: 786432, ram_bw_gbs: 460}, devices: ["
    "{name: CUDA0, kind: gpu, mem_mib: 97887, bw_gbs: 1790}, {name: CUDA1, kind: gpu, mem_mib: 97887, bw_gbs: 1790}]}]"
)


@pytest.mark.parametrize(
    ("strategy", "cuda0", "cuda1"),
    [
        ("head-tail:12+10", set(range(3, 15)), set(range(68, 78))),  # reference 000's winner
        ("head-tail:8+8+4", {*range(3, 11), 18, 33}, {47, 62, *range(70, 78)}),  # its 20-layer set
    ],
)
def test_plan_renders_a_head_tail_strategy_as_ot_rules(
    glm51: ModelProfile, tmp_path: Path, strategy: str, cuda0: set[int], cuda1: set[int]
) -> None:
    hw = tmp_path / "hw2.yaml"
    hw.write_text(HW2 + "\n")
    r = run_cli(
        "plan",
        str(glm51.files[0]),
        "--hw",
        str(hw),
        "--strategy",
        strategy,
        "--ctx",
        "32768",
        "--ctk",
        "q8_0",
        "--ctv",
        "q8_0",
        "--json",
    )
    assert r.exit_code == 0, r.stderr
    (svc,) = json.loads(r.stdout)["services"]
    argv = svc["argv"]
    rules = [argv[i + 1] for i, a in enumerate(argv) if a in ("-ot", "--override-tensor")]
    assert rules == svc["override_rules"] and svc["strategy"] == strategy
    on: dict[str, set[int]] = {}
    for layer in svc["layers"]:
        for dev in set(layer["experts"].values()):
            on.setdefault(dev, set()).add(layer["index"])
    assert on == {"CUDA0": cuda0, "CUDA1": cuda1, "CPU": set(range(3, 78)) - cuda0 - cuda1}
    # the rules say it (llama.cpp searches each tensor's name for each pattern): the CPU's match exactly
    # the layers whose experts stay there; the rest stay with their layer's GPU
    cpu = [re.compile(rule.rsplit("=", 1)[0]) for rule in rules if rule.endswith("=CPU")]
    assert cpu and len(cpu) == len(rules)
    for i in range(3, 78):
        assert any(p.search(f"blk.{i}.ffn_up_exps.weight") for p in cpu) == (i in on["CPU"]), i
