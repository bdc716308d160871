"""`moetune sweep A B --interleave`: two plans of a generated model measured in alternating rounds on
a real llama-server, each round's runs tagged in the history, resumed by rounds, compared paired."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moetune.bench.analysis.rounds import RoundTag
from moetune.kinds import RunStatus
from moetune.store.db import ResultsDB
from tests.bench.servers import model, write_plan
from tests.helpers import run_cli

pytestmark = pytest.mark.server
FAST = ("-r", "2", "--warmup", "0", "--max-tokens", "8", "--ignore-eos")


@pytest.fixture(scope="module")
def tiny(models: Path, bin_dir: Path) -> Path:
    return model(models, "interleave-tiny", n_layer=2)


def tags(db: ResultsDB, sid: str) -> list[tuple[int, str, str, int]]:
    """(round, label, status, position) of the sweep's runs, oldest first."""
    out = []
    for r in reversed(db.runs(sweep_id=sid)):
        tag = RoundTag.from_details(r.meta.details)
        assert tag is not None and tag.sweep == sid
        out.append((tag.round, r.label, str(r.status), tag.position))
    return out


def test_interleaved_launches_alternate_resume_by_round_and_compare_paired(tiny: Path, tmp_path: Path) -> None:
    a = write_plan(tmp_path / "a.json", tiny, label="ub 512")
    b = write_plan(tmp_path / "b.json", tiny, "-ub", "64", label="ub 64")
    r = run_cli("sweep", str(a), str(b), *FAST, "--interleave", "--rounds", "2", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    sid = doc["sweep"]
    assert doc["interleave"]["mode"] == "launches" and doc["interleave"]["complete"] == 2
    assert [(p["round"], p["label"], p["status"]) for p in doc["plans"]] == [
        (1, "ub 512", "measured"),
        (1, "ub 64", "measured"),
        (2, "ub 64", "measured"),
        (2, "ub 512", "measured"),
    ]
    assert all(p["launch_s"] > 0 for p in doc["plans"]) and doc["interleave"]["launches"] == 4
    assert r.stderr.count("main: starting") == 4 and r.stderr.count("stopped main") == 4
    comp = doc["comparison"]
    assert comp["paired"] and comp["baseline"]["label"] == "ub 512" and len(comp["rounds"]) == 2
    tg = next(x for x in comp["rows"] if x["metric"] == "tg:short-json")
    assert len(tg["per_round"]) == 2 and tg["verdict"] in ("faster", "slower", "same")
    assert tg["per_round"][0]["run"] == doc["plans"][1]["run"]
    with ResultsDB.open() as db:
        assert tags(db, sid) == [
            (1, "ub 512", "done", 0),
            (1, "ub 64", "done", 1),
            (2, "ub 64", "done", 0),
            (2, "ub 512", "done", 1),
        ]
        db.finish_run(doc["plans"][3]["run"], RunStatus.INTERRUPTED)  # round 2 did not complete

    again = run_cli("sweep", str(a), str(b), *FAST, "--interleave", "--rounds", "3", "--json")
    assert again.exit_code == 0, again.stderr
    d2 = json.loads(again.stdout)
    assert d2["sweep"] == sid
    assert [(p["round"], p["label"], p["status"]) for p in d2["plans"]] == [
        (1, "ub 512", "resumed"),
        (1, "ub 64", "resumed"),  # round 1 kept; round 2 run again whole; round 3 added
        (2, "ub 64", "measured"),
        (2, "ub 512", "measured"),
        (3, "ub 512", "measured"),
        (3, "ub 64", "measured"),
    ]
    assert "round 1: complete in runs" in again.stderr
    assert [x["round"] for x in d2["comparison"]["rounds"]] == [1, 2, 3]

    table = run_cli("compare", "--sweep", sid)
    assert table.exit_code == 0, table.stderr
    assert "paired over 3 rounds" in table.stdout and "ub 64" in table.stdout
    assert "ratio per round" in table.stdout


def test_interleaved_batches_keep_both_servers_up(tiny: Path, tmp_path: Path) -> None:
    a = write_plan(tmp_path / "a.json", tiny, label="one thread")
    b = write_plan(tmp_path / "b.json", tiny, "-t", "2", label="two threads")
    r = run_cli("sweep", str(a), str(b), *FAST, "--interleave", "batches", "--rounds", "2")
    assert r.exit_code == 0, r.stderr
    assert r.stderr.count("main: starting") == 2  # one launch per plan, for every round
    assert "no memory ledger" in r.stderr  # these test plans have none, and say it was not checked
    assert "paired over 2 rounds" in r.stdout and "two threads" in r.stdout
    assert "2 of 2 rounds complete (batches); 2 launches took" in r.stdout
    with ResultsDB.open() as db:
        runs = db.runs()
        assert len(runs) == 4 and all(
            RoundTag.from_details(x.meta.details).mode == "batches"  # type: ignore[union-attr]
            for x in runs
        )
        launches = {x.meta.launch_run for x in runs}
        assert len(launches) == 2  # two launches served the four runs
        # no RPC worker: transport none; one launch for every round: no round's load time
        assert all(
            x.meta.launch is not None and x.meta.launch.transport == "none" and x.meta.launch.load_s is None
            for x in runs
        )


def test_interleaved_launches_over_two_transports_give_a_paired_verdict(tiny: Path, tmp_path: Path) -> None:
    """One plan with an RPC worker, launched over tcp and over auto (which this build without RDMA
    resolves to TCP) in alternating rounds: the paired verdict covers load_s, and each run's
    transport is the one the worker's log confirmed."""
    plan = write_plan(tmp_path / "rpc.json", tiny, "-ngl", "99", label="rpc", rpc=True)
    r = run_cli("sweep", str(plan), *FAST, "--transport", "tcp,auto", "--interleave", "--rounds", "2", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [(p["round"], p["label"]) for p in doc["plans"]] == [
        (1, "rpc (tcp)"),
        (1, "rpc (auto)"),
        (2, "rpc (auto)"),
        (2, "rpc (tcp)"),
    ]
    comp = doc["comparison"]
    assert comp["baseline"]["label"] == "rpc (tcp)" and comp["transports"] == {"rpc (tcp)": "TCP", "rpc (auto)": "TCP"}
    load = next(x for x in comp["rows"] if x["metric"] == "load_s")
    assert not load["higher_is_better"] and len(load["per_round"]) == 2
    assert load["verdict"] in ("faster", "slower", "same") and all(c["median"] > 0 for c in load["per_round"])
    with ResultsDB.open() as db:
        runs = db.runs(sweep_id=doc["sweep"])
        assert sorted(str(x.meta.launch.transport) for x in runs if x.meta.launch) == ["auto", "auto", "tcp", "tcp"]
        assert all(x.meta.launch and x.meta.launch.workers == {"rpc0": "TCP"} for x in runs)
    table = run_cli("compare", "--sweep", doc["sweep"])
    assert table.exit_code == 0, table.stderr
    assert "load_s" in table.stdout and "transport (confirmed at launch): rpc (tcp) TCP, rpc (auto) TCP" in table.stdout


def test_interleave_usage_errors(tiny: Path, tmp_path: Path) -> None:
    a = write_plan(tmp_path / "a.json", tiny, label="a")
    b = write_plan(tmp_path / "b.json", tiny, label="b")
    one = run_cli("sweep", str(a), "--interleave")
    assert one.exit_code == 2 and "two or more plans" in one.stderr
    rounds = run_cli("sweep", str(a), str(b), "--rounds", "3")
    assert rounds.exit_code == 2 and "add --interleave" in rounds.stderr
    first = run_cli("sweep", "--interleave", str(a), str(b))
    assert first.exit_code == 2 and "write --interleave after the plans" in first.stderr
    doc = json.loads(a.read_text())
    doc["launch"]["processes"][0]["port"] = json.loads(b.read_text())["launch"]["processes"][0]["port"]
    clash = tmp_path / "clash.json"
    clash.write_text(json.dumps({**doc, "label": "clash"}))
    both = run_cli("sweep", str(clash), str(b), "--interleave", "batches")
    assert both.exit_code == 2 and "both listen on" in both.stderr and "--interleave launches" in both.stderr
