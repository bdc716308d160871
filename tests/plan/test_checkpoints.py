"""Context checkpoints in the ledger (pure): which models and engines keep them, their size from the
engine's state format, the --ctx-checkpoints count per slot, and the rendered flag (accepted by
both built engines' argument parsers). The real server's sizes: tests/plan/test_checkpoints_server.py;
ik_llama.cpp's, from its captured log lines here."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from moetune.engine.logs import parse_log
from moetune.hardware.inventory import from_dict, load
from moetune.kinds import EngineKind
from moetune.model.archs import PRESETS, small_dims, with_overrides
from moetune.model.kv import checkpoint_bytes, kv_shape
from moetune.model.profile import ModelProfile, load_profile
from moetune.model.testmodel import generate
from moetune.plan.ledger import checkpoints_item
from moetune.plan.plan import ServiceSpec, make_plan
from moetune.plan.settings import Settings
from tests.helpers import engine_bin_dir, loopback_hw, run_cli

MIB = 1 << 20


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelProfile]:
    d = tmp_path_factory.mktemp("ckpt")
    out = {}
    for arch in ("qwen35moe", "gpt-oss", "qwen3moe", "deepseek2"):
        dims = with_overrides(small_dims(arch), ssm_dt_rank=8) if arch == "qwen35moe" else small_dims(arch)
        out[arch] = load_profile(generate(d / f"{arch}.gguf", arch, dims, "f16").files[0])
    return out


@pytest.fixture(scope="module")
def qwen35(tmp_path_factory: pytest.TempPathFactory) -> ModelProfile:
    arch, dims = PRESETS["qwen3.5-397b-a17b"]
    d = tmp_path_factory.mktemp("q35")
    return load_profile(generate(d / "q35.gguf", arch, dims, "q8_0", sparse=True).files[0])


def test_qwen35_397b_checkpoint_is_its_recurrent_state(qwen35: ModelProfile) -> None:
    kv = kv_shape(qwen35)
    assert len(kv.recurrent_layers) == 45
    # per delta-net layer: conv rows 3 x (8192 + 2 x 16 x 128) and a 128 x 8192 state, F32
    per_layer = (3 * (8192 + 2 * 16 * 128) + 128 * 8192) * 4
    assert checkpoint_bytes(kv, EngineKind.MAINLINE) == 28 + 24 * 45 + 45 * per_layer
    assert checkpoint_bytes(kv, EngineKind.MAINLINE) / MIB == pytest.approx(186.33, abs=0.01)
    # ik_llama.cpp also lists every cached cell's position: a slot filled to 65,536 tokens
    ik = checkpoint_bytes(kv, EngineKind.IK, tokens_per_slot=65536)
    assert ik - kv.rs_bytes_per_seq == 16 + 8 * 65536 + 40 * 60


@pytest.mark.parametrize(("slots", "n", "want_n"), [(1, None, 32), (4, None, 32), (2, 8, 8), (2, 0, 0)])
def test_ledger_counts_every_slots_checkpoints_on_the_host(
    qwen35: ModelProfile, slots: int, n: int | None, want_n: int
) -> None:
    s = Settings(ctx=65536 * slots, slots=slots, ctx_checkpoints=n)
    sp = make_plan([ServiceSpec(name="q", model=qwen35, settings=s, strategy="cpu-moe")], load("rtx-pro-6000x2")).main
    items = [i for its in sp.memory.items.values() for i in its if i.what == "checkpoints"]
    if not want_n:
        assert not items
        return
    (item,) = items
    assert item in sp.memory.items["CPU"]  # host RAM, never a GPU's
    assert item.mib == pytest.approx(slots * want_n * 186.33, rel=1e-4)
    assert "not at load" in item.note and f"up to {want_n}" in item.note


def test_which_models_and_engines_keep_checkpoints(small: dict[str, ModelProfile]) -> None:
    def each(arch: str, **kw: object) -> float:
        s = Settings(**kw)  # type: ignore[arg-type]
        it = checkpoints_item(kv_shape(small[arch], s.engine), s)
        return it.mib / s.slots / s.checkpoints_per_slot if it else 0.0

    assert each("qwen35moe") == pytest.approx(1.035, abs=5e-4)  # the real server: 1.035 MiB
    assert each("qwen35moe", engine=EngineKind.IK) > each("qwen35moe")
    # gpt-oss: the windowed layers' K and V of the 128 cells in the window (the real server: 0.127 MiB)
    assert each("gpt-oss") == pytest.approx(0.1266, abs=5e-4)
    assert each("gpt-oss", swa_full=True) == 0.0  # nothing to roll back with the whole context cached
    assert each("gpt-oss", engine=EngineKind.IK) == 0.0  # ik 0.1.5: recurrent models only
    assert each("qwen3moe") == 0.0 and each("deepseek2") == 0.0  # a plain cache rolls back by itself


# ik_llama.cpp 0.1.5 serving the small qwen35moe above (ssm_dt_rank 8), one slot, a 4,004-token prompt
IK_LINES = """\
slot create_check: id  0 | task 1 | created context checkpoint 1 of 32 (pos_min = 2047, pos_max = 2047, size = 1.051 MiB, took 1.06 ms)
slot create_check: id  0 | task 1 | created context checkpoint 2 of 32 (pos_min = 3998, pos_max = 3998, size = 1.066 MiB, took 1.13 ms)
slot create_check: id  0 | task 1 | created context checkpoint 3 of 32 (pos_min = 4004, pos_max = 4004, size = 1.066 MiB, took 1.24 ms)
"""


def test_ik_checkpoint_size_against_its_log(small: dict[str, ModelProfile]) -> None:
    log = parse_log(IK_LINES, era="legacy")
    assert [c.index for c in log.checkpoints_created] == [1, 2, 3]
    kv = kv_shape(small["qwen35moe"], EngineKind.IK)
    for c in log.checkpoints_created:
        want = checkpoint_bytes(kv, EngineKind.IK, tokens_per_slot=c.pos_max + 1) / MIB
        assert c.size_mib == pytest.approx(want, rel=0.01)
        assert c.size_mib == pytest.approx(want, abs=6e-4)  # the log's rounding: the cells' positions counted


def test_plan_renders_and_documents_ctx_checkpoints(small: dict[str, ModelProfile], tmp_path: Path) -> None:
    hw = tmp_path / "hw.json"
    hw.write_text(json.dumps(loopback_hw([])))
    for engine in ("llama.cpp", "ik_llama.cpp"):
        r = run_cli(
            "plan",
            str(small["qwen35moe"].files[0]),
            "--hw",
            str(hw),
            "--engine",
            engine,
            "--ctx-checkpoints",
            "6",
            "--parallel",
            "2",
            "--ctx",
            "8192",
            "--json",
        )
        assert r.exit_code == 0, r.stderr
        doc = json.loads(r.stdout)
        argv = doc["argv"]
        assert argv[argv.index("--ctx-checkpoints") + 1] == "6"
        cpu = next(d for d in doc["devices"] if d["name"] == "CPU")
        item = next(i for i in cpu["items"] if i["what"] == "checkpoints")
        assert "2 slot(s) x up to 6" in item["note"]
    r = run_cli(
        "plan", str(small["qwen35moe"].files[0]), "--hw", str(hw), "--engine-arg=--ctx-checkpoints", "--engine-arg=4"
    )
    assert r.exit_code == 2 and "--ctx-checkpoints N" in r.stderr
    r = run_cli("plan", str(small["qwen35moe"].files[0]), "--hw", str(hw), "--ctx-checkpoints", "-1")
    assert r.exit_code == 2


@pytest.mark.parametrize("kind", ["llama.cpp", "ik_llama.cpp"])
def test_both_engines_parse_the_rendered_flag(kind: str) -> None:
    from moetune.engine.install import IK, MAINLINE

    b = engine_bin_dir(IK if kind == "ik_llama.cpp" else MAINLINE)
    if b is None:
        pytest.skip(f"{kind} is not built")
    ok = subprocess.run(
        [str(b / "llama-server"), "--ctx-checkpoints", "6", "--version"], capture_output=True, timeout=60
    )
    assert ok.returncode == 0, ok.stderr[-500:]


def test_cpu_only_hardware_file_has_the_item(small: dict[str, ModelProfile]) -> None:
    sp = make_plan(
        [ServiceSpec(name="t", model=small["qwen35moe"], settings=Settings(), strategy="cpu-moe")],
        from_dict(loopback_hw([])),
    ).main
    assert any(i.what == "checkpoints" for i in sp.memory.items["CPU"])


def test_a_layout_service_sets_its_own_checkpoints(small: dict[str, ModelProfile], tmp_path: Path) -> None:
    hw = tmp_path / "hw.json"
    hw.write_text(json.dumps(loopback_hw([])))
    layout = tmp_path / "layout.yaml"
    layout.write_text(
        f"services:\n  - {{name: a, model: {small['qwen35moe'].files[0]}, ctx_checkpoints: 3}}\n"
        f"  - {{name: b, model: {small['qwen35moe'].files[0]}}}\n"
    )
    r = run_cli("plan", "--layout", str(layout), "--hw", str(hw), "--ctx-checkpoints", "5", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    said = {sj["name"]: sj["argv"][sj["argv"].index("--ctx-checkpoints") + 1] for sj in doc["services"]}
    assert said == {"a": "3", "b": "5"}
