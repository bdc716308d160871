"""`serve-bench LAYOUT --load SERVICE=SPEC`: the SPEC read in one place, every mistake told with the
service and the key; and a layout run's figures (levels per service and load, the slowdown with its
interval, what was busy) from samples and snapshots made to order."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from moetune.bench.analysis.layout import alone_phase, busy, contention
from moetune.bench.analysis.serve import ALONE, SHARED, LevelSeries, summarize_levels
from moetune.bench.serve.loadspec import parse_loads, parse_spec, service_load
from moetune.bench.serve.request import RequestRecord
from moetune.errors import InputError
from moetune.monitor.snapshot import HostSample, ProcSample, Snapshot


def test_a_spec_reads_serve_bench_options_and_their_short_names(tmp_path: Path) -> None:
    (main, worker) = parse_loads(
        ["main=concurrency:1,requests:8,prompt:512,output:64", "worker0=c:4,duration:2.5,input-len:32,prefix-cache"]
    )
    assert main.service == "main" and main.kind == "synthetic" and main.concurrency == 1
    assert main.spec.requests == 8 and main.spec.input_len == 512 and main.spec.output_len == 64
    assert worker.concurrency == 4 and worker.spec.duration_s == 2.5 and worker.spec.prefix_cache
    assert main.describe() == "c=1, 8 requests of 512 prompt tokens -> 64 output"
    data = tmp_path / "chat.json"
    data.write_text("[]")
    (d,) = parse_loads([f"coder=dataset:{data},c:2"])
    assert d.kind == "dataset" and d.spec.dataset == data
    (s,) = parse_loads(["agent=sessions:2,turns:3,turn-tokens:64,strip-thinking"])
    assert s.kind == "sessions" and s.concurrency == 2 and s.spec.sessions is not None
    assert s.spec.sessions.turns == 3 and s.spec.sessions.strip_thinking
    rec = tmp_path / "s.jsonl"
    rec.write_text("")
    (r,) = parse_loads([f"editor=replay:{rec},speed:max"])
    assert r.kind == "replay" and r.replay == rec and r.speed == "max" and r.concurrency == 0


def test_the_command_lines_options_are_every_services_defaults() -> None:
    (a, b) = parse_loads(["a=c:1", "b=c:3,output:8"], {"output-len": 16, "requests": 4})
    assert a.spec.output_len == 16 and b.spec.output_len == 8 and a.spec.requests == b.spec.requests == 4
    assert b.keys == ("concurrency", "output-len")


@pytest.mark.parametrize(
    ("load", "says"),
    [
        ("main", "give SERVICE=SPEC"),
        ("=c:1", "give SERVICE=SPEC"),
        ("main=", "the SPEC is empty"),
        ("main=conc:2", "unknown key 'conc'"),
        ("main=c:0", "concurrency:0 is not an integer, at least 1"),
        ("main=c:two", "concurrency:two is not an integer, at least 1"),
        ("main=rate:0", "rate:0 is not a number above 0"),
        ("main=requests", "'requests' needs a value"),
        ("main=c:1,c:2", "'concurrency' is given twice"),
        ("main=thinking:maybe", "thinking:maybe is not on or off or default"),
        ("main=dataset:/no/such.json", "dataset:/no/such.json is not an existing file"),
        ("main=requests:4,duration:2", "requests and duration do not go together"),
        ("main=speed:2x", "speed paces a replay"),
        ("main=turns:3", "turns shape agent sessions"),
        ("main=sessions:2,c:4", "sessions run conversations, not load levels: concurrency"),
        ("main=sessions:2,strip-thinking,thinking:off", "strip-thinking removes the reasoning"),
    ],
)
def test_a_bad_spec_names_the_service_and_the_key(load: str, says: str) -> None:
    with pytest.raises(InputError) as e:
        parse_loads([load])
    assert says in str(e.value), str(e.value)
    if load.startswith("main="):
        assert "--load main" in str(e.value)


def test_a_replay_takes_no_prompt_shaping_and_a_service_is_loaded_once(tmp_path: Path) -> None:
    rec = tmp_path / "s.jsonl"
    rec.write_text("")
    with pytest.raises(InputError, match="drop input-len"):
        parse_loads([f"e=replay:{rec},input-len:32"])
    with pytest.raises(InputError, match="given twice"):
        parse_loads(["a=c:1", "a=c:2"])
    assert parse_spec("x", "c:2,,") == {"concurrency": 2}
    assert service_load("x", {}).concurrency == 1  # the defaults alone: serve-bench's


def _sample(service: str, load: str, tpot_ms: float, i: int, *, c: int = 1) -> dict[str, Any]:
    """A finished request of 16 tokens, its first after 50 ms, then one every ``tpot_ms``."""
    rec = RequestRecord(index=i, concurrency=c, rate=None, prompt_tokens=32, max_tokens=16, t_sched=float(i))
    rec.t_slot = rec.t_first_send = rec.t_attempt = rec.t_send = float(i)
    rec.t_headers = i + 0.01
    first = i + 0.05
    rec.chunks = [[first + k * tpot_ms / 1000, 1, 1, 0, None, None] for k in range(16)]
    rec.t_end = first + 15 * tpot_ms / 1000 + 0.001
    rec.status, rec.finish_reason, rec.count_source = 200, "length", "timings"
    rec.usage = {"prompt_tokens": 32, "completion_tokens": 16}
    return {**rec.to_sample(), "service": service, "load": load, "round": 0}


def _run(rng: random.Random) -> list[dict[str, Any]]:
    """main slows down 3x under the shared load; worker does not."""
    out = []
    for i in range(12):
        out.append(_sample("main", ALONE, 20 * rng.uniform(0.9, 1.1), i))
        out.append(_sample("worker", ALONE, 10 * rng.uniform(0.9, 1.1), 100 + i, c=2))
    for i in range(12):
        out.append(_sample("main", SHARED, 60 * rng.uniform(0.9, 1.1), 200 + i))
        out.append(_sample("worker", SHARED, 10 * rng.uniform(0.9, 1.1), 300 + i, c=2))
    return out


def test_the_slowdown_of_the_loaded_service_with_its_interval() -> None:
    samples = _run(random.Random(1))
    rows = {(r.service, r.metric): r for r in contention(samples)}
    tpot = rows[("main", "tpot")]
    assert tpot.n_alone == tpot.n_shared == 12
    assert 2.5 < tpot.slowdown < 3.5 and tpot.ci_low > 2 and tpot.verdict == "slower"
    assert 18 < tpot.alone < 22 and 54 < tpot.shared < 66
    decode = rows[("main", "decode")]  # a speed: slower is a slowdown above 1 too
    assert 2.5 < decode.slowdown < 3.5 and decode.verdict == "slower"
    worker = rows[("worker", "tpot")]
    assert worker.ci_low < 1 < worker.ci_high and worker.verdict == "same"
    assert json.loads(json.dumps(tpot.to_json()))["slowdown_ci"][0] == tpot.ci_low


def test_an_unbounded_slowdown_is_stored_as_null_and_read_as_inf() -> None:
    """A speed whose interval reaches 0 under the shared load has no upper bound on its slowdown: the
    run's summary (JSON without NaN or infinity) keeps null, and the tables read it inf."""
    import math

    from moetune.bench.analysis.layout import Slowdown
    from moetune.report.layout_view import slowdown_text

    row = Slowdown(
        service="main", metric="decode", unit="tokens/s", n_alone=3, n_shared=3, alone=10.0, shared=0.0,
        slowdown=math.inf, ci_low=2.0, ci_high=math.inf, verdict="slower",
    ).to_json()  # fmt: skip
    assert row["slowdown"] is None and row["slowdown_ci"] == [2.0, None]
    json.dumps(row, allow_nan=False)
    assert slowdown_text(row) == "inf [2.00, inf]"


