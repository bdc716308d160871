"""The use cases read their requests: what goes together, what each option becomes, the documents
they give back. Pure parts are tested from tables; plan runs on a generated model."""

from __future__ import annotations

from pathlib import Path

import pytest

from moetune.app.plan import PlanRequest, plan
from moetune.app.serve_bench import ServeBenchRequest, levels, load_defaults, session_spec
from moetune.app.tune import Axes, TuneRequest, search_request
from moetune.errors import InputError
from moetune.model.archs import small_dims
from moetune.model.testmodel import generate


def test_the_axes_given_are_the_searchs_by_name_and_the_strategies_split() -> None:
    axes = Axes(strategies=("cpu-moe,layers:CUDA0=3-14,CUDA1=68-77",), threads=(4, 8), flash_attn=(True,))
    assert axes.given() == {
        "strategies": ("cpu-moe", "layers:CUDA0=3-14,CUDA1=68-77"),
        "threads": (4, 8),
        "flash_attn": (True,),
    }
    assert Axes().given() == {}


@pytest.mark.parametrize(
    ("asked", "error"),
    [
        ({"objective": "goodput"}, "--objective goodput needs latency targets"),
        ({"objective": "goodput", "slo": "ttft_ms=500", "depth": 512}, "--depth: a single-stream workload"),
        ({"objective": "goodput", "slo": "ttft_ms=500", "concurrency": 4, "requests": 6}, "--requests 6"),
        ({"objective": "tg", "concurrency": 2}, "--concurrency: only with --objective goodput"),
        ({"objective": "tg", "replay_speed": "max"}, "--replay-speed paces --objective replay:FILE"),
        ({"objective": "tg", "turns": 3}, "--turns: only with --objective turn"),
        ({"objective": "turn", "depth": 8}, "--depth 8: with --objective turn"),
        ({"objective": "tg", "with_load": ("worker=c:2",)}, "--with-load loads the other services of a layout"),
    ],
)
def test_a_tune_request_that_does_not_go_together_is_an_input_error(asked: dict[str, object], error: str) -> None:
    with pytest.raises(InputError, match=error.replace("(", r"\(").replace("+", r"\+")):
        search_request(TuneRequest(hw="rtx-pro-6000x2", model="m.gguf", **asked))


def test_a_goodput_request_becomes_the_searchs_serving_load() -> None:
    req = search_request(
        TuneRequest(hw="hw.yaml", model="m.gguf", objective="goodput", slo="ttft_ms=500,itl_ms=100", pp_tokens=256)
    )
    assert req.objective == "goodput" and req.serve is not None
    assert (req.serve.concurrency, req.serve.requests, req.serve.input_len, req.serve.output_len) == (4, 32, 256, 128)
    assert dict(req.serve.slo) == {"ttft_ms": 500.0, "itl_ms": 100.0}
    assert req.transport == "tcp" and req.workload.depth == 0


def test_a_turn_request_measures_sessions_from_depth_zero() -> None:
    req = search_request(TuneRequest(hw="hw.yaml", model="m.gguf", objective="turn", depth=1024, turns=3))
    assert req.objective == "turn" and req.work is not None and req.workload.depth == 0
    assert req.serve is None and req.weighted is None


@pytest.mark.parametrize(("text", "want"), [("1", (1,)), ("1, 2,4", (1, 2, 4))])
def test_concurrency_levels(text: str, want: tuple[int, ...]) -> None:
    assert levels(text) == want


@pytest.mark.parametrize("text", ["", "0", "1,x", "-2"])
def test_concurrency_levels_that_are_not_positive_integers(text: str) -> None:
    with pytest.raises(InputError, match="--concurrency"):
        levels(text)


def test_sessions_options_go_with_sessions_only() -> None:
    with pytest.raises(InputError, match="--turns, --strip-thinking shape agent sessions"):
        session_spec(ServeBenchRequest(target="u", turns=3, strip_thinking=True))
    with pytest.raises(InputError, match="--rate, --prefix-cache do not apply"):
        session_spec(ServeBenchRequest(target="u", sessions=2, given=frozenset({"rate", "prefix_cache", "seed"})))
    with pytest.raises(InputError, match="--strip-thinking removes the reasoning"):
        session_spec(ServeBenchRequest(target="u", sessions=2, strip_thinking=True, thinking="off"))
    assert session_spec(ServeBenchRequest(target="u")) is None
    s = session_spec(ServeBenchRequest(target="u", sessions=3, output_len=32))
    assert s is not None and (s.sessions, s.turns, s.system_tokens, s.turn_tokens, s.output_len) == (3, 4, 512, 128, 32)


def test_the_options_given_are_every_loads_defaults() -> None:
    req = ServeBenchRequest(
        target="plan.json", concurrency="2", warmup=3, seed=9, given=frozenset({"concurrency", "warmup"})
    )
    assert load_defaults(req) == {"concurrency": 2, "warmup": 3}  # seed was not given
    with pytest.raises(InputError, match="with --load each service runs one level"):
        load_defaults(ServeBenchRequest(target="plan.json", concurrency="1,2", given=frozenset({"concurrency"})))


def test_a_plan_of_a_model_on_example_hardware(tmp_path: Path) -> None:
    model = generate(tmp_path / "m.gguf", "qwen3moe", small_dims("qwen3moe", True), "f16").files[0]
    out = tmp_path / "plan.json"
    planned = plan(PlanRequest(hw="rtx-pro-6000x2", model=model, strategy="cpu-moe", output=out))
    assert planned.plan.fits and planned.verified is None
    (service,) = planned.doc["services"]
    assert service["model_given"] == str(model) and service["routing"] is None
    assert planned.doc["speed_uncertainty"]["source"] in ("built-in", "calibration")
    assert out.read_text().startswith("{")
    with pytest.raises(InputError, match="give a MODEL"):
        plan(PlanRequest(hw="rtx-pro-6000x2"))
    with pytest.raises(InputError, match="--verify runs the engine on the model's file"):
        plan(PlanRequest(hw="rtx-pro-6000x2", model=model, recipe=tmp_path / "r.yaml", verify=True))
