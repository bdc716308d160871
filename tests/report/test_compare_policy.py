"""One comparison policy (report.compare.compare_runs) for `moetune compare`, `moetune sweep` and
the HTML report: the first run is the baseline, and a run without measured samples is refused by
name, in the same words everywhere (the report says it in place of its comparison)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from moetune.errors import InputError
from moetune.kinds import RunKind
from moetune.report.compare import compare_runs
from moetune.report.html.gather import gather
from moetune.store.db import ResultsDB
from moetune.store.record import RunMeta
from tests.bench.synth import run_samples
from tests.helpers import run_cli

NO_SAMPLES = "run 2 (b) has no measured samples to compare"


def _history(path: Path, *, empty_b: bool) -> list[int]:
    """Runs a (tg 10), b (tg 12, or no sample: interrupted before its first) and c (tg 11.5)."""
    ids = []
    with ResultsDB.open(path) as db:
        for label, tg in (("a", 10.0), ("b", 12.0), ("c", 11.5)):
            rid = db.create_run(RunMeta(kind=RunKind.BENCH), label=label, target="u")
            if not (label == "b" and empty_b):
                for s in run_samples([tg, tg * 1.01, tg * 0.99]):
                    db.add_sample(rid, s)
            db.finish_run(rid)
            ids.append(rid)
    return ids


def test_compare_runs_compares_against_the_first(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite"
    ids = _history(path, empty_b=False)
    with ResultsDB.open(path) as db:
        got = compare_runs(db, [db.run(i) for i in ids], min_change=0.02)
    c = got.comparison
    assert c.baseline.label == "a" and [o.label for o in c.others] == ["b", "c"]
    assert [m.label for m in got.metrics] == ["a", "b", "c"] and set(got.noise) == set(ids)
    tg = {r.label: r for r in c.rows if r.metric == "tg:short-json"}
    assert tg["b"].verdict == "faster" and tg["b"].change_pct == pytest.approx(20.0, abs=0.5)
    assert tg["c"].change_pct == pytest.approx(15.0, abs=0.5)


def test_a_run_without_samples_is_refused_alike_by_compare_and_the_report(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite"
    ids = _history(path, empty_b=True)
    with ResultsDB.open(path) as db, pytest.raises(InputError, match=re.escape(NO_SAMPLES)):
        compare_runs(db, [db.run(i) for i in ids])
    r = run_cli("compare", *map(str, ids), "--db", str(path), "--json")
    assert r.exit_code == 2 and NO_SAMPLES in r.stderr and not r.stdout
    # the report shows every run and, in place of the comparison, what compare says
    data = gather([str(i) for i in ids], path, generated_at="now")
    assert data.comparison is None and data.compare_notes == (NO_SAMPLES,)
    assert [rr.run.label for rr in data.runs] == ["a", "b", "c"]
    # without the empty run, both compare the same runs the same way
    r = run_cli("compare", str(ids[0]), str(ids[2]), "--db", str(path), "--json")
    assert r.exit_code == 0, r.stderr
    data = gather([str(ids[0]), str(ids[2])], path, generated_at="now")
    assert data.comparison is not None and data.comparison.to_json()["rows"] == json.loads(r.stdout)["rows"]
