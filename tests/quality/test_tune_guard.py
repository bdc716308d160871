"""`tune --max-kld`: a best with another cache type is checked and never returned above the limit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.engine_harness import free_port
from tests.helpers import run_cli
from tests.tune_testbed import WORKLOAD, make_testbed

pytestmark = pytest.mark.server


def test_max_kld_never_returns_a_candidate_above_the_limit(
    bin_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import moetune.tune.loop as loop
    from moetune.tune.verdict import verdicts

    def q8_wins(entries: Any, values: Any, expect: Any, rejected: Any = None, **kw: Any) -> Any:  # the pick: q8_0
        judged, best = verdicts(entries, values, expect, rejected, **kw)
        q8 = next((i for i, e in enumerate(entries) if e.candidate.ctk == "q8_0" and values.get(i)), best)
        return judged, q8

    import moetune.tune.report as report

    seen: list[Any] = []
    real_json = report.result_json

    def keep(result: Any, kld: Any = None) -> Any:  # the result, to render the table the text output prints
        seen.append((result, kld))
        return real_json(result, kld)

    monkeypatch.setattr(report, "result_json", keep)
    monkeypatch.setattr(loop, "verdicts", q8_wins)
    monkeypatch.setattr(loop.core, "choose", lambda belief, best, open_, noise, gains: (open_[0], 1.0))
    # the guard is the question: the engine defaults (both cores) would beat these one-thread
    # candidates and be the recommendation, with nothing to check
    monkeypatch.setattr(loop.TuneResult, "defaults_win", property(lambda self: None))
    model, hw = make_testbed(tmp_path)
    r = run_cli(
        "tune",
        str(model),
        "--hw",
        str(hw),
        "--strategy",
        "cpu-moe",
        "-t",
        "1",
        "-ub",
        "128",
        "--try-strategy",
        "cpu-moe",
        "--try-threads",
        "1",
        "--try-ubatch",
        "128",
        "--try-fa",
        "on",
        "--try-cache",
        "f16/f16,q8_0/q8_0",
        "--try-repack",
        "off",
        *WORKLOAD,
        "--port",
        str(free_port()),
        "--budget",
        "2",
        "--max-kld",
        "0",
        "--db",
        str(tmp_path / "t.db"),
        "--json",
    )
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    by = {c["label"]: c for c in doc["candidates"]}
    q8 = next(label for label in by if "q8_0" in label)
    checked = doc["quality_guard"]["checked"]
    assert doc["quality_guard"]["max_kld"] == 0
    assert "--max-kld: checking" in r.stderr
    assert checked[q8]["kld"]["mean"] > 0 and checked[q8]["verdict"] in ("same", "close", "worse")
    assert by[q8]["verdict"].startswith("rejected: KLD") and doc["best"]["label"] != q8
    # the candidates carry the KLD measured, and the table has its column
    assert by[q8]["kld"] == checked[q8]["kld"]["mean"]
    assert all(c["kld"] is None for label, c in by.items() if label != q8)
    from rich.console import Console

    from moetune.tune.report import result_table

    console = Console(width=400, record=True)
    console.print(result_table(*seen[-1]))
    text = console.export_text()
    assert "KLD" in text and f"{checked[q8]['kld']['mean']:.6f}" in text and "baseline" in text
