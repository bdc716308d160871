"""`moetune quality --qa`: mock servers that answer right, at random, or not at all."""

from __future__ import annotations

import json
from pathlib import Path

from moetune.quality import qa
from moetune.store.db import ResultsDB
from tests.helpers import run_cli
from tests.quality.qa_mock import qa_server


def _questions(tmp_path: Path, n: int = 60) -> tuple[Path, list[qa.Question]]:
    lines = [
        {"id": f"q{i}", "question": f"Question {i}?", "choices": ["one", "two", "three", "four"], "answer": i % 4}
        for i in range(n)
    ]
    path = tmp_path / "qs.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines))
    return path, qa.read_questions(path)


def test_random_is_worse_than_right_and_a_repeat_is_the_same(tmp_path: Path) -> None:
    path, qs = _questions(tmp_path)
    with qa_server(qs, "right") as right, qa_server(qs, "random") as rnd, qa_server(qs, "silent") as silent:
        r = run_cli(
            "quality",
            "--qa",
            str(path),
            "--url",
            right,
            "--url",
            rnd,
            "--url",
            right,
            "--url",
            silent,
            "--label",
            "right",
            "--label",
            "random",
            "--label",
            "right-again",
            "--label",
            "silent",
            "--json",
        )
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    runs = {x["label"]: x for x in doc["runs"]}
    assert runs["right"]["accuracy"]["mean"] == 1.0 and runs["right"]["accuracy"]["ci_low"] > 0.9
    assert runs["silent"]["unparsable"] == 60 and runs["silent"]["right"] == 0
    paired = {x["candidate"]: x for x in doc["paired"]}
    assert paired["random"]["verdict"] == "worse" and paired["random"]["p_value"] < 0.001
    assert paired["random"]["only_candidate"] == 0 and paired["random"]["only_baseline"] > 30
    assert paired["right-again"]["verdict"] == "same" and paired["right-again"]["agreement"] == 1.0
    assert paired["silent"]["verdict"] == "worse"
    with ResultsDB.open() as db:
        run = db.run(runs["random"]["run"])
        assert run.kind == "qa" and len(db.samples(run.id)) == 60
        assert db.samples(run.id)[0].keys() >= {"id", "answer", "expected", "right", "reply"}
    shown = run_cli("results", "show", str(runs["random"]["run"]))
    assert shown.exit_code == 0, shown.stderr
    listed = run_cli("results", "list", "--kind", "qa", "--json")
    assert listed.exit_code == 0 and len(json.loads(listed.stdout)) == 4


def test_thinking_off_by_default_and_jcommonsenseqa(tmp_path: Path) -> None:
    path = tmp_path / "jc.jsonl"
    path.write_text(
        json.dumps(
            {
                "q_id": 1,
                "question": "空は何色？",
                "choice0": "赤",
                "choice1": "青",
                "choice2": "緑",
                "choice3": "黒",
                "choice4": "白",
                "label": 1,
            },
            ensure_ascii=False,
        )
    )
    qs = qa.read_questions(path, "jcommonsenseqa")
    from moetune.quality.soak import SoakOptions, request_body

    assert request_body(qs[0], SoakOptions())["chat_template_kwargs"] == {"enable_thinking": False}
    assert "chat_template_kwargs" not in request_body(qs[0], SoakOptions(thinking="template"))
    with qa_server(qs, "right") as url:
        r = run_cli("quality", "--qa", str(path), "--qa-format", "jcommonsenseqa", "--url", url)
    assert r.exit_code == 0, r.stderr
    assert "100.00" in r.stdout


def test_qa_needs_a_server(tmp_path: Path) -> None:
    path, _ = _questions(tmp_path, 2)
    r = run_cli("quality", "--qa", str(path))
    assert r.exit_code == 2 and "--url" in r.stderr
