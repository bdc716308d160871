"""The RPC transport inside the loop: chosen per target (bench, sweep, serve-bench, tune), recorded
per run with what the workers' logs confirmed and the load time, compared (``load_s``, the
transport per run), and refused before anything starts where the hardware or the builds lack it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from moetune.bench.analysis.stats import MetricSamples
from moetune.bench.servers import launch_facts
from moetune.bench.single.runner import BenchOptions
from moetune.bench.single.sweep import load_sweep, plan_record, sweep_id
from moetune.bench.single.workloads import expand
from moetune.bench.target import Target, plan_target, resolve, with_transport
from moetune.engine.launchspec import LaunchSpec, ProcessSpec
from moetune.errors import InputError
from moetune.hardware.inventory import from_dict
from moetune.kinds import RunKind
from moetune.plan.tune import Axes, Candidate, space
from moetune.report.compare import LOAD_METRIC, RunMetrics, compare, extract
from moetune.report.compare_view import comparison_markdown
from moetune.report.paired import paired_compare
from moetune.report.paired_view import paired_markdown
from moetune.store.db import ResultsDB
from moetune.store.record import NO_RPC, LaunchRef, RunMeta
from moetune.tune.transport_axis import check_transport_axis
from tests.bench.synth import run_samples
from tests.helpers import run_cli

# -- what a run records ----------------------------------------------------------------------

MAIN = ProcessSpec(
    name="main",
    role="server",
    engine="llama.cpp",
    argv=("-m", "m.gguf", "--rpc", "127.0.0.1:50052"),
    host="127.0.0.1",
    port=8080,
    after=("rpc0",),
)


@pytest.mark.parametrize(
    ("server", "workers", "asked", "transport", "confirmed"),
    [
        (MAIN, {"rpc0": "TCP"}, "tcp", "tcp", "TCP"),
        (MAIN, {"rpc0": "RDMA", "rpc1": "TCP"}, "rdma", "rdma", "RDMA"),  # another server's worker is not this one's
        (MAIN, {"rpc0": None}, "auto", "auto", "unknown"),  # the log told nothing
        (
            ProcessSpec(
                name="main", role="server", engine="llama.cpp", argv=("-m", "m.gguf"), host="127.0.0.1", port=8080
            ),
            {},
            "tcp",
            NO_RPC,
            NO_RPC,
        ),
        (
            ProcessSpec(
                name="main",
                role="server",
                engine="llama.cpp",
                argv=("--rpc", "10.0.0.2:50052"),
                host="127.0.0.1",
                port=8080,
            ),
            {},
            "tcp",
            "tcp",
            "unknown",
        ),  # a worker the plan does not start: asked, but no log here to confirm it
    ],
)
def test_launch_facts(
    server: ProcessSpec, workers: dict[str, str | None], asked: str, transport: str, confirmed: str
) -> None:
    f = launch_facts(server, asked, workers, started_at=100.0, ready_at=103.25)
    assert (f.transport, f.confirmed, f.load_s) == (transport, confirmed, pytest.approx(3.25))
    assert set(f.workers) <= set(server.after)
    assert LaunchRef.from_json(json.loads(json.dumps(f.to_json()))) == f
    assert (
        launch_facts(server, asked, workers, started_at=100.0, ready_at=None).load_s is None
    )  # never healthy: no load time


def test_launch_ref_in_the_run_record() -> None:
    ref = LaunchRef("tcp", {"rpc0": "TCP"}, 3.2)
    assert ref.describe() == "TCP (asked tcp; rpc0 TCP), loaded in 3.2 s"
    assert LaunchRef(NO_RPC, {}, 1.0).describe() == "none (no RPC worker), loaded in 1.0 s"
    assert LaunchRef("auto", {"rpc0": "TCP", "rpc1": "RDMA"}).confirmed == "RDMA+TCP"
    meta = RunMeta(kind=RunKind.BENCH, launch=ref)
    assert RunMeta.from_json(json.loads(json.dumps(meta.to_json())), "bench").launch == ref
    old = meta.to_json()
    del old["launch"]  # written before runs recorded their launch
    assert RunMeta.from_json(old, "bench").launch is None


def test_the_target_carries_the_transport(tmp_path: Path) -> None:
    url = resolve("127.0.0.1:8080")
    assert with_transport(url, None) is url
    with pytest.raises(InputError, match="TARGET is a running server's URL"):
        with_transport(url, "tcp")
    plan = Target(plan_path=tmp_path / "p.json")
    assert with_transport(plan, "rdma", "rocep1s0f1") == Target(
        plan_path=tmp_path / "p.json", transport="rdma", rdma_dev="rocep1s0f1"
    )
    with pytest.raises(InputError, match="choose tcp, rdma, auto"):
        with_transport(plan, "udp")


# -- sweeps over transports --------------------------------------------------------------------


def _plan(path: Path, label: str) -> Path:
    procs = (
        ProcessSpec(name="rpc0", role="rpc", engine="llama.cpp", argv=(), host="127.0.0.1", port=50052),
        ProcessSpec(
            name="main",
            role="server",
            engine="llama.cpp",
            argv=("-m", "m.gguf", "--rpc", "127.0.0.1:50052"),
            host="127.0.0.1",
            port=8080,
            after=("rpc0",),
        ),
    )
    path.write_text(json.dumps({"label": label, "launch": LaunchSpec(procs).to_json()}))
    return path


def test_sweep_one_plan_over_two_transports(tmp_path: Path) -> None:
    a, b = _plan(tmp_path / "a.json", "a"), _plan(tmp_path / "b.json", "b")
    spec = load_sweep([a, b], transports=("tcp", "rdma"))
    assert [(e.label, e.target.transport) for e in spec.entries] == [
        ("a (tcp)", "tcp"),
        ("a (rdma)", "rdma"),
        ("b (tcp)", "tcp"),
        ("b (rdma)", "rdma"),
    ]
    assert [p.get("transport") for p in plan_record(spec)] == [None, "rdma", None, "rdma"]
    one = load_sweep([a], transports=("auto",))
    assert [(e.label, e.target.transport) for e in one.entries] == [("a", "auto")]

    ws, opt = expand(["short-json"], []), BenchOptions()
    plain = load_sweep([a, b])
    assert sweep_id(plain, ws, opt) == sweep_id(load_sweep([a, b], transports=("tcp",)), ws, opt)  # tcp: as before
    assert sweep_id(plain, ws, opt) != sweep_id(load_sweep([a, b], transports=("auto",)), ws, opt)


def test_sweep_file_plans_differing_only_in_transport(tmp_path: Path) -> None:
    _plan(tmp_path / "p.json", "p")
    f = tmp_path / "s.yaml"
    f.write_text(
        yaml.safe_dump(
            {
                "plans": [
                    {"label": "over tcp", "plan": "p.json"},
                    {"label": "over rdma", "plan": "p.json", "transport": "rdma"},
                ]
            }
        )
    )
    spec = load_sweep([f])
    assert [(e.label, e.target.transport) for e in spec.entries] == [("over tcp", "tcp"), ("over rdma", "rdma")]
    with pytest.raises(InputError, match="sets its transport; --transport sets every plan's"):
        load_sweep([f], transports=("tcp",))
    f.write_text(yaml.safe_dump({"plans": [{"plan": "p.json", "transport": "ib"}]}))
    with pytest.raises(InputError, match="transport 'ib': choose tcp, rdma, auto"):
        load_sweep([f])


@pytest.mark.parametrize(
    ("args", "msg"),
    [
        (("bench", "127.0.0.1:9", "--transport", "tcp"), "TARGET is a running server's URL"),
        (("bench", "127.0.0.1:9", "--transport", "tcp,rdma"), "one transport here"),
        (("serve-bench", "127.0.0.1:9", "--transport", "rdma"), "TARGET is a running server's URL"),
        (("sweep", "x.json", "--transport", "tcp,udp"), "choose tcp, rdma, auto"),
        (("launch", "x.json", "--transport", "ib"), "choose tcp, rdma, auto"),
    ],
)
def test_transport_option_errors(args: tuple[str, ...], msg: str) -> None:
    r = run_cli(*args)
    assert r.exit_code == 2 and msg in r.stderr, r.stderr


def test_rdma_refused_before_any_launch_on_builds_without_it(tmp_path: Path, bin_dir: Path) -> None:
    """This machine's builds have no RDMA: bench and sweep refuse it before a process starts."""
    from moetune.paths import runs_dir
    from tests.bench.servers import write_plan

    model = tmp_path / "m.gguf"
    model.write_bytes(b"")  # never read: the refusal comes first
    plan = write_plan(tmp_path / "p.json", model, rpc=True)
    for args in (
        ("bench", str(plan), "--transport", "rdma"),
        ("sweep", str(plan), "--transport", "tcp,rdma", "--interleave"),
    ):
        r = run_cli(*args)
        assert r.exit_code == 2, r.stderr
        assert "--transport rdma: no RDMA transport in the engine build of rpc0" in r.stderr
    assert not runs_dir().exists() or not any(runs_dir().iterdir())  # nothing was started
    with pytest.raises(InputError, match="no RDMA transport"):
        from moetune.bench.servers import check_transport

        check_transport(with_transport(plan_target(plan), "rdma"))


