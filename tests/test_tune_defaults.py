"""`moetune tune`'s second baseline on the testbed (tests/tune_testbed.py): the engine run with the
model and no tuning flags, measured with the candidates' workload, the winner reported against it
(TG and PP); the workload named in the result; and --max-pp-loss refusing a TG winner that gives
up prefill."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moetune.store.db import ResultsDB
from tests.engine_harness import free_port
from tests.helpers import run_cli
from tests.tune_testbed import make_testbed

pytestmark = pytest.mark.server

WORKLOAD = ["--depth", "0", "--pp-tokens", "128", "--tg-tokens", "32", "-r", "3", "--warmup", "1"]
# the baseline (one thread, -ub 512) and one candidate the model expects to decode faster (two
# threads) that prefills in small batches (-ub 32)
TRY = [
    "--try-strategy",
    "cpu-moe",
    "--try-threads",
    "2",
    "--try-ubatch",
    "32",
    "--try-fa",
    "on",
    "--try-cache",
    "f16/f16",
    "--try-repack",
    "off",
]


def tune_args(model: Path, hw: Path, db: Path) -> list[str]:
    """A tune of the baseline and the one candidate, from one thread, in a budget of two."""
    return [
        "tune",
        str(model),
        "--hw",
        str(hw),
        "--strategy",
        "cpu-moe",
        "-t",
        "1",
        *TRY,
        *WORKLOAD,
        "--port",
        str(free_port()),
        "--budget",
        "2",
        "--db",
        str(db),
    ]


def test_tune_measures_the_engine_defaults_and_names_its_workload(bin_dir: Path, tmp_path: Path) -> None:
    model, hw = make_testbed(tmp_path)
    db = tmp_path / "t.db"
    r = run_cli(
        *tune_args(model, hw, db),
        "--max-pp-loss",
        "0",
        "-o",
        str(tmp_path / "best.json"),
        "--json",
    )
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["workload"] == {
        "name": "d0",
        "depth": 0,
        "pp_tokens": 128,
        "tg_tokens": 32,
        "text": "depth 0, prompt 128 tokens, output 32 tokens",
    }
    d = doc["engine_defaults"]
    argv = d["argv"][1:]
    assert argv[0] == "-m" and argv[2:4] == ["-c", "4096"]
    assert "-nr" in argv  # the suite's --repack off (MOETUNE_REPACK): what it needs to run on an AMX CPU
    assert "--rpc" in argv and not {"-ot", "-t", "-ub", "-b", "-fa", "-ngl", "-ctk", "--parallel"} & set(argv)
    assert d["run"] and d["tg_tok_s"]["median"] > 0 and d["pp_tok_s"]["median"] > 0
    vs = d["best_vs_defaults"]
    assert vs["tg"]["ratio"] > 0 and vs["pp"]["ratio"] > 0 and vs["tg"]["verdict"] in ("faster", "slower", "same")
    assert doc["max_pp_loss"] == 0.0
    with ResultsDB.open(db) as store:  # the defaults run carries no prediction: no calibration reads it
        run = store.run(d["run"])
        assert run.label == "engine defaults" and "predicted" not in dict(run.meta.details)
        assert len(store.runs(sweep_id=doc["tune"])) == doc["launches"] + 1  # not one of the budget's
    # --max-pp-loss 0: a candidate whose PP is below either baseline's cannot win, and says so
    (cand,) = [c for c in doc["candidates"] if c["label"] != doc["baseline"]["label"]]
    assert cand["launched"], doc["stopped"]
    pp = cand["measured"]["pp_tok_s"]["median"]
    refs = (doc["baseline"]["pp_tok_s"]["median"], d["pp_tok_s"]["median"])
    lost = pp < max(refs)
    assert cand["verdict"].startswith("rejected: PP ") == lost, (cand["verdict"], pp, refs)
    if lost:
        assert "--max-pp-loss 0%" in cand["verdict"] and doc["best_candidate"]["label"] == doc["baseline"]["label"]
    # the plan written is the defaults' exactly where they beat the best candidate (TG, by compare's rule)
    won = doc["defaults_win"] is not None
    assert won == (vs["tg"]["verdict"] == "slower" and d["pp_tok_s"]["median"] >= refs[0])
    assert doc["best"]["label"] == ("engine defaults" if won else doc["best_candidate"]["label"])
    written = json.loads((tmp_path / "best.json").read_text())
    assert written.get("engine_defaults", False) == won and doc["plan"] == str(tmp_path / "best.json")


def test_confirm_launches_the_best_again_and_judges_them_on_both_launches(bin_dir: Path, tmp_path: Path) -> None:
    """--confirm 2: the two best of the baseline, the candidate and the engine defaults are launched
    once more each (not counted in --budget), judged on both launches pooled; run again, the finished
    round is not launched twice."""
    import statistics

    from moetune.bench.analysis.single import bench_metrics

    model, hw = make_testbed(tmp_path)
    db = tmp_path / "t.db"
    tune = [
        *tune_args(model, hw, db),
        "--confirm",
        "2",
    ]
    r = run_cli(*tune, "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["launches"] == 2 and "confirm 1/2:" in r.stderr and "confirm 2/2:" in r.stderr
    confirmed = {c["label"]: c["medians"] for c in doc["confirmed"]}
    assert len(confirmed) == 2 and all(len(m) == 2 for m in confirmed.values()), confirmed
    labels = {c["label"] for c in doc["candidates"]} | {"engine defaults"}
    assert set(confirmed) <= labels
    with ResultsDB.open(db) as store:
        runs = [x for x in store.runs(sweep_id=doc["tune"]) if x.status.value == "done"]
        assert len(runs) == 2 + 1 + 2  # the budget's, the engine defaults', the confirmation's
        by = {label: [x.id for x in runs if x.label == label] for label in confirmed}
        assert all(len(v) == 2 for v in by.values())
        rows = {c["label"]: c for c in doc["candidates"]}
        for label, ids in by.items():
            tg = bench_metrics([s for i in ids for s in store.samples(i)])["tg:d0"].values
            assert len(tg) == 6  # three repeats a launch
            measured = rows[label]["measured"] if label in rows else doc["engine_defaults"]
            got = measured["tg_tok_s"]["median"]
            assert got == pytest.approx(statistics.median(tg), rel=1e-3), (label, got, tg)
    # the same command again: the search and its round are done, nothing is launched
    again = run_cli(*tune)
    assert again.exit_code == 0, again.stderr
    assert "confirm 1/2" not in again.stderr and "launch " not in again.stderr
    assert "confirmed: the 2 best launched again, judged on both launches pooled" in again.stdout
    with ResultsDB.open(db) as store:
        assert len(store.runs(sweep_id=doc["tune"])) == len(runs)
