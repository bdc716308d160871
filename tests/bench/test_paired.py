"""Paired statistics and rounds, against a simulated machine that drifts: the cases an unpaired
comparison gets wrong, and the order of plans within rounds that cancels a steady drift."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest

from moetune.bench.analysis import paired as pd
from moetune.bench.analysis.paired import paired_difference, paired_from_ratios, t_quantile
from moetune.bench.analysis.rounds import (
    RoundTag,
    TaggedRun,
    complete_rounds,
    round_order,
    rounds_by_order,
    schedule,
)
from moetune.bench.analysis.stats import FASTER, SAME, SLOWER, difference
from moetune.bench.single.interleave import together_problems
from moetune.bench.single.sweep import SweepEntry
from moetune.bench.target import Target
from moetune.engine.launchspec import LaunchSpec, ProcessSpec
from moetune.errors import InputError
from moetune.kinds import ProcessRole


@pytest.mark.parametrize(
    ("conf", "df", "t"),
    [
        (0.95, 1, 12.706),
        (0.95, 2, 4.303),
        (0.95, 3, 3.182),
        (0.95, 4, 2.776),
        (0.95, 9, 2.262),
        (0.95, 30, 2.042),
        (0.99, 5, 4.032),
        (0.90, 7, 1.895),
        (0.95, 400, 1.966),
    ],
)
def test_t_quantile_matches_the_tables(conf: float, df: int, t: float) -> None:
    assert t_quantile(conf, df) == pytest.approx(t, abs=1.5e-3)


def test_t_quantile_refuses_nonsense() -> None:
    with pytest.raises(ValueError):
        t_quantile(0.95, 0)
    with pytest.raises(ValueError):
        t_quantile(1.0, 3)


def test_the_paired_ratio_is_the_geometric_mean_with_a_t_interval() -> None:
    d = paired_from_ratios([1.10, 1.20, 1.15], higher_is_better=True)
    logs = [math.log(x) for x in (1.10, 1.20, 1.15)]
    mean, sd = float(np.mean(logs)), float(np.std(logs, ddof=1))
    assert d.ratio == pytest.approx(math.exp(mean))
    assert d.ratio_ci_low == pytest.approx(math.exp(mean - 4.3027 * sd / math.sqrt(3)), rel=1e-4)
    assert d.ratio_ci_high == pytest.approx(math.exp(mean + 4.3027 * sd / math.sqrt(3)), rel=1e-4)
    assert d.rounds == 3 and d.verdict == FASTER and d.change_pct == pytest.approx(14.9, abs=0.1)
    assert paired_from_ratios([0.8, 0.82, 0.79], higher_is_better=True).verdict == SLOWER
    assert paired_from_ratios([0.8, 0.82, 0.79], higher_is_better=False).verdict == FASTER  # a latency fell


@pytest.mark.parametrize(
    ("ratios", "verdict", "noisy"),
    [
        ([1.5], SAME, True),  # one round: no spread to judge by
        ([1.01, 1.02, 1.015, 1.012], SAME, False),  # consistent but under the 3 % threshold
        ([1.30, 0.95, 1.25, 1.00], SAME, True),  # +11 % on average, rounds disagree
        ([1.0, 1.0, 1.0], SAME, False),
    ],
)
def test_verdicts_that_stay_same(ratios: list[float], verdict: str, noisy: bool) -> None:
    d = paired_from_ratios(ratios, higher_is_better=True)
    assert d.verdict == verdict and pd.noisy(d.verdict, d.ratio, 0.03) is noisy
    if len(ratios) == 1:
        assert (d.ratio_ci_low, d.ratio_ci_high) == (0.0, math.inf)


def test_bad_inputs() -> None:
    with pytest.raises(ValueError):
        paired_difference([], higher_is_better=True)
    with pytest.raises(ValueError):
        paired_from_ratios([1.0, 0.0], higher_is_better=True)
    with pytest.raises(ValueError):
        paired_difference([([0.0], [1.0])], higher_is_better=True)


# -- a simulated machine ---------------------------------------------------------------------------

Machine = Callable[[int], float]  # slot (one request's time) -> the machine's speed factor


def measure(
    order: Sequence[tuple[int, str]],
    speeds: dict[str, float],
    machine: Machine,
    repeats: int,
    noise: float = 0.01,
    seed: int = 1,
) -> dict[str, dict[int, list[float]]]:
    """Samples of each plan per round, taken in ``order``, ``repeats`` consecutive slots per run."""
    rng = np.random.default_rng(seed)
    out: dict[str, dict[int, list[float]]] = {lab: {} for lab in speeds}
    slot = 0
    for rnd, lab in order:
        xs = out[lab].setdefault(rnd, [])
        for _ in range(repeats):
            xs.append(speeds[lab] * machine(slot) * (1.0 + rng.normal(0.0, noise)))
            slot += 1
    return out


def pooled(runs: dict[int, list[float]]) -> list[float]:
    return [x for k in sorted(runs) for x in runs[k]]


def paired(samples: dict[str, dict[int, list[float]]], a: str = "A", b: str = "B") -> pd.PairedDifference:
    return paired_difference([(samples[a][k], samples[b][k]) for k in sorted(samples[a])], higher_is_better=True)


def sequential(labels: Sequence[str], rounds: int) -> list[tuple[int, str]]:
    """A plain sweep's order: every run of A, then every run of B."""
    return [(r, lab) for lab in labels for r in range(1, rounds + 1)]


