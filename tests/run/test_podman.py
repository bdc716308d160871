"""A container engine end to end, with real podman: an image the test builds from moetune's own
llama-server and ggml-rpc-server (a root filesystem of the two binaries and the libraries `ldd`
lists, imported with `podman import`: no registry), registered with `moetune engine add --image`,
then planned, launched (with --verify), benchmarked, serve-benchmarked, swept, tuned, interrupted,
failed and stopped through it.

Podman runs with the test's own configuration and storage under a temporary directory
(``CONTAINERS_CONF``, ``CONTAINERS_STORAGE_CONF``), never the system's: runc (crun refuses this
kernel's hybrid cgroups), cgroupfs, no default ulimits (setting rlimits is refused here). After
each step no container is left in that storage and no process of the run is alive.
"""

from __future__ import annotations

import json
import shlex
import shutil
import signal
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from moetune.model.archs import Dims
from moetune.model.testmodel import generate
from moetune.paths import runs_dir
from moetune.run import LaunchFailed, RunDir, launch, read_plan
from moetune.store.db import ResultsDB
from tests.helpers import free_port, run_cli
from tests.run.conftest import assert_nothing_left, moetune, record, run_state, survivors, wait_for

pytestmark = [
    pytest.mark.server,
    pytest.mark.skipif(
        shutil.which("podman") is None or shutil.which("runc") is None,
        reason="needs podman and runc (.ci/run installs them)",
    ),
]
IMAGE = "localhost/moetune-test:engine"
ENGINE = "ctr"

CONTAINERS_CONF = """[containers]
default_ulimits = []
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
tmp_dir = "{root}/tmp"
[network]
network_config_dir = "{root}/cni"
"""
STORAGE_CONF = """[storage]
driver = "vfs"
graphroot = "{root}/graph"
runroot = "{root}/run"
"""


def podman(*args: str) -> str:
    r = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=120, check=True)
    return r.stdout


def containers() -> list[str]:
    """Every container in the test's storage, running or not."""
    return [n for n in podman("ps", "-a", "--format", "{{.Names}}").split() if n]


def rootfs_tar(bin_dir: Path, out: Path) -> Path:
    """The server, the RPC server and llama-fit-params (`--verify`) in /usr/local/bin, and each
    shared library `ldd` lists, at its own path."""
    bins = [bin_dir / "llama-server", bin_dir / "ggml-rpc-server", bin_dir / "llama-fit-params"]
    libs: set[str] = set()
    for b in bins:
        for line in subprocess.run(["ldd", str(b)], capture_output=True, text=True, check=True).stdout.splitlines():
            libs.update(w for w in line.split() if w.startswith("/"))
    with tarfile.open(out, "w") as tar:
        for b in bins:
            tar.add(b, f"usr/local/bin/{b.name}")
        for lib in sorted(libs):
            tar.add(Path(lib).resolve(), lib.lstrip("/"))  # the file itself, under the name the loader asks for
    return out


