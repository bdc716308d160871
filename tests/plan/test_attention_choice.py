"""`plan` picks flash attention and the cache type the speed model predicts faster at the plan's
context, within memory; what the user gives wins; the plan says why in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moetune.hardware.inventory import Inventory, load
from moetune.model.profile import ModelProfile, load_profile
from moetune.plan.attention import MIN_GAIN, Choose, decision_depth, pick, variants
from moetune.plan.plan import ServiceSpec, make_plan
from moetune.plan.settings import Settings
from tests.helpers import run_cli


@pytest.fixture(scope="module")
def bed(axes_bed: tuple[Path, Path]) -> tuple[Path, Path]:
    return axes_bed


def planned(bed: tuple[Path, Path], s: Settings, choose: Choose) -> tuple[Settings, str | None]:
    p: ModelProfile = load_profile(bed[0])
    hw: Inventory = load(bed[1])
    sp = make_plan([ServiceSpec(name="main", model=p, settings=s, strategy="auto", choose=choose)], hw).main
    return sp.spec.settings, sp.attention_note


def test_variants_keep_to_what_the_engine_accepts_default_first() -> None:
    vs = variants(Settings(), Choose(True, True))
    assert vs[0] == Settings()
    assert {(v.flash_attn, v.ctk, v.ctv) for v in vs} == {
        (True, "f16", "f16"),
        (True, "q8_0", "q8_0"),
        (False, "f16", "f16"),
    }  # no quantized V without FA
    assert [v.flash_attn for v in variants(Settings(ctk="q4_0", ctv="q4_0"), Choose(True, False))] == [True]
    assert decision_depth(Settings(ctx=8192, slots=2)) == 2048


def test_pick_keeps_the_default_without_a_real_gain_and_skips_what_does_not_fit() -> None:
    a, b, c = Settings(), Settings(flash_attn=False), Settings(ctk="q8_0", ctv="q8_0")
    assert pick([(a, 100.0, True), (b, 100.0 * (1 + MIN_GAIN / 2), True)], 512).settings == a
    ch = pick([(a, 100.0, True), (b, 130.0, True), (c, 150.0, False)], 512)
    assert ch.settings == b and ch.rejected_for_memory == 1 and "do not fit" in ch.note()
    assert pick([(a, 100.0, False), (b, 90.0, True)], 512).settings == b  # the default does not fit


def test_on_the_cpu_at_depth_the_plan_leaves_the_f16_cache_default(bed: tuple[Path, Path]) -> None:
    s, note = planned(bed, Settings(ctx=4096), Choose(True, True))
    assert (s.flash_attn, s.ctk, s.ctv) == (True, "q8_0", "q8_0")  # the testbed: 510 against 354 at depth 512
    assert note is not None and "depth 2048" in note and "q8_0/q8_0" in note
    s, note = planned(bed, Settings(ctx=4096), Choose(True, False))  # --ctk f16 given: FA off is faster
    assert (s.flash_attn, s.ctk) == (False, "f16") and note is not None


def test_what_the_user_gives_wins(bed: tuple[Path, Path]) -> None:
    s, note = planned(bed, Settings(ctx=4096, flash_attn=True), Choose(False, False))
    assert (s.flash_attn, s.ctk, s.ctv, note) == (True, "f16", "f16", None)


def test_plan_prints_why_and_renders_the_choice(bed: tuple[Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    r = run_cli("plan", str(bed[0]), "--hw", str(bed[1]), "-o", str(out))
    assert r.exit_code == 0, r.stderr
    assert "note: flash attention on, q8_0/q8_0 cache: predicted TG" in r.stdout
    argv = json.loads(out.read_text())["services"][0]["argv"]
    assert argv[argv.index("-ctk") + 1] == "q8_0" and argv[argv.index("-fa") + 1] == "on"
    r = run_cli("plan", str(bed[0]), "--hw", str(bed[1]), "--flash-attn", "on", "--ctk", "f16", "-o", str(out))
    assert r.exit_code == 0 and "note: flash attention" not in r.stdout
    r = run_cli("plan", str(bed[0]), "--hw", str(bed[1]), "--flash-attn", "on", "--no-flash-attn")
    assert r.exit_code == 2 and "contradict" in r.stderr