def hog_from(slot: int, slowdown: float = 0.7) -> Machine:
    return lambda s: 1.0 if s < slot else slowdown


def test_a_cpu_hog_halfway_makes_a_plain_sweep_see_a_difference_that_pairing_does_not() -> None:
    """Two identical plans; another program takes 30 % of the machine from halfway on. All of A
    then all of B: the unpaired rule calls B slower. Interleaved, the paired rule calls them the same."""
    speeds = {"A": 100.0, "B": 100.0}
    rounds, repeats = 4, 3
    half = rounds * repeats  # the slot where B's runs begin in the plain sweep
    plain = measure(sequential("AB", rounds), speeds, hog_from(half), repeats)
    unpaired = difference(pooled(plain["A"]), pooled(plain["B"]), higher_is_better=True)
    assert unpaired.verdict == SLOWER and unpaired.change_pct < -25

    inter = measure(schedule("AB", rounds), speeds, hog_from(half), repeats)
    d = paired(inter)
    assert d.verdict == SAME and abs(d.change_pct) < 2
    assert [round(r, 2) for r in d.ratios] == pytest.approx([1.0] * rounds, abs=0.03)


def test_a_hog_that_starts_inside_a_round_makes_one_round_an_outlier_not_a_verdict() -> None:
    speeds = {"A": 100.0, "B": 100.0}
    repeats = 3
    inter = measure(schedule("AB", 4), speeds, hog_from(5 * repeats), repeats)  # between round 3's A... and B
    d = paired(inter)
    assert d.verdict == SAME
    assert sum(1 for r in d.ratios if abs(r - 1.0) > 0.1) == 1