@pytest.fixture(scope="module")
def image(bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The test's podman (its configuration and storage) and the engine image in it."""
    root = tmp_path_factory.mktemp("podman")
    (root / "containers.conf").write_text(CONTAINERS_CONF.format(root=root))
    (root / "storage.conf").write_text(STORAGE_CONF.format(root=root))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CONTAINERS_CONF", str(root / "containers.conf"))
        mp.setenv("CONTAINERS_STORAGE_CONF", str(root / "storage.conf"))
        tar = rootfs_tar(bin_dir, root / "rootfs.tar")
        podman("import", "--change", 'ENTRYPOINT=["/usr/local/bin/llama-server"]', str(tar), IMAGE)
        try:
            yield IMAGE
        finally:
            left = containers()
            subprocess.run(["podman", "rm", "-af", "--time", "0"], capture_output=True, timeout=120)
            assert left == [], f"containers left behind: {left}"


@pytest.fixture
def testbed(image: str, models: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """The engine registered (facts probed into this test's cache), a tiny model, and hardware: this
    machine's CPU and one RPC worker on a loopback port."""
    monkeypatch.setenv("MOETUNE_CACHE_DIR", str(tmp_path / "cache"))
    r = run_cli("engine", "add", ENGINE, "--image", image, "--runtime", "podman", "--kind", "llama.cpp")
    assert r.exit_code == 0, r.stderr
    model = models / "podman-tiny.gguf"
    if not model.exists():
        generate(model, "qwen3moe", Dims(n_layer=2), "f16")
    hw = tmp_path / "hw.yaml"
    hw.write_text(
        yaml.safe_dump(
            {
                "nodes": [
                    {"name": "local", "cpu": {"cores": 2, "ram_mib": 16000, "ram_bw_gbs": 20}},
                    {
                        "name": "w0",
                        "link_addr": "127.0.0.1",
                        "rpc_port": free_port(),
                        "cpu": {"cores": 2, "ram_mib": 16000, "ram_bw_gbs": 20},
                        "devices": [{"name": "CPU", "kind": "cpu", "mem_mib": 16000, "bw_gbs": 20}],
                    },
                ]
            }
        )
    )
    return model, hw


def plan(model: Path, hw: Path, out: Path, *more: str) -> Path:
    r = run_cli(
        "plan",
        str(model),
        "--hw",
        str(hw),
        "--engine",
        ENGINE,
        "--strategy",
        "cpu-moe",
        "-t",
        "1",
        "--ctx",
        "1024",
        "--port",
        str(free_port()),
        "-o",
        str(out),
        "--json",
        *more,
    )
    assert r.exit_code == 0, r.stderr
    return out


def assert_clean(run_id: str | None = None) -> None:
    assert containers() == []
    for rid in [run_id] if run_id else [p.name for p in runs_dir().iterdir()]:
        assert_nothing_left(rid)


def test_launch_bench_serve_bench_and_stop_in_containers(
    testbed: tuple[Path, Path], tmp_path: Path, image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, hw = testbed
    monkeypatch.setenv("COLUMNS", "300")
    monkeypatch.setenv("MOETUNE_METRICS_INTERVAL", "0.1")
    p = plan(model, hw, tmp_path / "p.json")
    doc = json.loads(p.read_text())
    assert [x["engine"] for x in doc["launch"]["processes"]] == [ENGINE, ENGINE]
    assert "-nr" in doc["argv"]  # the dialect the image's facts gave (probed by running it)

    r = run_cli("launch", str(p), "--detach", "--verify", "--json")
    assert r.exit_code == 0, r.stderr
    run_id, url = json.loads(r.stdout)["run"], json.loads(r.stdout)["url"]
    verify = json.loads(r.stdout)["verify"]  # the image's llama-fit-params, in a container of its own
    assert verify["tool"] == "llama-fit-params" and verify["why"] is None, verify
    assert verify["agree"] is not None and {d["name"] for d in verify["devices"]} >= {"CPU"}
    names = {"rpc0": f"moetune-{run_id}-rpc0", "main": f"moetune-{run_id}-main"}
    assert sorted(containers()) == sorted(names.values())
    ps = json.loads(run_cli("ps", "--json").stdout)
    assert [x["containers"] for x in ps] == [names]
    assert all(n in run_cli("ps").stdout for n in names.values())  # (COLUMNS: the table wide enough)
    main = record(run_id, "main")
    argv = main["argv"]
    assert isinstance(argv, list) and argv[:5] == ["podman", "run", "--rm", "--name", names["main"]]
    assert f"{model.parent}:/models:ro,Z" in argv and f"/models/{model.name}" in argv
    assert "--cap-add=SYS_NICE" in argv and "--network" in argv  # -t 1; loopback workers
    # what ran is what `plan --format podman` prints, with the name, the run's environment and the
    # flags launch adds to every server (-lv 4, --metrics)
    text = run_cli(
        "plan",
        str(model),
        "--hw",
        str(hw),
        "--engine",
        ENGINE,
        "--strategy",
        "cpu-moe",
        "-t",
        "1",
        "--ctx",
        "1024",
        "--port",
        str(main["port"]),
        "--format",
        "podman",
    ).stdout
    printed = shlex.split(text.split("exec ", 1)[1].replace("\\\n", " "))
    ran = [a for i, a in enumerate(argv) if a not in ("--name", "-e") and argv[i - 1] not in ("--name", "-e")]
    assert ran == [*printed, "-lv", "4", "--metrics"]
    info = json.loads((runs_dir() / run_id / "run.json").read_text())
    assert info["engines"][ENGINE].endswith(f"(podman image {image})") and "version: " in info["engines"][ENGINE]
    # the server's own process, as the sampler and the doctor read it
    pid = main["container_pid"]
    assert isinstance(pid, int) and pid != main["pid"]
    assert Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] == b"/usr/local/bin/llama-server"
    assert isinstance(record(run_id, "rpc0")["container_pid"], int)
    chat = run_cli("bench", url, "-r", "1", "--warmup", "0", "--max-tokens", "4", "--db", str(tmp_path / "u.db"))
    assert chat.exit_code == 0, chat.stderr
    log = (runs_dir() / run_id / "main.log").read_text()
    assert "listening on" in log  # the container's output is the run's log
    doctor = run_cli("doctor", run_id, "--json")
    assert doctor.exit_code == 0, doctor.stderr
    # as if stopped before the worker was up: its main process is looked up at the stop
    RunDir.open(run_id).update_proc("rpc0", container_pid=None, container_start_ticks=None)
    stop = moetune("stop", run_id, "--json")  # from another process
    out, err = stop.communicate(timeout=120)
    assert stop.returncode == 0, err
    stopped = {x["name"]: x for x in json.loads(out)[0]["processes"]}
    assert {n: x["container"] for n, x in stopped.items()} == names
    # ggml-rpc-server has no SIGTERM handler, which a container's first process needs: killed at once,
    # not after the 30 s grace; llama-server ends on the SIGTERM podman passes on
    assert stopped["rpc0"]["kill_sent_at"] is not None and stopped["main"]["kill_sent_at"] is None
    assert stopped["rpc0"]["exited_at"] - stopped["rpc0"]["stop_sent_at"] < 10
    assert_clean(run_id)

    db = tmp_path / "r.db"
    r = run_cli(
        "bench", str(p), "-r", "2", "--warmup", "0", "--max-tokens", "8", "--ignore-eos", "--db", str(db), "--json"
    )
    assert r.exit_code == 0, r.stderr
    assert_clean()
    # the sampler watched the server in its container: its main process, once the launch knew it
    (launch,) = [d.name for d in runs_dir().iterdir() if d.name != run_id]
    with ResultsDB.open(db) as h:
        sampled = {
            pr["pid"]
            for snap in h.metrics(json.loads(r.stdout)["run"]["id"])
            for pr in snap["procs"]
            if pr["name"] == "main"
        }
    assert record(launch, "main")["container_pid"] in sampled
    r = run_cli(
        "serve-bench",
        str(p),
        "--concurrency",
        "1",
        "--requests",
        "3",
        "--input-len",
        "64",
        "--output-len",
        "8",
        "--db",
        str(db),
        "--json",
    )
    assert r.exit_code == 0, r.stderr
    assert_clean()


def test_ctrl_c_a_failed_launch_a_sweep_and_a_tune_leave_no_container(
    testbed: tuple[Path, Path], tmp_path: Path
) -> None:
    model, hw = testbed
    p = plan(model, hw, tmp_path / "p.json")
    # a foreground launch, Ctrl-C once it serves: stopped in order, containers removed
    fg = moetune("launch", str(p))
    wait_for(
        lambda: runs_dir().is_dir() and any(run_state(d.name) == "healthy" for d in runs_dir().iterdir()),
        120,
        "the launch to be healthy",
    )
    fg.send_signal(signal.SIGINT)
    _, err = fg.communicate(timeout=120)
    assert fg.returncode == 130, err
    assert_clean()
    doc = json.loads(p.read_text())
    doc["launch"]["processes"][-1]["argv"].append("--no-such-flag")  # the server exits at once
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    r = run_cli("launch", str(bad), "--detach")
    assert r.exit_code == 1, r.stderr
    assert "main: the engine rejected an argument: --no-such-flag" in r.stderr, r.stderr  # read from its log
    assert_clean()
    # the health wait given up at once: the server's container is stopped while podman still creates it
    spec, pdoc = read_plan(p)
    with pytest.raises(LaunchFailed, match="health"):
        launch(spec, pdoc, detached=True, timeout_s=0.05)
    assert_clean()
    assert all(survivors(d.name) == [] for d in runs_dir().iterdir())

    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({"name": "in containers", "plans": [{"label": "a", "plan": p.name}]}))
    r = run_cli(
        "sweep",
        str(sweep),
        "--depth",
        "0",
        "--pp-tokens",
        "32",
        "--tg-tokens",
        "8",
        "-r",
        "2",
        "--warmup",
        "0",
        "--db",
        str(tmp_path / "s.db"),
        "--json",
    )
    assert r.exit_code == 0, r.stderr
    assert_clean()

    r = run_cli(
        "tune",
        str(model),
        "--hw",
        str(hw),
        "--engine",
        ENGINE,
        "--strategy",
        "cpu-moe",
        "-t",
        "1",
        "--try-strategy",
        "cpu-moe",
        "--try-threads",
        "1,2",
        "--try-ubatch",
        "512",
        "--try-cache",
        "f16/f16",
        "--try-repack",
        "off",
        "--depth",
        "0",
        "--pp-tokens",
        "32",
        "--tg-tokens",
        "8",
        "-r",
        "2",
        "--warmup",
        "0",
        "--budget",
        "2",
        "--port",
        str(free_port()),
        "--db",
        str(tmp_path / "t.db"),
        "--json",
    )
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["launches"] == 2, r.stdout + r.stderr
    assert_clean()
