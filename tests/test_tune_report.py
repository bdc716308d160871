"""The shapes of `moetune tune --json` (tune/report.py's records, each written by its to_json), pinned
key by key, and the lines the text output prints from the document. Nothing is launched: the
candidates are planned on tests/tune_testbed.py's model, the measurements are made up."""

from __future__ import annotations

from pathlib import Path

from moetune.bench.single.runner import BenchOptions
from moetune.bench.single.workloads import expand
from moetune.plan.settings import Settings
from moetune.tune import defaults as dflt
from moetune.tune.loop import TuneRequest, TuneResult, candidates
from moetune.tune.report import (
    Ci,
    DefaultsRow,
    GoodputFigures,
    Measured,
    ServeFigures,
    WorkFigures,
    confirm_lines,
    defaults_lines,
    result_json,
    result_table,
    work_lines,
)
from tests.tune_testbed import make_testbed

CI = Ci(median=10.0, ci_low=9.0, ci_high=11.0)
CI_JSON = {"median": 10.0, "ci_low": 9.0, "ci_high": 11.0}
WORK = WorkFigures(
    median_s=2.0,
    ci_low_s=1.5,
    ci_high_s=2.5,
    n=3,
    seconds=(1.5, 2.0, 2.5),
    failed=0,
    requests=6,
    ok=6,
    prompt_tokens_processed=100,
    prompt_tokens_reused=300,
    reused_share=0.75,
)
WORK_JSON = {
    "median_s": 2.0,
    "ci_low_s": 1.5,
    "ci_high_s": 2.5,
    "n": 3,
    "seconds": [1.5, 2.0, 2.5],
    "failed": 0,
    "requests": 6,
    "ok": 6,
    "prompt_tokens_processed": 100,
    "prompt_tokens_reused": 300,
    "reused_share": 0.75,
}


def test_a_single_stream_measurement() -> None:
    m = Measured(run=7, tg_tok_s=CI, pp_tok_s=None)
    assert m.to_json() == {"tg_tok_s": CI_JSON, "pp_tok_s": None, "goodput_req_s": None, "run": 7}


def test_a_measurement_under_load_has_the_figures_alone_beside() -> None:
    m = Measured(run=7, tg_tok_s=CI, pp_tok_s=CI, alone=(CI, None))
    doc = m.to_json()
    assert list(doc) == ["tg_tok_s", "pp_tok_s", "goodput_req_s", "alone", "run"]
    assert doc["alone"] == {"tg_tok_s": CI_JSON, "pp_tok_s": None}
    assert list(Measured(run=7, alone=(None, None), weighted=(None,)).to_json())[-2:] == ["run", "weighted"]


def test_a_workload_measurement_is_under_the_objectives_name() -> None:
    doc = Measured(run=3, work=("replay", WORK)).to_json()
    assert doc == {"tg_tok_s": None, "pp_tok_s": None, "goodput_req_s": None, "replay": WORK_JSON, "run": 3}
    assert list(doc) == ["tg_tok_s", "pp_tok_s", "goodput_req_s", "replay", "run"]
    assert WorkFigures.from_json(WORK_JSON) == WORK  # the one reader reads what the writer wrote


def test_a_goodput_measurement() -> None:
    g = GoodputFigures(ci=CI, n=5, level_req_s=1.5, share=0.8, met=8, of=10)
    sv = ServeFigures(
        request_s=2.0, output_tok_s=50.0, ttft_ms_p50=120.0, itl_ms_p50=20.0, tpot_ms_p50=21.0, ok=10, requests=10
    )
    doc = Measured(run=4, goodput_req_s=g, serve=sv).to_json()
    assert list(doc) == ["tg_tok_s", "pp_tok_s", "goodput_req_s", "serve", "run"]
    assert doc["goodput_req_s"] == {**CI_JSON, "n": 5, "level_req_s": 1.5, "share": 0.8, "met": 8, "of": 10}
    assert doc["serve"] == {
        "request_s": 2.0,
        "output_tok_s": 50.0,
        "ttft_ms_p50": 120.0,
        "itl_ms_p50": 20.0,
        "tpot_ms_p50": 21.0,
        "ok": 10,
        "requests": 10,
    }


def test_the_engine_defaults_row() -> None:
    d = DefaultsRow(argv=["llama-server", "-m", "m.gguf"], run=2, failed=None, tg_tok_s=CI)
    assert d.to_json() == {
        "label": dflt.LABEL,
        "argv": ["llama-server", "-m", "m.gguf"],
        "run": 2,
        "failed": None,
        "tg_tok_s": CI_JSON,
        "pp_tok_s": None,
        "best_vs_defaults": None,
    }
    w = DefaultsRow(argv=["x"], run=None, failed="boom", work=("turn", None)).to_json()
    assert list(w) == ["label", "argv", "run", "failed", "tg_tok_s", "pp_tok_s", "turn", "best_vs_defaults"]


