"""`tune --layout FILE --service NAME`: one service tuned while the layout's others keep their
placements (tests/tune_testbed.py's model, one loopback RPC device; nothing starts)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from moetune.bench.single.runner import BenchOptions
from moetune.bench.single.workloads import expand
from moetune.errors import InputError
from moetune.plan.settings import Settings
from moetune.tune.loop import TuneRequest, candidates
from tests.helpers import run_cli
from tests.tune_testbed import make_testbed

SMALL = {
    "threads": (1,),
    "ubatches": (128,),
    "flash_attn": (True,),
    "cache_types": (("f16", "f16"),),
    "repack": (False,),
    "strategies": ("cpu-moe", "auto", "all-gpu"),
}


def layout(tmp_path: Path, model: Path, worker_strategy: str, devices: tuple[str, str] | None = None) -> Path:
    """Two services of the testbed's model; ``devices``: each its own RPC device (main's, worker's)."""
    p = tmp_path / "layout.yaml"
    own = ({"devices": [devices[0]]}, {"devices": [devices[1]]}) if devices else ({}, {})
    p.write_text(
        yaml.safe_dump(
            {
                "services": [
                    {"name": "main", "model": str(model), "strategy": "cpu-moe", "ctx": 512, "ubatch": 128, **own[0]},
                    {
                        "name": "worker",
                        "model": str(model),
                        "strategy": worker_strategy,
                        "ctx": 512,
                        "ubatch": 128,
                        **own[1],
                    },
                ]
            }
        )
    )
    return p


def request(tmp_path: Path, rpc_mem_mib: float, worker_strategy: str = "all-gpu", service: str = "main") -> TuneRequest:
    model, hw = make_testbed(tmp_path, rpc_mem_mib=rpc_mem_mib)
    (w,) = expand([], [], depths=[0], pp_tokens=64, tg_tokens=16)
    return TuneRequest(
        hw=str(hw),
        model="",
        base=Settings(threads=1),
        workload=w,
        options=BenchOptions(),
        axes=SMALL,
        layout=layout(tmp_path, model, worker_strategy),
        service=service,
    )


def test_no_candidate_takes_the_others_memory(tmp_path: Path) -> None:
    """The worker holds the whole model on the RPC device; the tuned service's candidates get what is
    left: all-gpu, which fits alone, does not fit beside it, and auto places fewer experts there."""
    entries, _ = candidates(request(tmp_path, 110), lambda s: None)
    by = {e.candidate.strategy: e for e in entries}
    assert set(by) == {"cpu-moe", "auto", "all-gpu"}
    worker = by["cpu-moe"].plan.services[1]
    assert (
        worker.spec.name == "worker"
        and set(worker.placement.experts().values()) != {"CPU"}
        and len(set(worker.placement.experts().values())) == 1
    )
    for e in entries:  # the worker's placement never moves, whatever the candidate
        assert [sp.spec.name for sp in e.plan.services] == ["main", "worker"]
        assert e.plan.services[1].placement == worker.placement
    assert not by["all-gpu"].fits
    assert by["cpu-moe"].fits and by["auto"].fits
    alone, _ = candidates(
        TuneRequest(
            hw=request(tmp_path, 110).hw,
            model=str(tmp_path / "tune-model.gguf"),
            base=Settings(threads=1),
            workload=request(tmp_path, 110).workload,
            options=BenchOptions(),
            strategy="cpu-moe",
            axes=SMALL,
        ),
        lambda s: None,
    )
    alone_by = {e.candidate.strategy: e for e in alone}
    assert alone_by["all-gpu"].fits  # the reservation, not the device, is what keeps it out
    on_rpc = sum(1 for d in by["auto"].plan.main.placement.experts().values() if d != "CPU")
    alone_on_rpc = sum(1 for d in alone_by["auto"].plan.main.placement.experts().values() if d != "CPU")
    assert on_rpc < alone_on_rpc
    # the candidates' documents are the whole layout: the winner's plan launches both services
    assert [sj["name"] for sj in by["auto"].doc["services"]] == ["main", "worker"]
    # one rpc-server serves one client at a time: the plan says the two would share it
    assert any(
        "all use the RPC worker" in w["message"] and "(node w0)" in w["message"] for w in by["auto"].doc["warnings"]
    )


def test_an_unknown_service_is_named_with_the_layouts(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"--service coder: .* has no such service \(services: main, worker\)"):
        candidates(request(tmp_path, 110, service="coder"), lambda s: None)


def test_the_cli_wants_a_model_or_a_layout_with_a_service(tmp_path: Path) -> None:
    model, hw = make_testbed(tmp_path)
    lay = layout(tmp_path, model, "cpu-moe")
    for args in ([str(model), "--layout", str(lay), "--service", "main"], [], ["--layout", str(lay)]):
        r = run_cli("tune", *args, "--hw", str(hw))
        assert r.exit_code == 2, (args, r.stderr)
        assert "--layout" in r.stderr


