"""`tune --max-kld X`: a winner that changes the numerics is checked before it is returned.

A candidate changes the numerics relative to the baseline when its cache types, its engine or its
model file differ (placement, threads, ubatch and repacking move the same arithmetic elsewhere).
When the search's best is such a candidate, `moetune quality` measures its KL divergence from the
baseline on moetune's evaluation text (at most 16 chunks of 256 tokens; the baseline's logits saved
once); a mean KLD above ``X``
rejects it, and the best is chosen again from the rest by the same rule (its verdict says why it
lost), until the best is the baseline, changes nothing, or passed. So a candidate above the limit
is never returned. Where the engine defaults beat the best (``TuneResult.defaults_win``) nothing is
checked: they are the recommendation, the model's own numerics with the engine's f16 cache.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from moetune.store.db import ResultsDB
from moetune.tune.loop import Entry, TuneResult, pp_rejections
from moetune.tune.verdict import verdicts


def _engine_and_model(e: Entry) -> tuple[Any, Any]:
    sj = (e.doc.get("services") or [{}])[0]
    return sj.get("engine"), sj.get("model")


def changes_numerics(base: Entry, other: Entry) -> bool:
    b, o = base.candidate, other.candidate
    return (b.ctk, b.ctv) != (o.ctk, o.ctv) or _engine_and_model(base) != _engine_and_model(other)


def guard(
    db: ResultsDB,
    result: TuneResult,
    max_kld: float,
    *,
    status: Callable[[str], None],
    ctx: int = 256,
    chunks: int = 16,
) -> tuple[TuneResult, dict[int, dict[str, object]]]:
    """``result`` with a best whose KLD from the baseline is at most ``max_kld``; and the quality
    measured, by candidate index (``moetune.quality.kld.Candidate.to_json()``)."""
    from moetune.bench.target import plan_target
    from moetune.quality.kld import EvalOptions, eval_text, evaluate

    checked: dict[int, dict[str, object]] = {}
    kld_mean: dict[int, float] = {}
    rejected: set[int] = set()
    while result.best not in (None, 0) and result.defaults_win is None:
        best = result.best
        assert best is not None
        if not changes_numerics(result.entries[0], result.entries[best]) or best in checked:
            break
        status(f"--max-kld: checking {result.entries[best].candidate.label} against the baseline")
        _, (cand,) = evaluate(
            db,
            plan_target(result.plan_path(0)),
            [plan_target(result.plan_path(best))],
            EvalOptions(text=eval_text(), ctx=ctx, chunks=chunks),
            status=status,
        )
        checked[best] = cand.to_json()
        kld_mean[best] = cand.kld.mean
        if cand.kld.mean <= max_kld:
            break
        rejected.add(best)
        # the PP rejections (--max-pp-loss) stand: a candidate they keep from winning stays out
        pp_out = pp_rejections(result.objective, result.max_pp_loss, result.rates, result.defaults_rates)
        judged, new_best = verdicts(
            result.entries,
            {i: v for i, v in result.values.items() if i not in rejected},
            None,
            pp_out,
            as_time=result.work is not None,
        )
        for i in rejected:
            judged[i] = f"rejected: KLD {kld_mean[i]:.6f} above --max-kld {max_kld:g}"
        if new_best is not None and new_best != 0:
            judged[new_best] = judged[new_best] if judged[new_best].startswith("best") else f"best, {judged[new_best]}"
        status(f"--max-kld: {result.entries[best].candidate.label} rejected (KLD {cand.kld.mean:.6f})")
        result = replace(result, best=new_best, verdicts=judged)
    return result, checked