def test_the_lines_printed_from_the_document() -> None:
    vs = {"tg": {"ratio": 1.2, "verdict": "better", "text": "+20% vs baseline"}, "pp": None}
    doc: dict[str, object] = {
        "objective": "replay",
        "work": {"text": "replay of s.jsonl"},
        "baseline": {"label": "base", "replay": WORK_JSON},
        "best": {"label": "fast", "replay": None},
        "engine_defaults": {"label": dflt.LABEL, "argv": ["llama-server", "-m", "m"], "failed": None, "replay": None}
        | {"best_vs_defaults": vs},
    }
    assert defaults_lines(doc) == [
        "engine defaults: llama-server -m m",
        "  best vs engine defaults, TG: +20% vs engine defaults",
    ]
    assert work_lines(doc) == [
        "replay total (replay of s.jsonl):",
        "  baseline (base): 2 s [1.5-2.5] over 3 passes; prompt tokens processed 100, reused 300 from the cache",
        f"  {dflt.LABEL}: not measured",
        "  best (fast): not measured",
    ]
    assert work_lines({"objective": "tg", "work": None}) == [] and defaults_lines({}) == []


def test_the_document_of_a_search(tmp_path: Path) -> None:
    model, hw = make_testbed(tmp_path, rpc_devices=2, rpc_mem_mib=70)
    (w,) = expand([], [], depths=[0], pp_tokens=64, tg_tokens=16)
    small = {"threads": (1,), "ubatches": (512,), "flash_attn": (True,), "cache_types": (("f16", "f16"),)}
    req = TuneRequest(
        hw=str(hw), model=str(model), base=Settings(threads=1), workload=w, options=BenchOptions(), axes=small
    )
    entries, k = candidates(req, lambda s: None)
    entries[0].run = 1
    defaults = dflt.Defaults({"argv": ["llama-server", "-m", "m"]}, run=None, failed="out of memory\nmore")
    r = TuneResult(
        tune_id="tu-x",
        objective="tg",
        entries=entries,
        baseline=0,
        best=0,
        launches=1,
        stopped="budget spent",
        constants=k,
        values={},
        summaries={},
        verdicts={0: "baseline"},
        plan_dir=tmp_path,
        workload=w,
        defaults=defaults,
    )
    doc = result_json(r, {0: 0.5})
    assert list(doc) == [
        "tune",
        "objective",
        "launches",
        "stopped",
        "workload",
        "work",
        "serve",
        "baseline",
        "best",
        "best_candidate",
        "defaults_win",
        "confirmed",
        "candidates",
        "engine_defaults",
        "max_pp_loss",
        "constants",
        "with_load",
        "weighted",
    ]
    assert doc["defaults_win"] is None  # they failed
    assert (
        doc["baseline"]
        == doc["best"]
        == doc["best_candidate"]
        == {
            "label": entries[0].candidate.label,
            "tg_tok_s": None,
            "pp_tok_s": None,
            "goodput_req_s": None,
            "run": 1,
        }
    )
    first = doc["candidates"][0]  # type: ignore[index]
    assert list(first) == ["label", "launched", "fits", "predicted", "measured", "verdict", "kld"]
    assert (first["launched"], first["measured"], first["verdict"], first["kld"]) == (True, None, "baseline", 0.5)
    assert list(first["predicted"]) == ["tg_tok_s", "pp_tok_s", "goodput_req_s"]
    assert first["predicted"]["goodput_req_s"] is None and first["predicted"]["tg_tok_s"] > 0
    assert doc["engine_defaults"] == {
        "label": dflt.LABEL,
        "argv": ["llama-server", "-m", "m"],
        "run": None,
        "failed": "out of memory\nmore",
        "tg_tok_s": None,
        "pp_tok_s": None,
        "best_vs_defaults": None,
    }
    from rich.console import Console

    console = Console(width=300, record=True)
    console.print(result_table(r, {0: 0.5}))
    text = console.export_text()
    assert "KLD" in text and "0.500000" in text and "failed: out of memory" in text and "more" not in text


