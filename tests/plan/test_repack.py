"""Repacking as a plan option that follows the engine, and the pure rules of which weights the
engine repacks (plan/repack.py, from ggml-cpu's repack.cpp and amx/)."""

from __future__ import annotations

import pytest

from moetune.engine.dialect import IK_DIALECT, MAINLINE_DIALECT
from moetune.engine.render import defaults_argv, repack_flags
from moetune.hardware.inventory import from_dict, to_dict
from moetune.hardware.probe import parse_isa
from moetune.kinds import EngineKind
from moetune.model.profile import EXPERT, Tensor
from moetune.plan.repack import amx_bytes, cpu_repack_ok, repacked
from moetune.plan.settings import Settings

MAIN, IK = EngineKind.MAINLINE, EngineKind.IK


@pytest.mark.parametrize(
    ("engine", "repack", "repacks", "flags"),
    [
        (MAIN, None, True, []),
        (MAIN, True, True, []),
        (MAIN, False, False, ["-nr"]),
        (IK, None, False, []),
        (IK, False, False, []),
        (IK, True, True, ["-rtr"]),
    ],
)
def test_repacking_follows_the_engine_and_renders_only_a_difference(
    engine: EngineKind, repack: bool | None, repacks: bool, flags: list[str]
) -> None:
    s = Settings(engine=engine, repack=repack)
    assert s.repacks is repacks
    assert repack_flags(s, MAINLINE_DIALECT if engine == MAIN else IK_DIALECT) == flags


def tensor(
    type_name: str, shape: tuple[int, ...], kind: str = "attn_q", expert: bool = False, nbytes: int = 0
) -> Tensor:
    return Tensor(
        name=f"blk.0.{kind}.weight",
        layer=0,
        kind=kind,
        role=EXPERT if expert else "attn",
        type_name=type_name,
        shape=shape,
        nbytes=nbytes,
        file_index=0,
        offset=0,
    )


@pytest.mark.parametrize(
    ("t", "isa", "ok"),
    [
        (tensor("Q4_0", (256, 64)), ("avx2",), True),
        (tensor("Q4_0", (256, 60)), ("avx2",), False),  # rows not a multiple of the 8-row interleave
        (tensor("Q4_0", (256, 64, 8), "ffn_up_exps", True), ("avx2",), True),  # experts: MUL_MAT_ID
        (tensor("Q4_0", (256, 64, 8)), ("avx2",), False),  # a 3-D weight that is not an expert tensor
        (tensor("Q8_0", (256, 64)), ("avx2", "avx512"), False),  # no x86 kernel for Q8_0
        (tensor("Q8_0", (256, 64)), ("dotprod",), True),
        (tensor("Q2_K", (256, 64)), ("avx2",), False),
        (tensor("Q2_K", (256, 64)), ("avx2", "avx512"), True),
        (tensor("Q4_0", (256, 64), "token_embd"), ("avx2",), False),  # read by GET_ROWS
        (tensor("F16", (256, 64)), ("avx2", "avx512"), False),
    ],
)
def test_cpu_repack_takes(t: Tensor, isa: tuple[str, ...], ok: bool) -> None:
    assert cpu_repack_ok(t, isa) is ok


def test_amx_takes_2d_matmul_weights_with_its_own_layout() -> None:
    assert amx_bytes(tensor("Q8_0", (256, 64))) == 64 * 8 * (34 + 4)  # a compensation int32 per block
    assert amx_bytes(tensor("Q4_0", (256, 64))) == 64 * 8 * 18
    assert amx_bytes(tensor("F16", (256, 64))) == 256 * 64 * 2
    assert amx_bytes(tensor("Q8_0", (256, 48))) is None  # output rows not a multiple of 32
    assert amx_bytes(tensor("Q8_0", (256, 64, 8), "ffn_up_exps", True)) is None  # MUL_MAT_ID: CPU_REPACK's
    ts = [tensor("Q8_0", (256, 64)), tensor("Q4_0", (256, 64, 8), "ffn_up_exps", True, 64 * 8 * 8 * 18)]
    r = repacked(ts, engine=MAIN, repack=True, isa=("avx2", "avx512", "amx"), local_gpu=False)
    assert dict(r.buffers) == {"AMX": 64 * 8 * 38, "CPU_REPACK": 64 * 8 * 8 * 18}
    assert repacked(ts, engine=IK, repack=True, isa=None, local_gpu=False).nbytes == 0  # in place
    assert repacked(ts, engine=MAIN, repack=True, isa=None, local_gpu=True).nbytes == 0


def test_the_cpu_extensions_from_cpuinfo_and_the_hardware_file() -> None:
    x86 = "processor : 0\nflags : fpu sse avx2 avx512f avx512_vnni amx_tile amx_int8\n"
    assert parse_isa(x86) == ("avx2", "avx512", "amx")
    assert parse_isa("Features : fp asimd asimddp i8mm\n") == ("dotprod", "i8mm")
    assert parse_isa("no flags here\n") is None
    doc = {"nodes": [{"name": "local", "cpu": {"cores": 2, "ram_mib": 1000, "ram_bw_gbs": 10, "isa": ["avx2"]}}]}
    hw = from_dict(doc)
    assert hw.local.cpu_isa == ("avx2",) and to_dict(hw)["nodes"][0]["cpu"]["isa"] == ["avx2"]


def test_the_engine_defaults_command_has_no_tuning_flags() -> None:
    class P:  # what defaults_argv reads of a profile
        server_path = "/m.gguf"

    s = Settings(ctx=2048, threads=4, ubatch=128, repack=False)
    argv = defaults_argv(P(), s, MAINLINE_DIALECT, port=9000, rpc=["127.0.0.1:50052"])  # type: ignore[arg-type]
    assert argv == [
        "-m",
        "/m.gguf",
        "-c",
        "2048",
        "--rpc",
        "127.0.0.1:50052",
        "-nr",
        "--host",
        "127.0.0.1",
        "--port",
        "9000",
    ]
    ik = defaults_argv(P(), Settings(engine=IK), IK_DIALECT, port=9000)  # type: ignore[arg-type]
    assert "--jinja" in ik and "-rtr" not in ik
