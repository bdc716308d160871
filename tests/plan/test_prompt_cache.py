"""Mainline's prompt cache (``--cache-ram``) in the ledger: the engine's 8 GiB where the host has it
left, else what is left (rendered), the user's value as given, none for ik_llama.cpp."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from moetune.hardware.inventory import from_dict
from moetune.kinds import EngineKind
from moetune.model.archs import small_dims
from moetune.model.profile import ModelProfile, load_profile
from moetune.model.testmodel import generate
from moetune.plan.ledger import prompt_cache
from moetune.plan.plan import ServiceSpec, make_plan
from moetune.plan.settings import ENGINE_CACHE_RAM_MIB, Settings
from tests.engine_harness import loopback_hw
from tests.helpers import engine_bin_dir, run_cli


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> ModelProfile:
    d = tmp_path_factory.mktemp("pc")
    return load_profile(generate(d / "m.gguf", "qwen3moe", small_dims("qwen3moe"), "f16").files[0])


def cpu_items(plan_ram_mib: float, m: ModelProfile, s: Settings) -> tuple[dict[str, float], Settings, bool]:
    p = make_plan(
        [ServiceSpec(name="main", model=m, settings=s, strategy="cpu-moe")],
        from_dict(loopback_hw([], cpu_ram_mib=plan_ram_mib)),
    )
    cpu = next(led for led in p.ledgers if led.device == "CPU")
    items: dict[str, float] = {}
    for it in cpu.items:
        items[it.what] = items.get(it.what, 0.0) + it.mib
    return items, p.main.spec.settings, p.fits


def test_the_engines_default_where_the_host_has_it(model: ModelProfile) -> None:
    items, s, fits = cpu_items(24000, model, Settings())
    assert items["prompt cache"] == ENGINE_CACHE_RAM_MIB and s.cache_ram_mib is None and fits


def test_a_tight_host_gets_what_is_left_and_the_command_says_it(model: ModelProfile) -> None:
    items, s, fits = cpu_items(4000, model, Settings())
    used = sum(v for k, v in items.items() if k != "prompt cache")
    assert fits and s.cache_ram_mib == int(4000 - used) == int(items["prompt cache"])
    r = prompt_cache(Settings(), kv_mib=1.0, room_mib=-5.0)
    assert r.item is None and r.cache_ram_mib == 0  # nothing left: no prompt cache rather than no RAM


def test_the_users_value_is_counted_as_given_and_can_not_fit(model: ModelProfile) -> None:
    items, s, fits = cpu_items(4000, model, Settings(cache_ram_mib=20000))
    assert items["prompt cache"] == 20000 and s.cache_ram_mib == 20000 and not fits
    items, s, _ = cpu_items(24000, model, Settings(cache_ram_mib=0))
    assert "prompt cache" not in items and s.cache_ram_mib == 0
    items, _, _ = cpu_items(24000, model, Settings(cache_ram_mib=-1, ctx=2048))
    assert items["prompt cache"] == pytest.approx(items["kv"])  # no limit: up to the context's tokens


def test_ik_keeps_none(model: ModelProfile) -> None:
    items, s, _ = cpu_items(24000, model, Settings(engine=EngineKind.IK))
    assert "prompt cache" not in items and s.cache_ram_mib is None


def test_plan_renders_it_and_refuses_it_for_ik(model: ModelProfile, tmp_path: Path) -> None:
    hw = tmp_path / "hw.json"
    hw.write_text(json.dumps(loopback_hw([], cpu_ram_mib=4000)))
    r = run_cli("plan", str(model.files[0]), "--hw", str(hw), "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    cpu = next(d for d in doc["devices"] if d["name"] == "CPU")
    item = next(i for i in cpu["items"] if i["what"] == "prompt cache")
    argv = doc["argv"]
    assert argv[argv.index("--cache-ram") + 1] == str(int(item["mib"])) and "host RAM left" in item["note"]
    r = run_cli("plan", str(model.files[0]), "--hw", str(hw), "--engine", "ik_llama.cpp", "--cache-ram", "100")
    assert r.exit_code == 2 and "keeps no prompt cache" in r.stderr
    r = run_cli("plan", str(model.files[0]), "--hw", str(hw), "--engine-arg=--cache-ram", "--engine-arg=100")
    assert r.exit_code == 2 and "--cache-ram MIB" in r.stderr
    r = run_cli("plan", str(model.files[0]), "--hw", str(hw), "--cache-ram", "-2")
    assert r.exit_code == 2


def test_mainline_parses_the_rendered_flag() -> None:
    from moetune.engine.install import MAINLINE

    b = engine_bin_dir(MAINLINE)
    if b is None:
        pytest.skip("llama.cpp is not built")
    ok = subprocess.run([str(b / "llama-server"), "--cache-ram", "100", "--version"], capture_output=True, timeout=60)
    assert ok.returncode == 0, ok.stderr[-500:]