def _won(tmp_path: Path, *, defaults_tg: list[float], defaults_pp: list[float], objective: str = "tg") -> TuneResult:
    """A search whose best candidate (index 1) measured TG 100 and PP 1000, the baseline 80 / 1000,
    beside engine defaults that measured ``defaults_tg`` / ``defaults_pp``."""
    tmp_path.mkdir(exist_ok=True)
    model, hw = make_testbed(tmp_path, rpc_devices=2, rpc_mem_mib=70)
    (w,) = expand([], [], depths=[0], pp_tokens=64, tg_tokens=16)
    small = {"threads": (1, 2), "ubatches": (512,), "flash_attn": (True,), "cache_types": (("f16", "f16"),)}
    req = TuneRequest(
        hw=str(hw), model=str(model), base=Settings(threads=1), workload=w, options=BenchOptions(), axes=small
    )
    entries, k = candidates(req, lambda s: None)
    entries[0].run, entries[1].run = 1, 2
    rates = {0: dflt.Rates((80.0, 81.0, 79.0), (1000.0,) * 3), 1: dflt.Rates((100.0, 101.0, 99.0), (1000.0,) * 3)}
    d_rates = dflt.Rates(tuple(defaults_tg), tuple(defaults_pp))
    return TuneResult(
        tune_id="tu-x",
        objective=objective,
        entries=entries,
        baseline=0,
        best=1,
        launches=2,
        stopped="budget spent",
        constants=k,
        values={i: list(r.tg if objective == "tg" else r.pp) for i, r in rates.items()},
        summaries={},
        verdicts={0: "baseline", 1: "best, faster (+25.0% vs baseline)"},
        plan_dir=tmp_path,
        workload=w,
        defaults=dflt.Defaults({"argv": ["llama-server", "-m", "m"]}, run=3),
        rates=rates,
        defaults_rates=d_rates,
        defaults_values=d_rates.tg if objective == "tg" else d_rates.pp,
    )


def test_the_engine_defaults_are_the_best_where_they_beat_every_candidate(tmp_path: Path) -> None:
    """Defaults that measured faster than the best candidate (by the rule of `compare`) are the
    recommendation: the plan to run is theirs, the document's best is theirs, the candidate is the
    best candidate only; within the noise, or losing more than --max-pp-loss of the baseline's PP,
    the best candidate stands."""
    r = _won(tmp_path, defaults_tg=[130.0, 131.0, 129.0, 130.5], defaults_pp=[1000.0] * 4)
    assert r.defaults_win is not None and r.defaults_win.startswith("faster (+30")
    assert "the best candidate" in r.defaults_win
    assert r.recommended_path() == tmp_path / dflt.PLAN_FILE
    doc = result_json(r)
    assert doc["defaults_win"] == r.defaults_win
    assert doc["best"] == {
        "label": dflt.LABEL,
        "tg_tok_s": doc["engine_defaults"]["tg_tok_s"],  # type: ignore[index]
        "pp_tok_s": doc["engine_defaults"]["pp_tok_s"],  # type: ignore[index]
        "goodput_req_s": None,
        "run": 3,
    }
    assert doc["best_candidate"]["label"] == r.entries[1].candidate.label  # type: ignore[index]
    assert doc["candidates"][1]["verdict"] == "best candidate, faster (+25.0% vs baseline)"  # type: ignore[index]
    assert doc["engine_defaults"]["best_vs_defaults"]["tg"]["verdict"] == "slower"  # type: ignore[index]
    assert defaults_lines(doc)[1].startswith("  best candidate vs engine defaults, TG: slower")
    from rich.console import Console

    console = Console(width=300, record=True)
    console.print(result_table(r))
    assert "best, faster (+30" in console.export_text()  # the defaults' row
    # --max-kld checks nothing: the recommendation is the defaults' (the guard reads no store for it)
    from moetune.tune.quality_guard import guard

    assert guard(None, r, 0.0, status=print) == (r, {})  # type: ignore[arg-type]
    # within the noise of the best: the best candidate stands
    same = _won(tmp_path / "same", defaults_tg=[60.0, 140.0, 100.0, 101.0], defaults_pp=[1000.0] * 4)
    assert same.defaults_win is None and same.recommended_path() == same.plan_path(1)
    assert result_json(same)["best"]["label"] == same.entries[1].candidate.label  # type: ignore[index]
    # faster TG for 20% less PP than the baseline: --max-pp-loss (10%) keeps the best candidate
    lossy = _won(tmp_path / "lossy", defaults_tg=[130.0, 131.0, 129.0, 130.5], defaults_pp=[800.0] * 4)
    assert lossy.defaults_win is None and lossy.recommended_path() == lossy.plan_path(1)
    # --objective pp judges PP, and no PP guard applies
    pp = _won(tmp_path / "pp", defaults_tg=[10.0] * 4, defaults_pp=[1300.0, 1310.0, 1290.0, 1305.0], objective="pp")
    assert pp.defaults_win is not None and pp.recommended_path() == tmp_path / "pp" / dflt.PLAN_FILE


def test_the_confirmation_round_reads_each_launch_in_order() -> None:
    doc = {
        "objective": "tg",
        "confirmed": [
            {"label": "auto t2", "medians": [512.4, 478.0]},
            {"label": "engine defaults", "medians": [500, 520]},
        ],
    }
    assert confirm_lines(doc) == [
        "confirmed: the 2 best launched again, judged on both launches pooled",
        "  auto t2: 512.4 then 478 tok/s TG",
        "  engine defaults: 500 then 520 tok/s TG",
    ]
    assert confirm_lines({"objective": "tg", "confirmed": []}) == [] and confirm_lines({}) == []
    turns = {"objective": "turn", "confirmed": [{"label": "auto t2", "medians": [0.148, 0.1284]}]}
    assert confirm_lines(turns)[1] == "  auto t2: 0.148 then 0.1284 s a turn"