# -- compare: load_s and the transport per run -------------------------------------------------


def _run(db: ResultsDB, label: str, tg: float, launch: LaunchRef | None) -> int:
    rid = db.create_run(RunMeta(kind=RunKind.BENCH, launch=launch), label=label, target="p.json")
    for s in run_samples([tg * f for f in (0.999, 1.0, 1.001)]):
        db.add_sample(rid, s)
    db.finish_run(rid)
    return rid


def test_compare_has_load_s_and_the_transport(tmp_path: Path) -> None:
    with ResultsDB.open(tmp_path / "r.sqlite") as db:
        a = _run(db, "tcp", 20.0, LaunchRef("tcp", {"rpc0": "TCP"}, 64.0))
        b = _run(db, "rdma", 20.0, LaunchRef("rdma", {"rpc0": "RDMA"}, 80.0))
        c = _run(db, "url", 20.0, None)
        ra, rb, rc = (extract(db.run(x), db.iter_samples(x)) for x in (a, b, c))
    assert ra.metrics[LOAD_METRIC] == MetricSamples(values=(64.0,), higher_is_better=False, unit="s", family="load")
    assert (ra.transport, rb.transport, rc.transport) == ("TCP", "RDMA", None) and LOAD_METRIC not in rc.metrics
    comp = compare(ra, [rb, rc])
    row = next(r for r in comp.rows if r.metric == LOAD_METRIC and r.run == b)
    assert row.change_pct == pytest.approx(25.0) and row.verdict == "same"  # one launch each: never significant
    assert comp.to_json()["transports"] == {str(a): "TCP", str(b): "RDMA", str(c): None}
    md = comparison_markdown(comp)
    assert "| configuration | run | transport | load_s |" in md and f"| rdma | {b} | RDMA |" in md
    assert f"| url | {c} | - |" in md
    plain = compare(rc, [launched_as(ra, NO_RPC)])
    assert "transport" not in comparison_markdown(plain)  # no run used RPC: no column


