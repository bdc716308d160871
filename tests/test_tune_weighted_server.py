"""`tune --layout FILE --service main --with-load worker=SPEC --objective weighted:...`: what the
command line refuses before anything starts, and a real weighted search on the testbed (a CPU-only
main service beside a worker on a loopback rpc-server device, both measured at once)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from moetune.store.db import ResultsDB
from moetune.tune import weighted as wt
from tests.engine_harness import free_port
from tests.helpers import run_cli
from tests.tune_testbed import make_testbed

OBJECTIVE = "weighted:main=tg:1,worker=goodput:0.5,worker=ttft:0.25"


def _layout(tmp_path: Path, model: Path, worker: Path) -> Path:
    lay = tmp_path / "weighted.yaml"
    lay.write_text(
        yaml.safe_dump(
            {
                "services": [
                    {"name": "main", "model": str(model), "devices": [], "ctx": 512, "ubatch": 128},
                    {"name": "worker", "model": str(worker), "strategy": "all-gpu", "parallel": 2, "ctx": 1024},
                ]
            }
        )
    )
    return lay


def _worker(tmp_path: Path) -> Path:
    from moetune.model.archs import Dims
    from moetune.model.testmodel import generate

    worker = tmp_path / "worker.gguf"
    generate(worker, "qwen3moe", Dims(n_layer=2), "f16")
    return worker


@pytest.fixture(scope="module")
def testbed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """The models, a hardware file and the layout, made once for the tests that launch nothing."""
    d = tmp_path_factory.mktemp("weighted")
    model, hw = make_testbed(d)
    return model, hw, _layout(d, model, _worker(d))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--objective", "weighted:main=tg:1"], "weighs services of a layout"),
        (["--layout", "L", "--objective", "weighted:main=tg:1,coder=ttft:1"], "coder is no service of the layout"),
        (["--layout", "L", "--objective", "weighted:main=tg:1,worker=ttft:1"], "worker has no --with-load spec"),
        (["--layout", "L", "--objective", "weighted:main=tg:0"], "not a positive number"),
        (["--layout", "L", "--objective", "weighted:main=fast"], "unknown metric 'fast'"),
        (
            ["--layout", "L", "--with-load", "worker=c:1", "--objective", "weighted:worker=goodput:1"],
            "give --slo",
        ),
        (["--layout", "L", "--objective", "weighted:main=tg:1", "--concurrency", "2"], "--concurrency: only with"),
    ],
)
def test_the_command_line_refuses_a_bad_weighted_objective(
    testbed: tuple[Path, Path, Path], tmp_path: Path, args: list[str], message: str
) -> None:
    model, hw, lay = testbed
    args = [str(lay) if a == "L" else a for a in args]
    where = [] if "--layout" in args else [str(model)]
    service = ["--service", "main"] if "--layout" in args else []
    r = run_cli("tune", *where, *args, *service, "--hw", str(hw), "--db", str(tmp_path / "t.db"))
    assert r.exit_code == 2, r.stderr
    assert message in r.stderr


@pytest.mark.server
def test_a_weighted_search_scores_each_candidate_by_its_terms(
    bin_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two candidates of main (1 and 2 threads), each launched with the worker beside it and measured
    while the worker serves two streams: every candidate's score is the weighted sum of its stored
    figures relative to the baseline's, the baseline's is the sum of the weights, the winner is the
    highest score of those that beat the baseline (else the baseline), and the table shows the terms."""
    import moetune.tune.loop as loop

    monkeypatch.setattr(loop.core, "choose", lambda belief, best, open_, noise, gains: (open_[0], 1.0))
    model, hw = make_testbed(tmp_path, rpc_mem_mib=16000)
    lay = _layout(tmp_path, model, _worker(tmp_path))
    db = tmp_path / "t.db"
    args = [
        "tune", "--layout", str(lay), "--service", "main", "--hw", str(hw), "-t", "1",
        "--try-threads", "1,2", "--try-ubatch", "128", "--try-fa", "on", "--try-cache", "f16/f16",
        "--try-repack", "off", "--repack", "off", "--depth", "0", "--pp-tokens", "64", "--tg-tokens", "8",
        "-r", "3", "--warmup", "0", "--with-load", "worker=c:2,requests:4,prompt:64,output:16,warmup:0",
        "--objective", OBJECTIVE, "--slo", "ttft_ms=60000", "--port", str(free_port()), "--budget", "2",
        "--db", str(db),
    ]  # fmt: skip
    r = run_cli(*args, "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["objective"] == "weighted" and doc["weighted"]["relative_to"] == "baseline"
    assert [(t["service"], t["metric"], t["weight"]) for t in doc["weighted"]["terms"]] == [
        ("main", "tg", 1.0),
        ("worker", "goodput", 0.5),
        ("worker", "ttft", 0.25),
    ]
    launched = [c for c in doc["candidates"] if c["launched"]]
    assert len(launched) == 2 and doc["launches"] == 2
    base = launched[0]["measured"]["weighted"]
    assert launched[0]["label"] == doc["baseline"]["label"]
    assert base["score"] == pytest.approx(1 + 0.5 + 0.25)  # each figure over itself
    w = wt.parse(OBJECTIVE)
    from dataclasses import replace

    w = replace(w, slo=(("ttft_ms", 60000.0),))
    with ResultsDB.open(db) as h:
        for c in launched:
            sc = c["measured"]["weighted"]
            run = h.run(c["measured"]["run"])
            assert run.kind == "serve-bench" and run.sweep_id == doc["tune"]
            figs = wt.figures(h.samples(run.id), w, {"worker": 2})  # the stored samples, read again
            levels = {(lv["service"], lv["load"]): lv for lv in run.summary["levels"]}
            stored = {
                "main.tg": c["measured"]["tg_tok_s"]["median"],  # the table's TG under the load
                "worker.goodput": levels[("worker", "shared")]["goodput"]["req_s"],  # serve-bench's own figure
                "worker.ttft": levels[("worker", "shared")]["ttft_ms"]["p50"],
            }
            total = 0.0
            for p, b in zip(sc["terms"], base["terms"], strict=True):
                name = f"{p['service']}.{p['metric']}"
                assert p["value"] == pytest.approx(stored[name], rel=1e-3)
                assert p["value"] == pytest.approx(next(f.value for t, f in figs.items() if t.name == name))
                assert p["baseline"] == pytest.approx(b["value"]) or p["metric"] == "goodput"
                ratio = p["value"] / p["baseline"] if p["higher_is_better"] else p["baseline"] / p["value"]
                assert p["contribution"] == pytest.approx(p["weight"] * ratio)
                total += p["weight"] * ratio
            assert sc["score"] == pytest.approx(total)
    scores = {c["label"]: c["measured"]["weighted"]["score"] for c in launched}
    beat = [c["label"] for c in launched[1:] if "faster" in c["verdict"]]
    assert doc["best"]["label"] == (max(beat, key=scores.__getitem__) if beat else doc["baseline"]["label"])
    if beat:  # the winner is the highest score
        assert scores[doc["best"]["label"]] == max(scores.values())
    assert doc["best"]["weighted"]["score"] == pytest.approx(scores[doc["best"]["label"]])
    again = run_cli(*args)  # resumed: nothing launched again, the table read from the history
    assert again.exit_code == 0, again.stderr
    assert "launch " not in again.stderr
    assert "1 x main.tg + 0.5 x worker.goodput + 0.25 x worker.ttft" in again.stdout
    assert "worker goodput req/s" in again.stdout and "(inverted)" in again.stdout
