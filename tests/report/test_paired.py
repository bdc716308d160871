"""The paired comparison from runs: rows, JSON, renderings, and `compare --paired` / `compare
--sweep` of an interleaved sweep read back from a history (no server: samples made to order)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.table import Table

from moetune.bench.analysis.rounds import RoundTag
from moetune.bench.analysis.stats import MetricSamples
from moetune.errors import InputError
from moetune.kinds import RunKind, RunStatus
from moetune.report.compare import RunMetrics
from moetune.report.html.page import SECTIONS
from moetune.report.paired import load_refs, load_sweep, paired_compare
from moetune.report.paired_view import paired_csv, paired_markdown, paired_table
from moetune.store.db import ResultsDB
from moetune.store.record import RunMeta
from tests.bench.synth import run_samples
from tests.helpers import run_cli
from tests.report.test_html import Elements, external_refs

# per round, the machine's factor: both plans alike; B is 8 % faster within every round
FACTORS = (1.0, 0.75, 1.1, 0.8)


def rm(run: int, label: str, tgs: list[float], pps: list[float] | None = None) -> RunMetrics:
    ms = {"tg:short-json": MetricSamples(values=tuple(tgs), higher_is_better=True, unit="tokens/s", family="tg")}
    if pps is not None:
        ms["pp:short-json"] = MetricSamples(values=tuple(pps), higher_is_better=True, unit="tokens/s", family="pp")
    return RunMetrics(run=run, label=label, kind="bench", status="done", metrics=ms)


def drifting() -> tuple[dict[int, dict[str, int]], dict[int, RunMetrics]]:
    rounds: dict[int, dict[str, int]] = {}
    metrics: dict[int, RunMetrics] = {}
    run = 1
    for k, f in enumerate(FACTORS, 1):
        rounds[k] = {}
        for lab, speed in (("A", 20.0), ("B", 21.6)):
            tgs = [speed * f * (1 + d) for d in (-0.004, 0.0, 0.004)]
            metrics[run] = rm(run, lab, tgs, [x * 10 for x in tgs])
            rounds[k][lab] = run
            run += 1
    return rounds, metrics


def test_rows_carry_the_paired_verdict_and_the_unpaired_one_beside_it() -> None:
    rounds, metrics = drifting()
    c = paired_compare(rounds, metrics, "A")
    assert [(r.label, r.metric) for r in c.rows] == [("B", "tg:short-json"), ("B", "pp:short-json")]
    row = c.rows[0]
    assert row.verdict == "faster" and row.paired.change_pct == pytest.approx(8.0, abs=0.1)
    assert [round(cell.ratio, 3) for cell in row.per_round] == [1.08] * 4
    assert row.unpaired.verdict == "same"  # the drift between rounds drowns it when pooled
    assert row.runs == (2, 4, 6, 8) and row.n == 12
    doc = c.to_json()
    assert doc["paired"] is True and doc["rule"]["statistic"].startswith("paired")
    assert doc["baseline"] == {**doc["baseline"], "label": "A", "runs": [1, 3, 5, 7]}
    assert doc["rounds"][1] == {"round": 2, "runs": {"A": 3, "B": 4}}
    r0 = doc["rows"][0]
    assert {
        "rounds",
        "per_round",
        "ratio",
        "ratio_ci_low",
        "ratio_ci_high",
        "change_pct",
        "change_ci_low_pct",
        "change_ci_high_pct",
        "verdict",
        "noisy",
        "unpaired",
    } <= set(r0)
    assert r0["rounds"] == 4 and r0["per_round"][0]["ratio"] == pytest.approx(1.08)
    assert r0["unpaired"]["verdict"] == "same"


def test_a_metric_some_round_lacks_is_noted_and_one_round_says_so() -> None:
    rounds, metrics = drifting()
    metrics[4] = rm(4, "B", [17.0, 17.1, 17.2])  # round 2's B measured TG only
    c = paired_compare(rounds, metrics, "A")
    assert [r.metric for r in c.rows] == ["tg:short-json"]
    assert any("pp:short-json" in n for n in c.notes)
    one = paired_compare({1: rounds[1]}, metrics, "A")
    assert one.rows[0].verdict == "same" and any("one round" in n for n in one.notes)
    with pytest.raises(InputError):
        paired_compare({}, metrics, "A")
    with pytest.raises(InputError):
        paired_compare(rounds, metrics, "C")


def test_renderings() -> None:
    rounds, metrics = drifting()
    c = paired_compare(rounds, metrics, "A")
    md = paired_markdown(c)
    assert "| B | tg:short-json |" in md and "1.080 1.080 1.080 1.080" in md and "faster" in md
    assert "B,tg:short-json,tokens/s,4," in paired_csv(c)
    table, legend = paired_table(c).renderables
    assert isinstance(table, Table) and table.row_count == 2 and "paired over 4 rounds" in str(table.title)
    assert "t interval" in str(legend)


def fill(db: ResultsDB, sid: str | None, rounds: list[tuple[float, float]], *, interrupt: int | None = None) -> None:
    """Runs of A and B, alternating, each round's medians ``(a, b)``; an interleaved sweep's tags when ``sid``."""
    if sid:
        db.create_sweep(
            sid,
            {
                "name": None,
                "baseline": None,
                "plans": [{"label": "A", "path": "a.json"}, {"label": "B", "path": "b.json"}],
                "interleave": {"mode": "launches", "rounds": len(rounds)},
            },
        )
    for k, (a, b) in enumerate(rounds, 1):
        for pos, (lab, tg) in enumerate((("A", a), ("B", b))):
            details = (
                {"sweep": RoundTag(sweep=sid, round=k, attempt=f"t{k}", mode="launches", position=pos).to_json()}
                if sid
                else {}
            )
            rid = db.create_run(RunMeta(kind=RunKind.BENCH, details=details), label=lab, target="t", sweep_id=sid)
            for s in run_samples([tg * 0.998, tg, tg * 1.002]):
                db.add_sample(rid, s)
            db.finish_run(rid, RunStatus.INTERRUPTED if interrupt == k and lab == "B" else RunStatus.DONE)


ROUNDS = [(20.0, 21.6), (15.0, 16.2), (22.0, 23.76), (16.0, 17.28)]


def test_compare_sweep_of_an_interleaved_sweep_is_paired(tmp_path: Path) -> None:
    db_path = tmp_path / "r.sqlite"
    with ResultsDB.open(db_path) as db:
        fill(db, "sw-test", ROUNDS, interrupt=4)  # round 4 did not complete: left out
    r = run_cli("compare", "--sweep", "sw-test", "--json", "--db", str(db_path))
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["paired"] and doc["sweep"] == "sw-test" and doc["mode"] == "launches"
    assert [x["round"] for x in doc["rounds"]] == [1, 2, 3]
    tg = next(x for x in doc["rows"] if x["metric"] == "tg:short-json")
    assert tg["verdict"] == "faster" and tg["change_pct"] == pytest.approx(8.0, abs=0.1)
    table = run_cli("compare", "--sweep", "sw-test", "--db", str(db_path))
    assert table.exit_code == 0 and "paired over 3 rounds" in table.stdout and "faster" in table.stdout
    csv = run_cli("compare", "--sweep", "sw-test", "--format", "csv", "--baseline", "B", "--db", str(db_path))
    assert csv.stdout.startswith("label,metric") and "\nA,tg:short-json" in csv.stdout and "slower" in csv.stdout


def test_compare_paired_pairs_runs_made_by_hand_in_order(tmp_path: Path) -> None:
    db_path = tmp_path / "r.sqlite"
    with ResultsDB.open(db_path) as db:
        fill(db, None, ROUNDS)
    r = run_cli("compare", "--paired", "A", "B", "--json", "--db", str(db_path))
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [x["runs"] for x in doc["rounds"]] == [
        {"A": 1, "B": 2},
        {"A": 3, "B": 4},
        {"A": 5, "B": 6},
        {"A": 7, "B": 8},
    ]
    assert doc["rows"][0]["verdict"] == "faster" and doc["rows"][0]["unpaired"]["verdict"] == "same"
    ids = run_cli("compare", "--paired", "1", "2", "3", "4", "--json", "--db", str(db_path))
    assert [x["round"] for x in json.loads(ids.stdout)["rounds"]] == [1, 2]
    odd = run_cli("compare", "--paired", "1", "2", "3", "--db", str(db_path))
    assert odd.exit_code == 2 and "same number of runs" in odd.stderr
    plain = run_cli("compare", "A", "B", "--json", "--db", str(db_path))  # unpaired: the newest of each
    assert "paired" not in json.loads(plain.stdout)


def test_paired_inputs_that_cannot_be_paired(tmp_path: Path) -> None:
    db_path = tmp_path / "r.sqlite"
    with ResultsDB.open(db_path) as db:
        fill(db, None, ROUNDS[:2])
        db.create_sweep("sw-plain", {"plans": [{"label": "A", "path": "a.json"}]})
        with pytest.raises(InputError, match="did not interleave"):
            load_sweep(db, "sw-plain")
        with pytest.raises(InputError, match="two configurations"):
            load_refs(db, ["A"])
    r = run_cli("compare", "--paired", "A", "B", "--metric", "goodput", "--db", str(db_path))
    assert r.exit_code == 2 and "goodput" in r.stderr


def test_report_of_an_interleaved_sweep_and_of_runs_paired_by_hand(tmp_path: Path) -> None:
    """`moetune report --sweep` of an interleaved sweep shows every run of its complete rounds and
    judges them round by round (the unpaired verdict beside); `report --paired` does so for runs
    named by hand; what cannot be reported is refused with exit 2."""
    db_path = tmp_path / "r.sqlite"
    with ResultsDB.open(db_path) as db:
        fill(db, "sw-test", ROUNDS, interrupt=4)  # round 4 did not complete: left out
    page_path = tmp_path / "sweep.html"
    r = run_cli("report", "--sweep", "sw-test", "-o", str(page_path), "--db", str(db_path))
    assert r.exit_code == 0, r.stderr
    page = page_path.read_text()
    assert not external_refs(page) and [x["id"] for x in Elements(page).find("section")] == [sid for sid, _ in SECTIONS]
    assert "paired over 3 rounds (sweep sw-test, a launch per plan per round); baseline A" in page
    assert [f'id="run-{i}"' in page for i in range(1, 9)] == [True] * 6 + [False] * 2
    assert "1.080 1.080 1.080" in page and "+8.0% [+8.0, +8.0] faster" in page
    assert "tg:short-json: paired ratio to A" in page and "% of A" in page  # the chart
    assert "unpaired" in page and "t interval" in page  # the other verdict, and how both are made
    unpaired_head = "<th>run</th><th class=num>id</th>"  # the table of `compare`, runs apart
    assert unpaired_head not in page
    assert unpaired_head in run_cli("report", "1", "2", "-o", "-", "--db", str(db_path)).stdout
    with ResultsDB.open(tmp_path / "h.sqlite") as db:
        fill(db, None, ROUNDS)
    r = run_cli("report", "--paired", "A", "B", "-o", "-", "--db", str(tmp_path / "h.sqlite"))
    assert r.exit_code == 0, r.stderr
    assert "paired over 4 rounds (runs paired in order); baseline A" in r.stdout and 'id="run-8"' in r.stdout
    for args, said in (
        (["--sweep", "nope"], "no sweep 'nope'"),
        (["--sweep", "sw-test", "1"], "name no runs"),
        (["--paired", "A"], "two configurations"),
    ):
        r = run_cli("report", *args, "-o", str(tmp_path / "x.html"), "--db", str(db_path))
        assert r.exit_code == 2 and said in r.stderr, (args, r.stderr)
    assert not (tmp_path / "x.html").exists()