def launched_as(r: RunMetrics, transport: str) -> RunMetrics:
    return RunMetrics(run=r.run, label=r.label, kind=r.kind, status=r.status, metrics=r.metrics, transport=transport)


def test_paired_load_s_over_rounds_gives_a_verdict() -> None:
    """Reference 004's A/B by hand (TCP 64 s, RDMA 80 s to load), as an interleaved sweep pairs it."""

    def rm(run: int, label: str, load_s: float, transport: str) -> RunMetrics:
        return RunMetrics(
            run=run,
            label=label,
            kind="bench",
            status="done",
            metrics={
                "tg:short-json": MetricSamples(
                    values=(20.0, 20.1, 19.9), higher_is_better=True, unit="tokens/s", family="tg"
                ),
                LOAD_METRIC: MetricSamples(values=(load_s,), higher_is_better=False, unit="s", family="load"),
            },
            transport=transport,
        )

    loads = {1: (64.0, 80.0), 2: (63.0, 81.0), 3: (65.0, 79.5)}
    metrics = {}
    rounds = {}
    for k, (t, r) in loads.items():
        metrics[2 * k] = rm(2 * k, "tcp", t, "TCP")
        metrics[2 * k + 1] = rm(2 * k + 1, "rdma", r, "RDMA")
        rounds[k] = {"tcp": 2 * k, "rdma": 2 * k + 1}
    c = paired_compare(rounds, metrics, "tcp", sweep="sw-x", mode="launches")
    load = next(r for r in c.rows if r.metric == LOAD_METRIC)
    assert load.verdict == "slower" and 23 < load.paired.change_pct < 27 and not load.higher_is_better
    assert c.to_json()["transports"] == {"tcp": "TCP", "rdma": "RDMA"}
    assert "transport (confirmed at launch): tcp TCP, rdma RDMA" in paired_markdown(c)