@pytest.mark.server
def test_tune_one_service_of_a_running_layout(bin_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two launches of the main service's candidates, each with the worker started beside it (idle,
    on its own RPC device); the winner written with -o is the whole layout's plan."""
    import json

    import moetune.tune.loop as loop

    monkeypatch.setattr(loop.core, "choose", lambda belief, best, open_, noise, gains: (open_[0], 1.0))

    from moetune.hardware.inventory import load
    from tests.engine_harness import free_port
    from tests.tune_testbed import WORKLOAD

    model, hw = make_testbed(tmp_path, rpc_mem_mib=110, rpc_devices=2)
    first, second = (d.name for d in load(hw).accelerators())  # RPC0[127.0.0.1:PORT] of each worker
    lay = layout(tmp_path, model, "all-gpu", devices=(first, second))  # an rpc-server serves one client
    out = tmp_path / "best.json"
    r = run_cli(
        "tune",
        "--layout",
        str(lay),
        "--service",
        "main",
        "--hw",
        str(hw),
        "-t",
        "1",
        "--try-strategy",
        "cpu-moe,auto,all-gpu",
        "--try-threads",
        "1",
        "--try-ubatch",
        "128",
        "--try-fa",
        "on",
        "--try-cache",
        "f16/f16",
        "--try-repack",
        "off",
        "--repack",
        "off",
        *WORKLOAD,
        "--port",
        str(free_port()),
        "--budget",
        "2",
        "--max-pp-loss",
        "100",
        "-o",
        str(out),
        "--db",
        str(tmp_path / "t.db"),
        "--json",
    )
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    by = {c["label"]: c for c in doc["candidates"]}
    assert doc["launches"] == 2 and sum(c["launched"] for c in by.values()) == 2
    assert "worker: starting" in r.stderr  # the other service runs beside each candidate
    best = json.loads(out.read_text())
    assert [sj["name"] for sj in best["services"]] == ["main", "worker"] and best["fits"]
    assert not [w for w in best["warnings"] if "RPC worker" in (w["message"] or "")]
    assert doc["engine_defaults"]["run"] is not None  # the engine's own choices, the main model alone
    assert doc["defaults_win"] is None  # never the recommendation of a layout: their plan is the main model alone


@pytest.mark.server
def test_tune_one_service_while_the_others_serve_their_load(
    bin_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--with-load: each candidate of the CPU-only main service is measured alone and while the
    worker (its model on a loopback rpc-server device) serves four streams on the same two cores;
    the objective is main's TG under the load (slower than alone where main takes both cores),
    stored in the tune's runs."""
    import json

    import moetune.tune.loop as loop

    # the second launch whatever the noise says (under load the interval is wide, and the search may stop)
    monkeypatch.setattr(loop.core, "choose", lambda belief, best, open_, noise, gains: (open_[0], 1.0))

    from moetune.model.archs import Dims
    from moetune.model.testmodel import generate
    from moetune.store.db import ResultsDB
    from tests.engine_harness import free_port

    model, hw = make_testbed(tmp_path, rpc_mem_mib=16000)
    worker = tmp_path / "worker.gguf"
    generate(worker, "qwen3moe", Dims(n_layer=2), "f16")
    lay = tmp_path / "loaded.yaml"
    lay.write_text(
        yaml.safe_dump(
            {
                "services": [
                    {"name": "main", "model": str(model), "devices": [], "ctx": 1024, "ubatch": 128},
                    {"name": "worker", "model": str(worker), "strategy": "all-gpu", "parallel": 4, "ctx": 2048},
                ]
            }
        )
    )
    db = tmp_path / "t.db"
    r = run_cli(
        "tune", "--layout", str(lay), "--service", "main", "--hw", str(hw), "-t", "1",
        "--try-threads", "1,2", "--try-ubatch", "128", "--try-fa", "on", "--try-cache", "f16/f16",
        "--try-repack", "off", "--repack", "off", "--depth", "0", "--pp-tokens", "64", "--tg-tokens", "24",
        "-r", "5", "--warmup", "1", "--with-load", "worker=c:4,requests:8,prompt:128,output:64,warmup:1",
        "--port", str(free_port()), "--budget", "2", "--max-pp-loss", "100", "--db", str(db), "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["with_load"][0]["service"] == "worker" and doc["engine_defaults"] is None
    launched = [c for c in doc["candidates"] if c["launched"]]
    assert len(launched) == 2
    # the worker's load slows main where both want every core: main at -t 2 beside the worker's four
    # streams (main at -t 1 leaves the worker a core of its own, and measures within noise of alone)
    both = next(c["measured"] for c in launched if " t2 " in c["label"])
    assert both["tg_tok_s"]["median"] < 0.8 * both["alone"]["tg_tok_s"]["median"]
    with ResultsDB.open(db) as h:
        runs = [h.run(c["measured"]["run"]) for c in launched]
    assert all(run.kind == "serve-bench" and run.sweep_id == doc["tune"] for run in runs)
    bad = run_cli("tune", "--layout", str(lay), "--service", "main", "--hw", str(hw), "--with-load", "main=c:1")
    assert bad.exit_code == 2 and "main is the service tuned" in bad.stderr
    bad = run_cli("tune", str(model), "--hw", str(hw), "--with-load", "worker=c:1")
    assert bad.exit_code == 2 and "--layout" in bad.stderr
