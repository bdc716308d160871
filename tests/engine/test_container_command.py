"""`container_command`: the `podman run` / `docker run` of a service, the one `plan --format podman`
prints and `moetune launch` runs (pure; tests/run/test_podman.py runs it for real)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from moetune.engine.command import plan_json, service_argv, service_gpus
from moetune.engine.formats import Command, container_command, mount_labels, renumber_gpus
from moetune.errors import InputError
from moetune.hardware.inventory import load
from moetune.kinds import EngineKind
from moetune.model.archs import PRESET_RECIPES, PRESETS
from moetune.model.profile import load_profile
from moetune.model.testmodel import generate
from moetune.plan.plan import ServiceSpec, make_plan
from moetune.plan.settings import ServerOptions, Settings

IMAGE = "registry.home.arpa/ik_llama.cpp:latest"
REPO = "models--ubergarm--GLM-5.1-GGUF"
SNAPSHOT = "snapshots/a9962c23e50d9c352e09fe0d9cb131026f4e6441/IQ3_KS"
# reference 000's base command, up to the model (its --device gpu=1 run: the one GPU it pins)
REFERENCE_000 = (
    "podman run --rm --device nvidia.com/gpu=1 -p 8000:8000 --cap-add=SYS_NICE "
    f"-v /mnt/data/models/{REPO}:/models:ro,Z {IMAGE} "
    "-m /models/snapshots/.../GLM-5.1-IQ3_KS-00001-of-00008.gguf"
)


def test_the_reference_base_command_from_a_plan_on_one_gpu_of_two(tmp_path: Path) -> None:
    """A plan for GLM-5.1 (the sparse replica, in a Hugging Face cache as the reference has it) on
    CUDA1 of the two-GPU rig, threads set, the server on 0.0.0.0:8000. Differences allowed from the
    reference: the mount's source is where this test keeps the model (not /mnt/data/models), the
    snapshot path is spelled out (the reference elides it as ``...``), and `moetune launch` adds
    ``--name moetune-<run>-<service>`` and ``-e MOETUNE_RUN=...`` (tests/run/test_podman.py)."""
    d = tmp_path / REPO / SNAPSHOT
    d.mkdir(parents=True)
    arch, dims = PRESETS["glm-5.1"]
    g = generate(d / "GLM-5.1-IQ3_KS.gguf", arch, dims, PRESET_RECIPES["glm-5.1"], shards=8, sparse=True)
    s = Settings(
        ctx=32768,
        ctk="q8_0",
        ctv="q8_0",
        batch=8192,
        ubatch=8192,
        engine=EngineKind.IK,
        amb_mib=512,
        threads=15,
        threads_batch=24,
        server=ServerOptions(host="0.0.0.0"),
    )  # plan --listen 0.0.0.0
    plan = make_plan(
        [
            ServiceSpec(
                name="glm",
                model=load_profile(g.files[0]),
                settings=s,
                strategy="cpu-moe",
                port=8000,
                devices=("CUDA1",),
            )
        ],
        load("rtx-pro-6000x2"),
    )
    sp = plan.main
    assert service_gpus(sp) == ("CUDA1",)
    assert list(plan_json(plan, "ik")["launch"]["processes"][0]["gpus"]) == ["CUDA1"]  # what launch passes
    argv = service_argv(sp)
    assert "CUDA1" in argv  # --device CUDA1: the service's GPU, as the host numbers it
    assert argv[argv.index("--host") + 1] == "0.0.0.0"
    got = container_command("podman", IMAGE, Command("glm", 8000, ("llama-server", *argv)), gpus=service_gpus(sp)).argv
    image_at = got.index(IMAGE)
    ref = shlex.split(REFERENCE_000)
    ref[ref.index("-v") + 1] = f"{tmp_path}/{REPO}:/models:ro,Z"
    ref[-1] = f"/models/{SNAPSHOT}/GLM-5.1-IQ3_KS-00001-of-00008.gguf"
    assert list(got[: image_at + 3]) == ref
    inside = list(got[image_at + 1 :])
    assert inside[inside.index("--device") + 1] == "CUDA0"  # the container sees its one GPU as CUDA0
    assert not any("CUDA1" in a for a in inside)
    assert inside[inside.index("-t") + 1] == "15"
    at = inside.index("--host")
    assert inside[at : at + 4] == ["--host", "0.0.0.0", "--port", "8000"]
    # docker: the same GPU, docker's way
    docker = container_command("docker", IMAGE, Command("glm", 8000, ("llama-server", *argv)), gpus=("CUDA1",))
    assert shlex.join(docker.argv).startswith("docker run --rm --gpus '\"device=1\"' -p 8000:8000 --cap-add=SYS_NICE ")


@pytest.mark.parametrize(
    ("argv", "gpus", "want"),
    [
        (
            ["--device", "CUDA1", "-ot", r"blk\.[0-3]\.ffn_.*_exps=CUDA1,exps=CPU"],
            ["CUDA1"],
            ["--device", "CUDA0", "-ot", r"blk\.[0-3]\.ffn_.*_exps=CUDA0,exps=CPU"],
        ),
        (
            ["-dev", "CUDA3,CUDA1", "-ot", "a=CUDA3,b=CUDA1", "-ts", "1,2", "-mg", "1"],
            ["CUDA3", "CUDA1"],
            ["-dev", "CUDA1,CUDA0", "-ot", "a=CUDA1,b=CUDA0", "-ts", "1,2", "-mg", "1"],
        ),
        # host buffers and names that only look like a device, and model paths, stay
        (
            ["-m", "/m/CUDA1/x.gguf", "-ot", "a=CUDA_Host,b=RPC0[127.0.0.1:5]"],
            ["CUDA1"],
            ["-m", "/m/CUDA1/x.gguf", "-ot", "a=CUDA_Host,b=RPC0[127.0.0.1:5]"],
        ),
        (["--override-tensor", "x=CUDA10"], ["CUDA2", "CUDA10"], ["--override-tensor", "x=CUDA1"]),
    ],
)
def test_renumber_gpus(argv: list[str], gpus: list[str], want: list[str]) -> None:
    assert renumber_gpus(argv, gpus) == want


def test_a_gpu_the_container_is_not_given_is_refused() -> None:
    with pytest.raises(InputError, match="CUDA0, which the container is not given"):
        renumber_gpus(["-ot", "x=CUDA0"], ["CUDA1"])
    with pytest.raises(InputError, match="no GPU"):
        renumber_gpus(["--device", "CUDA0"], [])
    with pytest.raises(InputError, match="by their CUDA index"):
        container_command("podman", "img", Command("m", 1, ("llama-server", "-c", "1")), gpus=("Vulkan0",))


def _run(*args: str, **kw: object) -> list[str]:
    cmd = Command("main", 8080, ("llama-server", "-m", "/m/x.gguf", *args))
    return list(container_command("podman", "img", cmd, **kw).argv)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("host", "net", "inside"),
    [
        ("127.0.0.1", ["--network", "host"], "127.0.0.1"),
        ("::1", ["--network", "host"], "::1"),
        ("0.0.0.0", ["-p", "8080:8080"], "0.0.0.0"),
        ("192.168.1.5", ["-p", "192.168.1.5:8080:8080"], "0.0.0.0"),
        ("fd00::5", ["-p", "[fd00::5]:8080:8080"], "0.0.0.0"),
    ],
)
def test_a_loopback_server_shares_the_host_network_another_is_published(host: str, net: list[str], inside: str) -> None:
    got = _run("--host", host, "--port", "8080")
    assert got[3 : 3 + len(net)] == net
    assert got[got.index("--host") + 1] == inside


def test_name_nice_environment_entrypoint_and_cpu_only() -> None:
    got = _run(
        "--host",
        "127.0.0.1",
        "--port",
        "8080",
        "--prio",
        "2",
        name="moetune-r1-main",
        env={"MOETUNE_RUN": "r1", "GGML_RPC_NO_RDMA": "1"},
        entrypoint="/usr/local/bin/ggml-rpc-server",
    )
    img = got.index("img")
    assert got[:img] == [
        "podman",
        "run",
        "--rm",
        "--name",
        "moetune-r1-main",
        "--network",
        "host",
        "--cap-add=SYS_NICE",
        "-e",
        "MOETUNE_RUN=r1",
        "-e",
        "GGML_RPC_NO_RDMA=1",
        "-v",
        "/m:/models:ro,Z",
        "--entrypoint",
        "/usr/local/bin/ggml-rpc-server",
    ]
    plain = _run("--host", "127.0.0.1", "--port", "8080")
    assert "--cap-add=SYS_NICE" not in plain and "--device" not in plain  # no threads set, no GPU
    # an RPC worker: the host's network, whatever it binds
    worker = container_command(
        "podman",
        "img",
        Command("rpc0", 50052, ("ggml-rpc-server", "-H", "10.0.0.2", "-p", "50052", "-t", "4")),
        host_network=True,
    )
    assert worker.argv[3:6] == ("--network", "host", "--cap-add=SYS_NICE")
    assert worker.argv[-6:] == ("img", "-H", "10.0.0.2", "-p", "50052", "-t", "4")[-6:]


def test_a_container_is_named_after_the_run_and_the_process() -> None:
    from moetune.run.container import container_name

    assert container_name("20260721-093015-3fa2", "main") == "moetune-20260721-093015-3fa2-main"
    assert container_name("20260721-093015-3fa2", "coder 1: é") == "moetune-20260721-093015-3fa2-coder-1---"


def test_a_key_file_is_mounted_alone_read_only() -> None:
    got = _run("--api-key-file", "/home/me/keys/llm.txt", "--host", "0.0.0.0", "--port", "8080")
    assert "/home/me/keys/llm.txt:/moetune/files/0-llm.txt:ro,Z" in got and "/home/me/keys:" not in " ".join(got)
    assert got[got.index("--api-key-file") + 1] == "/moetune/files/0-llm.txt"
    with pytest.raises(InputError, match="absolute path"):
        _run("--api-key-file", "keys.txt")


def test_a_directory_two_services_mount_is_labelled_shared() -> None:
    a, b, c = (["-m", "/m/a.gguf"], ["-m", "/m/b.gguf", "-md", "/d/x.gguf"], ["-m", "/other/c.gguf"])
    assert mount_labels([a, b, c]) == ["z", "z", "Z"]
    hf = "/hub/models--o--n/snapshots/r/{}/m.gguf"
    assert mount_labels([["-m", hf.format("Q4")], ["-m", hf.format("Q8")]]) == ["z", "z"]  # one repository
    assert mount_labels([a]) == ["Z"]
