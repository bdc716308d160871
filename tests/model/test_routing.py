"""Measured routing from an imatrix GGUF: read from the file llama.cpp's own `llama-imatrix` writes,
turned into the share of experts a batch touches, and used by the plan's prefill prediction."""

from __future__ import annotations

import json
import random
import struct
import subprocess
from pathlib import Path

import pytest

from moetune.errors import InputError
from moetune.hardware.inventory import load
from moetune.model.archs import small_dims
from moetune.model.gguf_write import TensorToWrite, write_gguf
from moetune.model.profile import ModelProfile, load_profile
from moetune.model.quants import by_name
from moetune.model.routing import read_routing, touched_by
from moetune.model.testmodel import generate
from moetune.plan.plan import ServiceSpec, make_plan
from moetune.plan.settings import Settings
from moetune.plan.speed import TOUCH_POINTS, Work, at_depth, touched_share
from tests.helpers import run_cli

F32 = by_name("F32")


def imatrix(path: Path, counts: dict[str, list[float]], *, kind: str = "imatrix") -> Path:
    """An imatrix GGUF laid out as llama-imatrix writes it: ``<weight>.in_sum2`` and ``<weight>.counts``."""
    tensors = []
    for name, c in counts.items():
        zeros = b"\0" * 16 * len(c)
        tensors.append(TensorToWrite(f"{name}.in_sum2", (4, len(c)), F32, lambda z=zeros: z))
        tensors.append(TensorToWrite(f"{name}.counts", (1, len(c)), F32, lambda c=c: struct.pack(f"<{len(c)}f", *c)))
    write_gguf(path, {"general.type": kind, "imatrix.chunk_count": 1}, tensors, sparse=False)
    return path


def three_hot(d: Path, p: ModelProfile) -> Path:
    """A routing where every MoE layer sends its tokens to three experts only (600 choices)."""
    layers = sorted({t.layer for t in p.tensors if t.is_expert})
    return imatrix(
        d / "hot.gguf",
        {f"blk.{i}.ffn_up_exps.weight": [300.0, 200.0, 100.0] + [0.0] * (p.n_expert - 3) for i in layers},
    )


