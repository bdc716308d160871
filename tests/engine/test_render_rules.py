"""The -ot rules and the plan must agree: `check_rules` applies the rules first-match, as llama.cpp
does, and a disagreement is moetune's own bug, said as an InternalError that asks for a report."""

from __future__ import annotations

import pytest

from moetune.engine.render import OverrideRule, check_rules, override_rules
from moetune.errors import REPORT_IT, InternalError, MoetuneError
from moetune.hardware.inventory import from_dict
from moetune.model.archs import small_dims
from moetune.model.profile import ModelProfile, load_profile
from moetune.model.testmodel import generate
from moetune.plan import placement as plc


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> ModelProfile:
    d = tmp_path_factory.mktemp("rules")
    return load_profile(generate(d / "m.gguf", "qwen3moe", small_dims("qwen3moe", True), "q8_0").files[0])


HW = from_dict(
    {
        "nodes": [
            {
                "name": "local",
                "cpu": {"cores": 2, "ram_mib": 65536, "ram_bw_gbs": 20},
                "devices": [{"name": "CUDA0", "kind": "gpu", "mem_mib": 24000, "bw_gbs": 900}],
            }
        ]
    }
)
PLACEMENTS = {
    "cpu-moe": lambda p: plc.cpu_moe(p, HW),
    "n-cpu-moe:2": lambda p: plc.n_cpu_moe(p, HW, 2),
    "head-tail:1+1": lambda p: plc.head_tail(p, HW, 1, 1),
    "all-gpu": lambda p: plc.gpu_layers(p, HW),
}


@pytest.mark.parametrize("strategy", list(PLACEMENTS))
def test_the_rendered_rules_agree_with_the_plan(model: ModelProfile, strategy: str) -> None:
    pl = PLACEMENTS[strategy](model)
    check_rules(model, pl, override_rules(model, pl))


def test_rules_that_disagree_with_the_plan_are_an_internal_error(model: ModelProfile) -> None:
    pl = plc.cpu_moe(model, HW)
    rules = override_rules(model, pl)
    assert rules  # every expert moved off its layer's device
    with pytest.raises(
        InternalError, match=r"override rules send blk\.0\.ffn_\w+_exps\.weight to CUDA0, the plan says CPU"
    ):
        check_rules(model, pl, [])  # no rule: each expert stays with its layer
    wrong = [OverrideRule(r"blk\.0\.", "CUDA0"), *rules]  # an earlier rule wins, as in llama.cpp
    with pytest.raises(InternalError) as e:
        check_rules(model, pl, wrong)
    assert isinstance(e.value, MoetuneError) and e.value.exit_code == 1
    assert e.value.hint == REPORT_IT and "report it" in REPORT_IT
