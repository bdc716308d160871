"""Engine facts from a build's --help: the parse (on the real binaries' help texts, captured in
tests/fixtures/engines/), the dialect they shape, and ik_llama.cpp's --n-cpu-moe rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from moetune.engine.dialect import dialect, n_cpu_moe_note
from moetune.engine.facts import KNOWN, EngineFacts, NCpuMoeRule, n_cpu_moe_layers, parse_help, probe
from moetune.kinds import EngineKind

FIXTURES = Path(__file__).parent.parent / "fixtures" / "engines"


@pytest.mark.parametrize(
    ("kind", "stem", "rule"),
    [
        (EngineKind.MAINLINE, "mainline-b11434", NCpuMoeRule.FIRST),
        (EngineKind.IK, "ik-0.1.5", NCpuMoeRule.IK_SPLIT_TAIL),
    ],
)
def test_the_help_texts_of_the_real_builds(kind: EngineKind, stem: str, rule: NCpuMoeRule) -> None:
    """Captured from the builds `moetune engine install` makes: both say "the first N layers" (ik's
    multi-device sharing is in its loader, not its help); both list -fa with a value."""
    f = parse_help(kind, (FIXTURES / f"{stem}.help.txt").read_text(), (FIXTURES / f"{stem}.version.txt").read_text())
    assert f.n_cpu_moe == rule and f.flash_attn_takes_value
    assert f.version == KNOWN[kind].version
    if kind == EngineKind.IK:  # its help omits flags it accepts: why the probe tries each one
        assert "-fa" in f.help_flags and "-ot" not in f.help_flags and "-rtr" not in f.help_flags
        assert KNOWN[kind].has("-ot") and KNOWN[kind].has("-rtr")


@pytest.mark.server
@pytest.mark.parametrize("kind", list(EngineKind))
def test_known_facts_are_what_the_real_builds_answer(
    kind: EngineKind, bin_dir: Path, ik_bin_dir: Path, tmp_path: Path
) -> None:
    """KNOWN (what plans use where the engine is not built) is what the real build accepts."""
    d = bin_dir if kind == EngineKind.MAINLINE else ik_bin_dir
    f = probe(d / "llama-server", kind, tmp_path)
    assert (f.accepts, f.n_cpu_moe, f.version) == (KNOWN[kind].accepts, KNOWN[kind].n_cpu_moe, KNOWN[kind].version)
    assert probe(d / "llama-server", kind, tmp_path) == f  # the cached answer
    assert len(list(tmp_path.glob("facts-*.json"))) == 1


def test_an_older_ik_build_with_a_bare_fa() -> None:
    old = parse_help(
        EngineKind.IK,
        "  -fa,   --flash-attn             enable Flash Attention (default: disabled)\n"
        "  -mla,  --mla-use                enable MLA (default: 0)\n"
        "  -fmoe, --fused-moe              enable fused MoE (default: disabled)\n"
        "         --n-cpu-moe N            keep MoE weights of the last N layers\n",
    )
    assert not old.flash_attn_takes_value and old.n_cpu_moe == NCpuMoeRule.LAST
    d = dialect(EngineKind.IK, old)
    assert d.flash_attn_on == ("-fa",) and d.flash_attn_off == ()
    assert d.mla == "-mla" and d.amb is None and d.repack == () and d.merge_up_gate == ()  # only what it accepts
    assert (d.fused_moe_on, d.fused_moe_off) == (("-fmoe",), ())  # fused MoE was opt-in then


def test_the_dialect_follows_what_the_build_accepts() -> None:
    f = EngineFacts(
        kind=EngineKind.MAINLINE,
        version="version: 1",
        accepts=frozenset({"-fa on", "--no-mmap"}),
        n_cpu_moe=NCpuMoeRule.FIRST,
    )
    d = dialect(EngineKind.MAINLINE, f)
    assert (d.fit_off, d.no_repack, d.no_mmap, d.kv_unified) == ((), (), ("--no-mmap",), ())
    k = dialect(EngineKind.MAINLINE)
    assert (k.fit_off, k.no_repack, k.no_mmap) == (("-fit", "off"), ("-nr",), ("-lm", "none"))
    ik = dialect(EngineKind.IK)
    assert (ik.flash_attn_on, ik.flash_attn_off, ik.repack, ik.no_mmap, ik.fit_off) == (
        ("-fa", "on"),
        ("-fa", "off"),
        ("-rtr",),
        ("--no-mmap",),
        (),
    )


# (rule, n, layer devices, layers on the CPU): ik 0.1.5 shares N among two or more devices in
# proportion to their layer counts, rounding each share (halves up), then fixing the total one
# layer at a time, and takes each share from the end of the device's range
CASES = [
    (NCpuMoeRule.FIRST, 3, ["A"] * 4 + ["B"] * 4, [0, 1, 2]),
    (NCpuMoeRule.LAST, 3, ["A"] * 8, [5, 6, 7]),
    (NCpuMoeRule.IK_SPLIT_TAIL, 3, ["A"] * 8, [0, 1, 2]),  # one device: the first N
    (NCpuMoeRule.IK_SPLIT_TAIL, 3, ["A"] * 4 + ["B"] * 4, [3, 6, 7]),  # 1.5 + 1.5 -> 2 + 2 -> 1 + 2
    (NCpuMoeRule.IK_SPLIT_TAIL, 5, ["A"] * 3 + ["B"] * 6, [1, 2, 6, 7, 8]),  # 1.67 + 3.33 -> 2 + 3
    (NCpuMoeRule.IK_SPLIT_TAIL, 2, ["A"] * 2 + ["B"] * 3 + ["C"] * 3, [4, 7]),  # 0.5 + 0.75 + 0.75 -> 1+1+1 -> 0+1+1
    (NCpuMoeRule.IK_SPLIT_TAIL, 8, ["A"] * 4 + ["B"] * 4, list(range(8))),  # N >= n_layer: all
    (NCpuMoeRule.IK_SPLIT_TAIL, 0, ["A"] * 4 + ["B"] * 4, []),
]


@pytest.mark.parametrize(("rule", "n", "devs", "want"), CASES)
def test_n_cpu_moe_layers(rule: NCpuMoeRule, n: int, devs: list[str], want: list[int]) -> None:
    assert n_cpu_moe_layers(rule, n, len(devs), devs) == want


def test_the_note_names_the_layers_in_ranges() -> None:
    d = dialect(EngineKind.IK)
    assert (
        n_cpu_moe_note(d, 3, 8, ["A"] * 4 + ["B"] * 4)
        == "ik_llama.cpp: --n-cpu-moe 3 keeps the experts of layers 3, 6-7 on the CPU"
    )