@pytest.mark.server
def test_the_file_llama_imatrix_writes(bin_dir: Path, tmp_path: Path) -> None:
    """A generated MoE model (8 experts, 2 a token) through the real llama-imatrix: every MoE
    layer's chances sum to k, the tokens are the chunks it ran, and the routing of random weights
    is far from uniform (so the file is read, not assumed)."""
    model = generate(tmp_path / "m.gguf", "qwen3moe", small_dims("qwen3moe", True), "f16").files[0]
    p = load_profile(model)
    words = ["expert", "token", "layer", "router", "cache", "graph", "tensor", "memory", "batch", "speed"]
    text = tmp_path / "text.txt"
    text.write_text(" ".join(random.Random(1).choice(words) for _ in range(3000)))
    out = tmp_path / "imatrix.gguf"
    r = subprocess.run(
        [
            str(bin_dir / "llama-imatrix"),
            "-m",
            str(model),
            "-f",
            str(text),
            "-o",
            str(out),
            "-c",
            "128",
            "--chunks",
            "4",
            "-t",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and out.exists(), r.stderr[-2000:]
    routing = read_routing(out, p.n_expert, p.n_expert_used)
    moe_layers = sorted({t.layer for t in p.tensors if t.is_expert})
    assert sorted(routing.layers) == moe_layers
    assert routing.tokens == 4 * 128
    for chances in routing.layers.values():
        assert len(chances) == p.n_expert and sum(chances) == pytest.approx(p.n_expert_used)
    assert min(routing.touched(layer, 16) or 1.0 for layer in moe_layers) < touched_share(2 / 8, 16) - 0.01


def test_uniform_counts_touch_what_the_formula_says_and_concentrated_ones_less(tmp_path: Path) -> None:
    even = imatrix(tmp_path / "even.gguf", {"blk.0.ffn_up_exps.weight": [100.0] * 8})
    r = read_routing(even, 8, 2)
    assert r.tokens == 400 and r.layers[0] == pytest.approx((0.25,) * 8)
    for b in (1, 7, 64, 512):
        assert r.touched(0, b) == pytest.approx(touched_share(0.25, b))
    hot = imatrix(
        tmp_path / "hot.gguf",
        {"blk.0.ffn_down_exps.weight": [390.0, 390.0, 20.0] + [0.0] * 5, "blk.1.ffn_gate_exps.weight": [100.0] * 8},
    )
    r = read_routing(hot, 8, 2)
    assert r.touched(0, 64) == pytest.approx(touched_by(r.layers[0], 64)) and r.touched(0, 64) < 0.4
    assert r.touched(5, 64) is None  # a layer the file has no counts of
    assert r.to_json()["touched_at_64_tokens"] < r.to_json()["uniform_at_64_tokens"]


@pytest.mark.parametrize(
    ("write", "said"),
    [
        (lambda p: p.write_bytes(b"\x05\x00\x00\x00legacy"), "legacy .dat"),
        (lambda p: imatrix(p, {"blk.0.ffn_up_exps.weight": [1.0] * 8}, kind="model"), "not an imatrix"),
        (lambda p: imatrix(p, {"blk.0.attn_q.weight": [5.0]}), "no expert counts"),
        (lambda p: imatrix(p, {"blk.0.ffn_up_exps.weight": [1.0] * 16}), "16 experts, the model 8"),
        (lambda p: imatrix(p, {"blk.0.ffn_up_exps.weight": [0.0] * 8}), "every expert count is zero"),
    ],
)
def test_files_that_are_not_a_routing_are_refused_with_the_way_to_make_one(
    tmp_path: Path, write: object, said: str
) -> None:
    path = tmp_path / "x.gguf"
    write(path)  # type: ignore[operator]
    with pytest.raises(InputError, match=said) as e:
        read_routing(path, 8, 2)
    assert "llama-imatrix" in (e.value.hint or "")


def test_concentrated_routing_speeds_up_prefill_with_experts_on_the_host_and_not_decode(tmp_path: Path) -> None:
    """cpu-moe on a GPU machine: every ubatch streams the experts it touches over PCIe; with a
    routing that uses 3 of 16 experts, fewer cross. Decode reads k experts a token either way. The
    plan keeps the table, so a stored prediction is recomputed the same (calibration, bench)."""
    model = generate(tmp_path / "m.gguf", "qwen3moe", small_dims("qwen3moe", True), "f16").files[0]
    p = load_profile(model)
    hot = three_hot(tmp_path, p)
    hw = load("rtx-pro-6000")
    s = Settings(ctx=4096, ubatch=128)

    def plan(routing: object) -> dict[str, object]:
        pl = make_plan([ServiceSpec(name="main", model=p, settings=s, strategy="cpu-moe", routing=routing)], hw)  # type: ignore[arg-type]
        return pl.main.prediction.to_json()

    uniform, measured = plan(None), plan(read_routing(hot, p.n_expert, p.n_expert_used))
    assert measured["tg_tok_s"] == uniform["tg_tok_s"]
    assert measured["pp_tok_s"] > 1.05 * uniform["pp_tok_s"]
    cpu = next(d for d in measured["work"]["devices"] if d["device"] == "CPU")  # type: ignore[index]
    assert len(cpu["touched"]) == len(TOUCH_POINTS) and cpu["touched"][7] == pytest.approx(3 / p.n_expert)
    stored = json.loads(json.dumps(measured))
    again = at_depth(stored, 0, 300)
    assert again is not None and again["pp_tok_s"] == pytest.approx(at_depth(measured, 0, 300)["pp_tok_s"])  # type: ignore[index]
    assert Work.from_json(stored["work"]).devices == Work.from_json(measured["work"]).devices  # type: ignore[arg-type]


def test_plan_and_tune_take_it_from_the_command_line(tmp_path: Path) -> None:
    model = generate(tmp_path / "m.gguf", "qwen3moe", small_dims("qwen3moe", True), "f16").files[0]
    p = load_profile(model)
    hot = three_hot(tmp_path, p)
    r = run_cli("plan", str(model), "--hw", "rtx-pro-6000", "--strategy", "cpu-moe", "--routing", str(hot))
    assert r.exit_code == 0, r.stderr
    tokens = 600 // p.n_expert_used
    assert f"routing: measured over {tokens} tokens" in r.stdout and "every expert alike: 100%" in r.stdout
    out = tmp_path / "p.json"
    doc = json.loads(
        run_cli("plan", str(model), "--hw", "rtx-pro-6000", "--routing", str(hot), "-o", str(out), "--json").stdout
    )
    assert doc["services"][0]["routing"]["tokens"] == tokens
    page = run_cli("report", str(out), "-o", "-").stdout  # the HTML page says it beside the prediction
    assert f"measured over {tokens} tokens" in page
    layout = tmp_path / "l.yaml"
    layout.write_text(f"services:\n  - name: a\n    model: {model}\n")
    r = run_cli("plan", "--layout", str(layout), "--hw", "rtx-pro-6000", "--routing", str(hot))
    assert r.exit_code == 2 and "--routing is one model's routing" in r.stderr
    r = run_cli("tune", str(model), "--hw", "rtx-pro-6000", "--routing", str(tmp_path / "none.gguf"), "--budget", "1")
    assert r.exit_code == 2 and "cannot read it" in r.stderr
