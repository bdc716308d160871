"""A tune's verdicts: the best is a measured candidate, never a baseline that failed."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from moetune.plan.plan import Plan
from moetune.tune.verdict import verdicts


@dataclass
class _Entry:  # what verdicts read of a candidate; `plan` only for one that does not fit (none here)
    failed: str | None = None
    fits: bool = True
    plan: Plan | None = None


FAST, SLOW = [20.0, 20.2, 19.9, 20.1], [10.0, 10.1, 9.9, 10.05]


@pytest.mark.parametrize(
    ("entries", "values", "best", "verdict0"),
    [
        ([_Entry("out of memory"), _Entry()], {}, None, "failed: out of memory"),  # nothing measured
        ([_Entry("out of memory")], {}, None, "failed: out of memory"),
        ([_Entry("out of memory"), _Entry(), _Entry()], {2: SLOW}, 2, "failed: out of memory"),
        ([_Entry("out of memory"), _Entry(), _Entry()], {1: SLOW, 2: FAST}, 2, "failed: out of memory"),
        ([_Entry(), _Entry()], {0: FAST, 1: SLOW}, 0, "baseline, best (nothing beat it)"),
        ([_Entry(), _Entry()], {0: SLOW, 1: FAST}, 1, "baseline"),
        ([_Entry(), _Entry()], {}, None, "not launched"),
    ],
)
def test_the_best_is_measured(
    entries: list[_Entry], values: dict[int, list[float]], best: int | None, verdict0: str
) -> None:
    out, got = verdicts(entries, values, None)  # type: ignore[arg-type]
    assert got == best and out[0] == verdict0
    if best:
        assert out[best].startswith("best, ")


def test_a_rejected_candidate_cannot_win_and_says_why() -> None:
    from moetune.tune.defaults import pp_rejections

    why = pp_rejections({1: 80.0, 2: 95.0}, {"baseline": 100.0, "engine defaults": 90.0}, 0.10)
    assert list(why) == [1] and why[1] == "rejected: PP 80 tok/s is 20% below the baseline's 100 (--max-pp-loss 10%)"
    entries = [_Entry(), _Entry(), _Entry()]
    out, best = verdicts(entries, {0: SLOW, 1: FAST, 2: SLOW}, None, why)  # type: ignore[arg-type]
    assert best == 0 and out[1].startswith("rejected: PP 80") and "faster" in out[1]
    out, best = verdicts(entries, {0: SLOW, 1: FAST, 2: [v * 1.5 for v in SLOW]}, None, why)  # type: ignore[arg-type]
    assert best == 2