def test_a_real_difference_that_drift_hides_from_the_unpaired_rule() -> None:
    """B is 6 % faster; the machine's speed wanders by ±20 % from round to round (heat, other
    load), the same for both plans within a round. With 4 rounds of 2 requests each the paired
    rule finds B faster; the unpaired rule, on the very same samples, cannot tell."""
    factors = [1.0, 0.8, 1.15, 0.85, 1.2, 0.9, 1.05, 0.75]
    speeds = {"A": 100.0, "B": 106.0}
    repeats, rounds = 2, 4
    per_round = 2 * repeats

    def machine(slot: int) -> float:
        return factors[slot // per_round]

    inter = measure(schedule("AB", rounds), speeds, machine, repeats)
    d = paired(inter)
    assert d.verdict == FASTER and 4 < d.change_pct < 8 and d.ratio_ci_low > 1.03
    unpaired = difference(pooled(inter["A"]), pooled(inter["B"]), higher_is_better=True)
    assert unpaired.verdict == SAME and unpaired.ratio_ci_low < 1.0 < unpaired.ratio_ci_high


def test_alternating_the_order_cancels_a_steady_drift_that_a_fixed_order_reads_as_a_difference() -> None:
    """The machine slows 1.5 % per request (heating up). A B, A B, ...: B always runs later, so
    every round says B is slower, and the paired rule believes it. A B, B A, ...: the bias flips
    sign every round and cancels."""
    speeds = {"A": 100.0, "B": 100.0}
    repeats, rounds = 3, 4

    def machine(slot: int) -> float:
        return 0.985**slot

    fixed = [(r, lab) for r in range(1, rounds + 1) for lab in "AB"]
    assert paired(measure(fixed, speeds, machine, repeats, noise=0.002)).verdict == SLOWER
    d = paired(measure(schedule("AB", rounds), speeds, machine, repeats, noise=0.002))
    assert d.verdict == SAME and abs(d.change_pct) < 1.0


# -- rounds ----------------------------------------------------------------------------------------


def test_round_order_alternates() -> None:
    assert round_order(["A", "B"], 1) == ["A", "B"] and round_order(["A", "B"], 2) == ["B", "A"]
    assert schedule(["A", "B", "C"], 2) == [(1, "A"), (1, "B"), (1, "C"), (2, "C"), (2, "B"), (2, "A")]


def tr(run: int, label: str, rnd: int, attempt: str, done: bool = True) -> TaggedRun:
    return TaggedRun(run=run, label=label, round=rnd, attempt=attempt, done=done)


@pytest.mark.parametrize(
    ("runs", "rounds"),
    [
        ([], {}),
        ([tr(1, "A", 1, "x"), tr(2, "B", 1, "x")], {1: {"A": 1, "B": 2}}),
        # round 2 interrupted at B, then run again whole: the second attempt is the round
        (
            [
                tr(1, "A", 1, "x"),
                tr(2, "B", 1, "x"),
                tr(3, "B", 2, "y"),
                tr(4, "A", 2, "y", done=False),
                tr(5, "B", 2, "z"),
                tr(6, "A", 2, "z"),
            ],
            {1: {"A": 1, "B": 2}, 2: {"A": 6, "B": 5}},
        ),
        # each plan done once, but in different attempts: not a round
        ([tr(1, "A", 1, "x"), tr(2, "B", 1, "x", done=False), tr(3, "A", 1, "y", done=False), tr(4, "B", 1, "y")], {}),
        # two complete attempts (a sweep run twice by hand with one --sweep-id): the newest
        ([tr(1, "A", 1, "x"), tr(2, "B", 1, "x"), tr(3, "A", 1, "y"), tr(4, "B", 1, "y")], {1: {"A": 3, "B": 4}}),
        # a plan no longer in the sweep is ignored
        ([tr(1, "A", 1, "x"), tr(2, "B", 1, "x"), tr(3, "C", 1, "x")], {1: {"A": 1, "B": 2}}),
    ],
)
def test_complete_rounds(runs: list[TaggedRun], rounds: dict[int, dict[str, int]]) -> None:
    assert complete_rounds(runs, ["A", "B"]) == rounds


def test_rounds_by_order_pairs_the_kth_runs() -> None:
    assert rounds_by_order([(7, "B"), (2, "A"), (5, "A"), (3, "B")], ["A", "B"]) == {
        1: {"A": 2, "B": 3},
        2: {"A": 5, "B": 7},
    }
    with pytest.raises(InputError, match="same number of runs"):
        rounds_by_order([(1, "A"), (2, "B"), (3, "A")], ["A", "B"])
    with pytest.raises(InputError, match="none of"):
        rounds_by_order([(1, "C")], ["A", "B"])


def test_round_tags_round_trip_through_details() -> None:
    tag = RoundTag(sweep="sw-1", round=3, attempt="ab12", mode="launches", position=1)
    assert RoundTag.from_details({"sweep": tag.to_json(), "workloads": []}) == tag
    assert RoundTag.from_details({"workloads": []}) is None


# -- batches: can the plans be up together? ----------------------------------------------------------


def entry(label: str, port: int, used: float | None, capacity: float = 1000.0, margin: float = 100.0) -> SweepEntry:
    spec = LaunchSpec(
        (ProcessSpec(name="main", role=ProcessRole.SERVER, engine="llama.cpp", argv=(), host="127.0.0.1", port=port),)
    )
    doc: dict[str, object] = {"launch": spec.to_json()}
    if used is not None:
        doc["devices"] = [
            {
                "name": "CUDA0",
                "capacity_mib": capacity,
                "used_mib": used + margin,
                "items": [{"what": "weights", "mib": used}, {"what": "margin", "mib": margin}],
            }
        ]
    return SweepEntry(label, Target(plan_path=Path(f"{label}.json"), spec=spec, doc=doc, server="main"))


@pytest.mark.parametrize(
    ("entries", "problem", "unchecked"),
    [
        ([entry("a", 1, 400), entry("b", 2, 400)], None, []),  # 400 + 400 + one margin of 100 fits in 1000
        ([entry("a", 1, 500), entry("b", 2, 450)], "CUDA0: 500 MiB (a) + 450 MiB (b) + 100 MiB margin = 1,050 MiB", []),
        ([entry("a", 1, 10), entry("b", 1, 10)], "a and b both listen on 127.0.0.1:1", []),
        ([entry("a", 1, None), entry("b", 2, 900)], None, ["a"]),
    ],
)
def test_plans_that_cannot_be_up_together(entries: list[SweepEntry], problem: str | None, unchecked: list[str]) -> None:
    problems, not_checked = together_problems(entries)
    assert [p[: len(problem)] for p in problems] == [problem] if problem else problems == []
    assert not_checked == unchecked
