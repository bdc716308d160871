"""A speed comparison shows the quality measured of the same plans (`moetune quality` runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from moetune.kinds import RunKind, RunStatus
from moetune.report.compare import compare, load
from moetune.report.compare_view import comparison_markdown
from moetune.report.quality_beside import plan_identity
from moetune.store.db import ResultsDB
from moetune.store.record import RunMeta
from tests.bench.synth import run_samples


def plan(ot: str, port: int) -> dict[str, Any]:
    return {"argv": ["llama-server", "-m", "m.gguf", "-ot", ot, "--port", str(port)]}


def bench(db: ResultsDB, label: str, doc: dict[str, Any], tgs: list[float]) -> int:
    rid = db.create_run(RunMeta(kind=RunKind.BENCH, plan=doc), label=label, target="t")
    for s in run_samples(tgs):
        db.add_sample(rid, s)
    db.finish_run(rid, RunStatus.DONE)
    return rid


def quality(db: ResultsDB, label: str, doc: dict[str, Any], summary: dict[str, Any], role: str) -> int:
    rid = db.create_run(RunMeta(kind=RunKind.QUALITY, plan=doc, details={"role": role}), label=label, target="t")
    db.finish_run(rid, RunStatus.DONE, summary)
    return rid


def test_the_port_is_not_the_configuration() -> None:
    assert plan_identity(plan("exps=CPU", 8080)) == plan_identity(plan("exps=CPU", 9090))
    assert plan_identity(plan("exps=CPU", 8080)) != plan_identity(plan("blk.1.=RPC0,exps=CPU", 8080))
    assert plan_identity(None) is None and plan_identity({"argv": []}) is None


def test_each_plan_gets_the_newest_quality_run_of_the_same_command(tmp_path: Path) -> None:
    with ResultsDB.open(tmp_path / "r.db") as db:
        a = bench(db, "cpu-moe", plan("exps=CPU", 8080), [20.0, 20.1, 19.9])
        b = bench(db, "head", plan("blk.1.=RPC0,exps=CPU", 8081), [24.0, 24.2, 23.9])
        c = bench(db, "tail", plan("blk.7.=RPC0,exps=CPU", 8082), [22.0, 22.1, 21.9])
        ref = quality(db, "cpu-moe (reference)", plan("exps=CPU", 9000), {"ppl": {"mean": 812.5}}, "reference")
        quality(db, "head", plan("blk.1.=RPC0,exps=CPU", 9001), {"kld": {"mean": 0.5}, "verdict": "worse"}, "candidate")
        newer = quality(
            db,
            "head",
            plan("blk.1.=RPC0,exps=CPU", 9002),
            {"kld": {"mean": 0.000012}, "top1_agree": {"mean": 0.998}, "verdict": "same"},
            "candidate",
        )
        runs = load(db, [db.run(a), db.run(b), db.run(c)])
    assert runs[0].quality is not None and runs[0].quality.reference and runs[0].quality.run == ref
    assert runs[1].quality is not None and runs[1].quality.run == newer and runs[1].quality.kld_mean == 0.000012
    assert runs[2].quality is None
    comp = compare(runs[0], runs[1:])
    md = comparison_markdown(comp)
    assert (
        f"quality of the same plans (moetune quality): cpu-moe reference, ppl 812.5 (run {ref}); "
        f"head KLD 0.000012, top-1 99.8%, same (run {newer}); tail not measured"
    ) in md
    assert comp.to_json()["quality"][str(b)]["kld_mean"] == 0.000012 and str(c) not in comp.to_json()["quality"]


def test_no_quality_runs_no_line(tmp_path: Path) -> None:
    with ResultsDB.open(tmp_path / "r.db") as db:
        runs = load(
            db, [db.run(bench(db, "a", plan("x", 1), [20.0, 20.1])), db.run(bench(db, "b", plan("y", 2), [21.0, 21.1]))]
        )
    md = comparison_markdown(compare(runs[0], runs[1:]))
    assert "quality of the same plans" not in md and compare(runs[0], runs[1:]).to_json()["quality"] == {}