def test_levels_and_compare_metrics_per_service_and_load() -> None:
    samples = _run(random.Random(2))
    levels = summarize_levels(samples)
    assert [(lv["service"], lv["load"], lv["concurrency"], lv["ok"]) for lv in levels] == [
        ("main", ALONE, 1, 12),
        ("worker", ALONE, 2, 12),
        ("main", SHARED, 1, 12),
        ("worker", SHARED, 2, 12),
    ]
    series = LevelSeries()
    for s in samples:
        series.add(s)
    names = set(series.metrics())
    assert {"tpot:main:c=1", "tpot:main:c=1:alone", "decode:worker:c=2", "ttft:worker:c=2:alone"} <= names
    # a run of one server keeps its names
    plain = LevelSeries()
    plain.add({k: v for k, v in samples[0].items() if k not in ("service", "load")})
    assert set(plain.metrics()) == {"ttft:c=1", "itl:c=1", "tpot:c=1", "e2e:c=1", "decode:c=1"}


def test_busy_says_which_process_was_busy_in_each_phase() -> None:
    def snap(t: float, phase: str, main: float, worker: float) -> Snapshot:
        return Snapshot(
            t=t,
            host=HostSample(cpu_pct=(90.0, 80.0)),
            phase=phase,
            procs=(
                ProcSample(name="main", role="server", node="local", pid=1, cpu_pct=main),
                ProcSample(name="worker", role="server", node="local", pid=2, cpu_pct=worker),
            ),
        )

    snaps = [
        snap(0, "prepare", 5, 5),
        snap(1, alone_phase("main"), 50, 0),
        snap(2, alone_phase("main"), 190, 1),
        snap(3, alone_phase("main"), 170, 1),
        snap(4, "shared", 150, 0),
        snap(5, "shared", 100, 100),
        snap(6, "shared", 100, 90),
    ]
    rows = {b.phase: b for b in busy(snaps, [alone_phase("main"), alone_phase("worker"), "shared"])}
    alone = rows["alone main"]
    assert alone.snapshots == 2 and alone.cpu_cores["main"] == pytest.approx(1.8) and alone.cpu_cores["worker"] == 0.01
    assert rows["alone worker"].snapshots == 0
    assert busy([snap(0, "shared", 10, 10)], ["shared"])[0].snapshots == 0  # its interval began before the phase
    shared = rows["shared"]
    assert shared.cpu_cores == {"main": 1.0, "worker": 0.95} and shared.host_cpu_pct == 85.0


