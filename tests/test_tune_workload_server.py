"""`moetune tune --objective replay:FILE` on a session `moetune record` wrote in front of a
llama-server on the tuning testbed's model (tests/tune_testbed.py), and `--objective turn`: each
finishes within its budget, reports the workload's seconds for the baseline, the engine defaults
and the winner with intervals from repeats, the prompt tokens the server reported as reused from
its prefix cache, and files serve-bench runs that carry the objective and the file's sha256, which
`compare` pairs."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from moetune.kinds import RunKind
from moetune.store.db import ResultsDB
from tests.bench.test_record_replay import recorder
from tests.engine_harness import free_port
from tests.helpers import llama_server, run_cli
from tests.tune_testbed import make_testbed

pytestmark = pytest.mark.server

SEARCH = [
    "--ctx",
    "1024",
    "--strategy",
    "cpu-moe",
    "-t",
    "1",
    "--try-strategy",
    "auto,cpu-moe",
    "--try-threads",
    "1",
    "--try-ubatch",
    "512",
    "--try-fa",
    "on",
    "--try-cache",
    "f16/f16",
    "--try-repack",
    "off",
    "-r",
    "3",
    "--warmup",
    "1",
    "--budget",
    "2",
]


def agent_session(url: str) -> None:
    """Three turns of a conversation, each sent with the history before it and the reply it got."""
    history: list[dict[str, Any]] = [{"role": "system", "content": "You review code. " * 20}]
    with httpx.Client(trust_env=False, timeout=60) as c:
        for q in ("Review this function: def f(x): return x * 2", "And its tests?", "Summarise in one line."):
            history.append({"role": "user", "content": q})
            r = c.post(url + "/v1/chat/completions", json={"messages": history, "max_tokens": 12, "temperature": 0})
            assert r.status_code == 200, r.text
            history.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})


def check_doc(doc: dict[str, Any], name: str) -> None:
    assert doc["objective"] == name and 1 <= doc["launches"] <= 2 and doc["work"]["text"]
    for who in (doc["baseline"], doc["engine_defaults"], doc["best"]):
        m = who[name]
        assert m["n"] == 3 and m["failed"] == 0 and m["ci_low_s"] <= m["median_s"] <= m["ci_high_s"], who
        assert m["median_s"] > 0 and m["prompt_tokens_processed"] > 0
    assert doc["baseline"]["label"] == "cpu-moe t1 ub512 fa"
    assert all(c["predicted"][f"{name}_s"] > 0 for c in doc["candidates"] if c["fits"])


@pytest.mark.timeout(240)
def test_tune_replays_a_recorded_session(bin_dir: Path, tmp_path: Path) -> None:
    model, hw = make_testbed(tmp_path)
    session = tmp_path / "session.jsonl"
    with (
        llama_server(bin_dir, model, tmp_path / "server.log", "-nr", "-c", "2048", "-t", "1") as s,
        recorder(s.url, session) as rec,
    ):
        agent_session(rec.url)
        code, summary = rec.stop()
    assert code == 0 and summary["requests"] == 3
    db = tmp_path / "t.db"
    port = str(free_port())
    r = run_cli(
        "tune",
        str(model),
        "--hw",
        str(hw),
        *SEARCH,
        "--objective",
        f"replay:{session}",
        "--port",
        port,
        "--db",
        str(db),
        "--json",
    )
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    check_doc(doc, "replay")
    sha = hashlib.sha256(session.read_bytes()).hexdigest()
    assert doc["work"] == {"replay": sha, "speed": "max", "file": str(session.resolve()), "text": doc["work"]["text"]}
    assert "back to back" in doc["work"]["text"]
    # the conversation's turns meet the prefix cache their predecessors filled, as the server says
    assert doc["baseline"]["replay"]["prompt_tokens_reused"] > 0
    with ResultsDB.open(db) as h:
        runs = h.runs()
        assert {x.kind for x in runs} == {RunKind.SERVE_BENCH} and {x.sweep_id for x in runs} == {doc["tune"]}
        assert len(runs) == doc["launches"] + 1  # the engine defaults too, not counted in the budget
        for x in runs:
            assert x.meta.details["objective"] == {"name": "replay", "file": str(session.resolve()), "sha256": sha}
    base, dflt = doc["baseline"]["run"], doc["engine_defaults"]["run"]
    c = run_cli("compare", str(base), str(dflt), "--db", str(db), "--json")
    assert c.exit_code == 0, c.stderr
    assert f"replay_s:{sha[:16]}" in {row["metric"] for row in json.loads(c.stdout)["rows"]}
    human = run_cli(
        "tune",
        str(model),
        "--hw",
        str(hw),
        *SEARCH,
        "--objective",
        f"replay:{session}",
        "--port",
        port,
        "--db",
        str(db),
    )
    assert human.exit_code == 0 and "resuming tune" in human.stderr  # nothing launched again
    assert "replay total" in human.stdout and "engine defaults:" in human.stdout
    assert "time vs baseline" in human.stdout or doc["best_candidate"]["label"] == doc["baseline"]["label"]


@pytest.mark.timeout(300)
def test_tune_times_an_agent_turn(bin_dir: Path, tmp_path: Path) -> None:
    model, hw = make_testbed(tmp_path)
    db = tmp_path / "t.db"
    args = [str(model), "--hw", str(hw), *SEARCH, "--objective", "turn", "--turns", "3", "--depth", "128"]
    args += ["--pp-tokens", "32", "--tg-tokens", "8", "--port", str(free_port()), "--db", str(db), "--json"]
    r = run_cli("tune", *args)
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    check_doc(doc, "turn")
    base = doc["baseline"]["turn"]
    # 3 sessions of 3 turns: every turn after the first reuses its history, as the server reported
    assert base["requests"] == base["ok"] == 9 and base["prompt_tokens_reused"] >= 6 * 128
    with ResultsDB.open(db) as h:
        run = h.run(doc["baseline"]["run"])
        assert run.meta.details["objective"]["name"] == "turn" and run.sweep_id == doc["tune"]
        assert run.summary["levels"][0]["concurrency"] == 1  # the sessions one after another
    # the same search again with --confirm 1: the best measured launched once more, its sessions pooled
    again = run_cli("tune", *args, "--confirm", "1")
    assert again.exit_code == 0, again.stderr
    doc2 = json.loads(again.stdout)
    (c,) = doc2["confirmed"]
    assert len(c["medians"]) == 2 and all(m > 0 for m in c["medians"])
    who = next(w for w in (doc2["baseline"], doc2["engine_defaults"], doc2["best"]) if w["label"] == c["label"])
    assert who["turn"]["n"] == 6 and who["turn"]["requests"] == 18  # 3 sessions a launch, from both launches
    with ResultsDB.open(db) as h:
        assert len(h.runs(sweep_id=doc["tune"])) == doc["launches"] + 2  # the defaults, and the one again
