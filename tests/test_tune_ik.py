"""`moetune tune` with an ik_llama.cpp engine: the search space gains ik's own options, each
candidate's plan carries them in its command, and the loop finds the one a (fake) benchmark says is
fastest. The benchmark is a stand-in here (tests/engine/test_ik_options.py starts the real server
with every option): it stores a run whose TG follows the flags in the plan it was given."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from moetune.bench.target import Target
from moetune.kinds import RunKind, RunStatus
from moetune.store.db import ResultsDB
from moetune.store.record import RunMeta
from tests.bench.synth import run_samples
from tests.helpers import run_cli
from tests.tune_testbed import make_testbed

# what the stand-in measures: -muge 30% faster, -no-fmoe 10% slower, -amb 5% slower
SPEED = {"-muge": 1.3, "-no-fmoe": 0.9, "-amb": 0.95}


@pytest.fixture
def fake_bench(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[str]]]:
    """Replace the loop's benchmark; the label and argv of every plan it was asked to measure are kept."""
    seen: list[tuple[str, list[str]]] = []

    def bench_target(
        db: ResultsDB, target: Target, workloads: list[Any], options: Any, *, label: str, sweep_id: str, **_: Any
    ) -> int:
        assert target.spec is not None
        argv = list(target.spec.servers()[0].argv)
        seen.append((label, argv))
        tg = 100.0
        for flag, f in SPEED.items():
            tg *= f if flag in argv else 1.0
        run = db.create_run(RunMeta(kind=RunKind.BENCH), label=label, target=target.name, sweep_id=sweep_id)
        for s in run_samples([tg, tg * 1.01, tg * 0.99], workload=workloads[0].name):
            db.add_sample(run, s)
        db.finish_run(run, RunStatus.DONE, {})
        return run

    monkeypatch.setattr("moetune.tune.loop.bench_target", bench_target)
    return seen


def test_an_ik_search_tries_iks_options_and_keeps_the_fastest(
    tmp_path: Path, fake_bench: list[tuple[str, list[str]]]
) -> None:
    model, hw = make_testbed(tmp_path)
    args = [
        "tune",
        str(model),
        "--hw",
        str(hw),
        "--engine",
        "ik_llama.cpp",
        "--strategy",
        "auto",
        "-t",
        "2",
        "--try-strategy",
        "auto",
        "--try-threads",
        "2",
        "--try-ubatch",
        "512",
        "--try-cache",
        "f16/f16",
        "--try-repack",
        "off",
        "--depth",
        "0",
        "--pp-tokens",
        "64",
        "--tg-tokens",
        "16",
        "--budget",
        "8",
        "--db",
        str(tmp_path / "t.db"),
        "--json",
    ]
    r = run_cli(*args)
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    labels = {c["label"] for c in doc["candidates"]}
    # a GQA model: -amb only without flash attention, no MLA mode; fused MoE and -muge both ways
    assert labels == {
        f"auto t2 ub512 {fa}{amb}{fmoe}{muge}"
        for fa, amb in (("fa", ""), ("no-fa", ""), ("no-fa", " amb512"))
        for fmoe in ("", " no-fmoe")
        for muge in ("", " muge")
    }
    assert doc["best"]["label"] in ("auto t2 ub512 fa muge", "auto t2 ub512 no-fa muge")
    assert doc["best"]["tg_tok_s"]["median"] == pytest.approx(130.0)
    by_label = {c["label"]: c for c in doc["candidates"]}
    assert by_label[doc["best"]["label"]]["verdict"].startswith("best, faster")
    # every launched plan says in its command what its label says
    defaults = [argv for label, argv in fake_bench if label == "engine defaults"]  # the second baseline
    assert (
        len(defaults) == 1 and "--jinja" in defaults[0] and not {"-muge", "-no-fmoe", "-amb", "-t"} & set(defaults[0])
    )
    launched = [(label, argv) for label, argv in fake_bench if label != "engine defaults"]
    assert len(launched) == doc["launches"] >= 2
    for label, argv in launched:
        words = label.split()
        assert ("-muge" in argv) == ("muge" in words) and ("-no-fmoe" in argv) == ("no-fmoe" in words)
        assert ("-amb" in argv) == ("amb512" in words) and (
            argv[argv.index("-amb") + 1] == "512" if "-amb" in argv else True
        )
        assert "-fmoe" not in argv and "-mla" not in argv  # fused MoE is this build's default; no MLA here
    plan = json.loads(Path(doc["plan"]).read_text())
    assert "-muge" in plan["shell"]


def test_an_option_the_model_does_not_have_is_refused(tmp_path: Path) -> None:
    model, hw = make_testbed(tmp_path)
    r = run_cli(
        "tune",
        str(model),
        "--hw",
        str(hw),
        "--engine",
        "ik_llama.cpp",
        "--try-mla",
        "2,3",
        "--db",
        str(tmp_path / "t.db"),
    )
    assert r.exit_code == 2 and "--try-mla: the model has no MLA attention" in r.stderr, r.stderr
