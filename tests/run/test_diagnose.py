"""Failure diagnosis and its advice: pure functions on fixture logs and tables of numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from moetune.engine.logs import parse_log, parse_worker_log
from moetune.run import diagnose
from moetune.run.diagnose import LayerExperts

FIX = Path(__file__).parents[1] / "fixtures" / "logs"
GLM_LAYER_MIB = 1225 + 1638 + 1225  # gate + down + up experts of one GLM-5.1 IQ3_KS layer (report 000)


def read(name: str) -> str:
    return (FIX / name).read_text(errors="replace")


@pytest.mark.parametrize(
    ("ub", "compute", "room", "want"),
    [
        (65536, 82305.25, 24037.0, 16384),  # the real RPC0 failure: 82 GiB wanted, 23.5 GiB left
        (8192, 5418.03, None, 4096),  # room unknown: halve
        (8192, 5418.03, 5000.0, 4096),
        (8192, 5418.03, 2000.0, 2048),
        (512, 900.0, 100.0, 32),
        (64, 100.0, 10.0, None),  # would go below 32
        (32, 100.0, 10.0, None),
    ],
)
def test_lower_ubatch(ub: int, compute: float, room: float | None, want: int | None) -> None:
    assert diagnose.lower_ubatch(ub, compute, room) == want


GLM_ON_CUDA0 = [LayerExperts(i, "CUDA0", GLM_LAYER_MIB) for i in range(64, 78)]  # --n-cpu-moe 64


@pytest.mark.parametrize(
    ("shortfall", "layers", "device", "want"),
    [
        (5418.03, GLM_ON_CUDA0, "CUDA0", (76, 77)),  # the compute buffer of the --n-cpu-moe 58 OOM
        (100.0, GLM_ON_CUDA0, "CUDA0", (77,)),
        (5418.03, GLM_ON_CUDA0, "CUDA1", None),  # nothing of it on that device
        (GLM_LAYER_MIB * 20, GLM_ON_CUDA0, "CUDA0", None),  # more than the device holds
        (
            3000.0,
            [LayerExperts(3, "CUDA0", 1000), LayerExperts(4, "CUDA0", 2500), LayerExperts(5, "CUDA0", 600)],
            "CUDA0",
            (3, 4),
        ),  # largest first
        (10.0, [LayerExperts(7, "RPC0", 20)], "RPC0[10.0.0.2:50052]", (7,)),  # device names as logged
    ],
)
def test_layers_to_offload(
    shortfall: float, layers: list[LayerExperts], device: str, want: tuple[int, ...] | None
) -> None:
    assert diagnose.layers_to_offload(shortfall, layers, device) == want


@pytest.mark.parametrize(
    ("shortfall", "per_layer", "n", "want"),
    [(5418.03, GLM_LAYER_MIB, 75, 2), (4088, GLM_LAYER_MIB, 75, 1), (58000, 1.5, 2, None), (0, 10, 5, None)],
)
def test_uniform_layers_to_offload(shortfall: float, per_layer: float, n: int, want: int | None) -> None:
    assert diagnose.uniform_layers_to_offload(shortfall, per_layer, n) == want


def test_layer_experts_from_a_plan() -> None:
    plan = {
        "services": [
            {
                "name": "main",
                "layers": [
                    {"index": 2, "kind": "dense", "device": "CUDA0", "experts": {}, "expert_mib": 0.0},
                    {
                        "index": 3,
                        "kind": "moe",
                        "device": "CUDA0",
                        "experts": {"ffn_gate_exps": "CUDA0", "ffn_up_exps": "CUDA0", "ffn_down_exps": "CPU"},
                        "expert_mib": 3000.0,
                    },
                ],
            },
            {"name": "coder", "layers": [{"index": 0, "experts": {"ffn_up_exps": "CUDA1"}, "expert_mib": 10.0}]},
        ]
    }
    got = diagnose.layer_experts_from_plan(plan, "main")
    assert [(x.layer, x.device, x.expert_mib) for x in got] == [(3, "CPU", 1000.0), (3, "CUDA0", 2000.0)]
    assert len(diagnose.layer_experts_from_plan(plan)) == 3
    assert diagnose.layer_experts_from_plan({"launch": {}}) == []


def one_line(d: diagnose.Diagnosis) -> None:
    assert "\n" not in d.message and "\n" not in d.hint
    assert d.message and d.hint


def test_reference_oom_names_device_size_and_layers() -> None:
    log = parse_log(read("ref000_glm51_oom_n_cpu_moe_58.legacy.log"))
    d = diagnose.server_exit("main", log, 1, loading=True, layers=GLM_ON_CUDA0)
    one_line(d)
    assert d.cause == diagnose.OUT_OF_MEMORY
    assert d.message == "main: out of memory allocating the CUDA0 compute buffer (5418 MiB)"
    assert d.hint.startswith("move the experts of 2 layer(s) off CUDA0 (blk 76, 77); `moetune plan`")
    assert [e.line for e in d.evidence] == [1, 2, 3]
    # with the -ub the launch gave (the excerpt does not log it), both ways out
    both = diagnose.server_exit("main", log, 1, loading=True, uniform=(GLM_LAYER_MIB, 75), n_ubatch=8192)
    assert both.hint.startswith(
        "lower -ub from 8192 to 4096 (the compute buffer shrinks about linearly with it); "
        "or move the experts of 2 layer(s) off CUDA0 (4088 MiB each)"
    )


def test_real_rpc0_oom_suggests_ubatch() -> None:
    d = diagnose.server_exit(
        "main", parse_log(read("real_oom_compute_rpc.mainline.log")), 1, loading=True, uniform=(1.5, 2)
    )
    one_line(d)
    assert d.message == "main: out of memory allocating the RPC0 compute buffer (82305 MiB; RPC0 has 24105 MiB free)"
    assert d.hint.startswith("lower -ub from 65536 to 16384")
    assert "move the experts" not in d.hint  # two tiny layers cannot free 57 GiB
    assert any("failed to allocate RPC0[" in e.text for e in d.evidence)


def test_real_cpu_oom_never_moves_experts_off_the_host() -> None:
    d = diagnose.server_exit(
        "main", parse_log(read("real_oom_compute_cpu.mainline.log")), 1, loading=True, uniform=(100000.0, 2)
    )
    assert "CPU compute buffer" in d.message and "move the experts" not in d.hint


@pytest.mark.parametrize(
    ("name", "cause", "words"),
    [
        ("real_missing_model.mainline.log", diagnose.MODEL_MISSING, "cannot open the model file"),
        ("real_port_busy.mainline.log", diagnose.PORT_IN_USE, "the port is in use"),
        ("real_bad_argument.mainline.log", diagnose.BAD_ARGS, "rejected an argument: --no-such-flag"),
        ("real_rpc_unreachable.mainline.log", diagnose.RPC_UNREACHABLE, "is unreachable"),
        ("ref004_rdma_shutdown_crash.mainline.log", diagnose.RPC_LOST, "lost its RPC worker"),
    ],
)
def test_failure_causes(name: str, cause: str, words: str) -> None:
    serving = name.startswith("ref004")  # the worker stopped first at the end of a session
    d = diagnose.server_exit("main", parse_log(read(name)), 1, loading=not serving)
    one_line(d)
    assert d.cause == cause and words in d.message and d.evidence


def test_exit_without_a_known_cause() -> None:
    log = parse_log(read("real_serve.mainline.log"))
    d = diagnose.server_exit("main", log, -11, loading=False)
    assert d.cause == diagnose.EXITED and "(exit -11)" in d.message


def test_worker_on_a_taken_port() -> None:
    w = parse_worker_log(read("real_rpc_worker_port_busy.log"))
    d = diagnose.worker_exit("rpc0", w, 0, "127.0.0.1:50052")
    one_line(d)
    assert d.cause == diagnose.PORT_IN_USE and "127.0.0.1:50052" in d.message


def test_port_in_use_names_the_holder_whole_or_by_its_start_and_end() -> None:
    short = "/opt/llama/bin/llama-server -m /models/a.gguf --host 127.0.0.1 --port 8080"
    d = diagnose.port_in_use("main", "127.0.0.1:8080", (4242, short))
    assert d.message == f"main: 127.0.0.1:8080 is already in use by pid 4242 ({short})"
    long = (
        "/home/me/src/ik_llama.cpp/build/bin/llama-server -m /srv/models/GLM-5.1/GLM-5.1-IQ3_KS-00001-of-00008.gguf "
        + " ".join(f"-ot blk.{i}.ffn_.*_exps=CPU" for i in range(40))
        + " --host 0.0.0.0 --port 8080"
    )
    d = diagnose.port_in_use("main", "127.0.0.1:8080", (4242, long))
    held = d.message.split("by pid 4242 (", 1)[1][:-1]
    assert len(held) <= 240 and " … " in held
    assert held.startswith("/home/me/src/ik_llama.cpp/build/bin/llama-server -m /srv/models/GLM-5.1/")
    assert held.endswith("--host 0.0.0.0 --port 8080")
    assert (
        diagnose.port_in_use("w", "10.0.0.2:50052 (node b)", None).message
        == "w: 10.0.0.2:50052 (node b) is already in use"
    )