def test_a_layout_runs_services_are_stored_with_it(tmp_path: Path) -> None:
    from moetune.kinds import RunKind
    from moetune.store.db import ResultsDB
    from moetune.store.record import LaunchRef, RunMeta, ServerInfo, ServiceRecord

    with ResultsDB.open(tmp_path / "h.db") as db:
        rid = db.create_run(
            RunMeta(kind=RunKind.SERVE_BENCH, details={"layout": {"services": ["b", "a"]}}),
            label="l",
            target="plan.json",
        )
        recs = [
            ServiceRecord(
                name="b",
                position=0,
                server=ServerInfo(url="http://127.0.0.1:1", slots=2),
                launch=LaunchRef("tcp", {"rpc0": "TCP"}, 1.5),
                argv=("-m", "x.gguf"),
                workload={"kind": "synthetic"},
            ),
            ServiceRecord(name="a", position=1, server=ServerInfo(url="http://127.0.0.1:2")),
        ]
        for r in recs:
            db.add_service(rid, r)
        assert db.services(rid) == recs
        other = db.create_run(RunMeta(kind=RunKind.SERVE_BENCH), label="one", target="u")
        assert db.services(other) == []


def _two_servers(path: Path) -> Path:
    from moetune.engine.launchspec import LaunchSpec, ProcessSpec

    procs = (
        ProcessSpec(name="main", role="server", engine="llama.cpp", argv=("-m", "/m.gguf"), host="127.0.0.1", port=1),
        ProcessSpec(
            name="worker0", role="server", engine="llama.cpp", argv=("-m", "/w.gguf"), host="127.0.0.1", port=2
        ),
    )
    path.write_text(json.dumps({"launch": LaunchSpec(procs).to_json()}))
    return path


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--load", "main=conc:1"], "--load main=conc:1: unknown key 'conc'"),
        (["--load", "coder=c:1"], "--load coder=: PLAN has no such server (servers: main, worker0)"),
        (["--rounds", "2"], "--rounds counts the rounds of a layout's --load"),
        (["--concurrency", "1,2", "--load", "main=c:1"], "with --load each service runs one level"),
        (["--load", "main=c:1", "--server", "main"], "--server does not apply with --load"),
        (["--load", "main=c:1", "--load", "main=c:2"], "--load main= is given twice"),
    ],
)
def test_serve_bench_refuses_a_bad_load_before_launching(tmp_path: Path, args: list[str], says: str) -> None:
    from tests.helpers import run_cli

    plan = _two_servers(tmp_path / "plan.json")
    r = run_cli("serve-bench", str(plan), *args)
    assert r.exit_code == 2, (r.stdout, r.stderr)
    assert says.replace("PLAN", str(plan.resolve())) in r.stderr, r.stderr
    assert "starting" not in r.stderr


def test_a_load_needs_a_plan_not_a_url() -> None:
    from tests.helpers import run_cli

    r = run_cli("serve-bench", "http://127.0.0.1:9", "--load", "main=c:1")
    assert r.exit_code == 2 and "TARGET is a server URL" in r.stderr, r.stderr