def test_results_show_the_transport_and_load_time(tmp_path: Path) -> None:
    db_path = tmp_path / "r.sqlite"
    with ResultsDB.open(db_path) as db:
        rid = _run(db, "tcp", 20.0, LaunchRef("tcp", {"rpc0": "TCP"}, 3.2))
    r = run_cli("results", "show", str(rid), "--db", str(db_path))
    assert r.exit_code == 0, r.stderr
    assert "transport: TCP (asked tcp; rpc0 TCP), loaded in 3.2 s" in r.stdout
    j = json.loads(run_cli("results", "show", str(rid), "--db", str(db_path), "--json").stdout)
    assert j["run"]["launch"] == {"transport": "tcp", "confirmed": "TCP", "workers": {"rpc0": "TCP"}, "load_s": 3.2}


# -- tune: a transport axis only where the link has RDMA ---------------------------------------


def _hw(rdma: bool | None) -> dict[str, object]:
    nodes: list[dict[str, object]] = [{"name": "a", "cpu": {"cores": 4, "ram_mib": 8000, "ram_bw_gbs": 20}}]
    if rdma is not None:
        nodes.append(
            {
                "name": "b",
                "link_addr": "192.168.100.2",
                "rdma": rdma,
                "cpu": {"cores": 4, "ram_mib": 8000, "ram_bw_gbs": 20},
                "devices": [{"name": "CUDA0", "mem_mib": 100000, "bw_gbs": 273}],
            }
        )
    return {"nodes": nodes}


@pytest.mark.parametrize(
    ("rdma", "transports", "msg"),
    [
        (None, ("tcp",), None),
        (None, ("tcp", "rdma"), "has no RPC node"),
        (False, ("tcp", "rdma"), "does not say that the link to node b carries RDMA"),
        (False, ("rdma",), "--transport rdma: the hardware file does not say"),
        (False, ("tcp", "auto"), "does not say that the link to node b carries RDMA"),  # a choice needs both
        (False, ("auto",), None),
        (True, ("tcp", "rdma"), None),
    ],
)
def test_transport_axis_needs_rdma_on_the_link(rdma: bool | None, transports: tuple[str, ...], msg: str | None) -> None:
    hw = from_dict(_hw(rdma))
    if msg is None:
        check_transport_axis(transports, hw)
    else:
        with pytest.raises(InputError, match=msg):
            check_transport_axis(transports, hw)


def test_transport_axis_doubles_the_space() -> None:
    from moetune.plan.settings import Settings

    base = Settings()
    axes = Axes(
        strategies=("auto",),
        threads=(None,),
        ubatches=(512,),
        flash_attn=(True,),
        cache_types=(("f16", "f16"),),
        transports=("tcp", "rdma"),
    )
    cands = space(axes, base)
    assert [c.transport for c in cands] == ["tcp", "rdma"]
    assert [c.label for c in cands] == ["auto t-default ub512 fa", "auto t-default ub512 fa rdma"]
    assert Candidate(strategy="auto").transport == "tcp"


def test_tune_refuses_transports_before_any_launch(tmp_path: Path, models: Path, bin_dir: Path) -> None:
    """Without `rdma: true` on the link: no transport axis; with it, this machine's builds still lack
    RDMA: refused before the baseline launches."""
    from moetune.paths import runs_dir
    from tests.bench.servers import model
    from tests.helpers import free_port, loopback_hw

    m = model(models, "transport-tiny", n_layer=2)
    hw_doc = loopback_hw([f"127.0.0.1:{free_port()}"])
    hw = tmp_path / "hw.yaml"
    hw.write_text(yaml.safe_dump(hw_doc))
    args = ("tune", str(m), "--hw", str(hw), "--budget", "2", "--db", str(tmp_path / "r.sqlite"))
    r = run_cli(*args, "--try-transport", "tcp,rdma")
    assert r.exit_code == 2
    assert (
        "--try-transport tcp,rdma: the hardware file does not say that the link to node w0 carries RDMA" in r.stderr
        and "rdma: true" in r.stderr
    )
    hw_doc["nodes"][1]["rdma"] = True
    hw.write_text(yaml.safe_dump(hw_doc))
    r = run_cli(*args, "--try-transport", "tcp,rdma")
    assert r.exit_code == 2 and "--transport rdma: no RDMA transport in the engine build of" in r.stderr, r.stderr
    assert not runs_dir().exists() or not any(runs_dir().iterdir())
    r = run_cli(*args, "--try-transport", "tcp,udp")
    assert r.exit_code == 2 and "expected a comma list" in r.stderr
