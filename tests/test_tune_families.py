"""What `moetune tune` plans before it launches anything: its placement families and the
strategies it is given (tests/tune_testbed.py's model, two loopback RPC devices; nothing starts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from moetune.bench.single.runner import BenchOptions
from moetune.bench.single.workloads import expand
from moetune.errors import InputError
from moetune.plan.settings import Settings
from moetune.tune.loop import TuneRequest, candidates
from tests.helpers import run_cli
from tests.tune_testbed import make_testbed


def _request(tmp_path: Path, rpc_mem_mib: float, **axes: tuple[object, ...]) -> TuneRequest:
    model, hw = make_testbed(tmp_path, rpc_devices=2, rpc_mem_mib=rpc_mem_mib)
    (w,) = expand([], [], depths=[0], pp_tokens=64, tg_tokens=16)
    small = {
        "threads": (1,),
        "ubatches": (512,),
        "flash_attn": (True,),
        "cache_types": (("f16", "f16"),),
        "repack": (False,),
    }
    return TuneRequest(
        hw=str(hw),
        model=str(model),
        base=Settings(threads=1),
        workload=w,
        options=BenchOptions(),
        axes={**small, **axes},
    )


def test_the_default_families_split_autos_expert_budget_between_head_and_tail(tmp_path: Path) -> None:
    # 70 MiB a device: `auto` fits 7 of the 8 MoE layers' experts on the two devices
    entries, _ = candidates(_request(tmp_path, 70), lambda s: None)
    by = {e.candidate.strategy: e for e in entries}
    assert list(by) == [
        "auto",
        "cpu-moe",
        "n-cpu-moe:2",
        "n-cpu-moe:4",
        "n-cpu-moe:6",
        "head-tail:4+3",
        "head-tail:2+2+3",
    ]
    ht = by["head-tail:4+3"].plan
    devs = {
        layer: set(d for n, d in ht.main.placement.experts().items() if int(n.split(".")[1]) == layer)
        for layer in range(8)
    }
    first, last = (d.name for d in ht.hw.accelerators())
    assert devs == {0: {first}, 1: {first}, 2: {first}, 3: {first}, 4: {"CPU"}, 5: {last}, 6: {last}, 7: {last}}
    assert by["head-tail:2+2+3"].plan.main.placement.experts()["blk.0.ffn_up_exps.weight"] == first


def test_a_strategy_the_hardware_refuses_is_one_error(tmp_path: Path) -> None:
    messages: list[str] = []
    with pytest.raises(InputError, match=r"--try-strategy: layers:CUDA0=3-4: .*CUDA0=3-4"):
        candidates(_request(tmp_path, 70, strategies=("cpu-moe", "layers:CUDA0=3-4")), messages.append)
    assert not [m for m in messages if "skipped" in m]


def test_the_issues_comma_list_is_two_strategies(tmp_path: Path) -> None:
    model, hw = make_testbed(tmp_path, rpc_devices=2)
    r = run_cli("tune", str(model), "--hw", str(hw), "--try-strategy", "cpu-moe,layers:CUDA0=3-14,CUDA1=68-77")
    assert r.exit_code == 2  # one error naming the layer set the hardware has no devices for, nothing skipped
    assert "--try-strategy: layers:CUDA0=3-14,CUDA1=68-77: " in r.stderr and "skipped" not in r.stderr
    assert r.stderr.count("\n") < 6, r.stderr
