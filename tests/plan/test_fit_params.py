"""Fit verdicts agree with llama.cpp's own llama-fit-params on CPU + loopback RPC devices.

llama-fit-params projects the same model exactly (it builds model and context without allocating)
and, when the model does not fit a device, moves experts to the CPU (-ot) or layers off it (-ngl).
A loopback worker reports the whole host's memory, so a device of C MiB is emulated by asking
llama-fit-params to leave (free - C) MiB unused (-fitt); moetune gets C as the device's memory.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from moetune.hardware.inventory import from_dict
from moetune.model.archs import Dims
from moetune.model.profile import ModelProfile, load_profile
from moetune.model.testmodel import generate
from moetune.plan.plan import ServiceSpec, make_plan
from moetune.plan.settings import Settings
from tests.helpers import loopback_hw, rpc_workers

pytestmark = pytest.mark.server

MODELS = {
    "qwen3moe": Dims(n_embd=512, n_expert=16, n_expert_used=4, n_ff_exp=256, n_head=8, n_head_kv=4),
    "glm4moe": Dims(n_dense_lead=1, n_nextn=1),
    "deepseek2": Dims(n_dense_lead=1, n_head=2, n_head_kv=1),
    "qwen35moe": Dims(),
}
SETTINGS = [(4096, 512), (16384, 256)]


@pytest.fixture(scope="module")
def worker(bin_dir: Path) -> Iterator[tuple[str, int]]:
    with rpc_workers(bin_dir, 1) as ends:
        out = subprocess.run(
            [str(bin_dir / "llama-server"), "--rpc", ends[0], "--list-devices"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
        m = re.search(r"RPC0: \S+ \((\d+) MiB, (\d+) MiB free", out)
        assert m, out
        yield ends[0], int(m[2])


def fit_params_fits(bin_dir: Path, p: ModelProfile, endpoint: str, free: int, cap: float, ctx: int, ub: int) -> bool:
    r = subprocess.run(
        [
            str(bin_dir / "llama-fit-params"),
            "-m",
            str(p.files[0]),
            "--rpc",
            endpoint,
            "-c",
            str(ctx),
            "-ub",
            str(ub),
            "-fitt",
            str(int(free - cap)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    args = r.stdout.strip()
    return "-ot" not in args and re.search(r"-ngl -1\b", args) is not None


@pytest.mark.parametrize("arch", list(MODELS))
@pytest.mark.parametrize(("ctx", "ub"), SETTINGS)
def test_verdicts_agree_with_llama_fit_params(
    arch: str, ctx: int, ub: int, bin_dir: Path, tmp_path: Path, worker: tuple[str, int]
) -> None:
    endpoint, free = worker
    p = load_profile(generate(tmp_path / f"{arch}.gguf", arch, MODELS[arch], "f16").files[0])
    s = Settings(ctx=ctx, ubatch=ub)
    need = (
        make_plan(
            [ServiceSpec(name="t", model=p, settings=s, strategy="all-gpu")],
            from_dict(loopback_hw([endpoint], mem_mib=1e6)),
        )
        .ledgers[0]
        .used_mib
    )
    for factor in (0.93, 1.07):
        cap = need * factor
        ours = make_plan(
            [ServiceSpec(name="t", model=p, settings=s, strategy="all-gpu")],
            from_dict(loopback_hw([endpoint], mem_mib=cap)),
        ).fits
        theirs = fit_params_fits(bin_dir, p, endpoint, free, cap, ctx, ub)
        assert ours == theirs == (factor > 1), (factor, round(cap, 1), ours, theirs)
