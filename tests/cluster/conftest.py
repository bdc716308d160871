"""Two hosts on this machine: network namespaces joined by a veth pair on a private /30, each
running its own sshd (started here, with a host key and an authorized key made for the session),
reached with a generated ssh config through ``MOETUNE_SSH_COMMAND``. Nothing outside the temporary
directory and the two namespaces is touched (besides creating /run/sshd, which sshd requires);
the namespaces, with everything running in them, are removed at the end even when a test fails.

Also a fake ``ssh`` for tests that need no root: it runs the remote command here.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from moetune.model.archs import Dims
from moetune.model.testmodel import generate
from tests.run.conftest import plan_file, tiny_model  # shared fixtures of the launch tests

__all__ = ["plan_file", "tiny_model"]

SSHD = Path("/usr/sbin/sshd")
NEEDS = ("ip", "ssh", "ssh-keygen")


@dataclass(frozen=True)
class Host:
    node: str  # name in the hardware file
    ns: str  # network namespace
    addr: str  # its address on the veth link
    alias: str  # Host in the generated ssh config


@dataclass(frozen=True)
class TwoHosts:
    a: Host  # runs moetune and llama-server
    b: Host  # runs ggml-rpc-server
    dir: Path
    ssh_config: Path
    sshd_pids: dict[str, int]  # namespace -> its sshd

    @property
    def ssh_command(self) -> str:
        return f"ssh -F {self.ssh_config}"

    def run(self, host: Host, *argv: str, timeout: float = 60, **kw: object) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ip", "netns", "exec", host.ns, *argv], capture_output=True, text=True, timeout=timeout, **kw
        )  # type: ignore[call-overload, no-any-return]

    def popen(self, host: Host, *argv: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            ["ip", "netns", "exec", host.ns, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def moetune(self, host: Host, *args: str) -> subprocess.Popen[str]:
        """`moetune ARGS` inside a namespace (the environment carries MOETUNE_DATA_DIR and the ssh command)."""
        return self.popen(host, sys.executable, "-m", "moetune", *args)

    def ssh(self, host: Host, script: str) -> subprocess.CompletedProcess[str]:
        """A command on ``host`` over ssh, from host a."""
        return self.run(self.a, "ssh", "-F", str(self.ssh_config), host.alias, script)

    def pids(self, host: Host) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", host.ns], capture_output=True, text=True).stdout
        return [int(x) for x in out.split()]

    def leftovers(self, wait_s: float = 5.0) -> dict[str, list[str]]:
        """Processes in either namespace besides the sshd daemons (ssh sessions get a moment to close)."""
        deadline = time.monotonic() + wait_s
        while True:
            left = {
                h.ns: [f"{p} {cmdline(p)}" for p in self.pids(h) if p != self.sshd_pids[h.ns]] for h in (self.a, self.b)
            }
            if not any(left.values()) or time.monotonic() > deadline:
                return {k: v for k, v in left.items() if v}
            time.sleep(0.1)

    def http(self, url: str, body: dict[str, object]) -> dict[str, object]:
        """POST JSON to a URL inside namespace a (where llama-server listens on its loopback)."""
        code = (
            "import httpx, json, sys; r = httpx.post(sys.argv[1], json=json.loads(sys.argv[2]), timeout=60); "
            "print(json.dumps({'status': r.status_code, 'body': r.json()}))"
        )
        r = self.run(self.a, sys.executable, "-c", code, url, json.dumps(body))
        assert r.returncode == 0, r.stderr
        doc: dict[str, object] = json.loads(r.stdout)
        return doc


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def _sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


def _kill_namespace(ns: str) -> None:
    """SIGKILL whatever runs in our namespace, then remove it (its veth end goes with it)."""
    for _ in range(50):
        out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
        pids = [int(x) for x in out.stdout.split()]
        if out.returncode != 0 or not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _sshd_config(d: Path, host: Host) -> Path:
    cfg = d / f"sshd_{host.node}.conf"
    cfg.write_text(
        "\n".join(
            [
                f"ListenAddress {host.addr}",
                "Port 22",
                f"HostKey {d / 'host_key'}",
                f"AuthorizedKeysFile {d / 'authorized_keys'}",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "UsePAM no",
                "PermitRootLogin prohibit-password",
                "StrictModes no",
                "PidFile none",
                "LogLevel ERROR",
                "",
            ]
        )
    )
    return cfg


def _ssh_config(d: Path, hosts: list[Host]) -> Path:
    cfg = d / "ssh_config"
    lines = []
    for h in hosts:
        lines += [f"Host {h.alias}", f"  HostName {h.addr}"]
    lines += [
        "Host *",
        "  User root",
        f"  IdentityFile {d / 'client_key'}",
        "  IdentitiesOnly yes",
        f"  UserKnownHostsFile {d / 'known_hosts'}",
        "  StrictHostKeyChecking yes",
        "  BatchMode yes",
        "  LogLevel ERROR",
        "",
    ]
    cfg.write_text("\n".join(lines))
    return cfg


@pytest.fixture(scope="module")  # torn down right after the tests that use it
def two_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoHosts]:
    missing = [x for x in NEEDS if shutil.which(x) is None] + ([] if SSHD.exists() else [str(SSHD)])
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (Debian: apt-get install openssh-server openssh-client iproute2)")
    tag = secrets.token_hex(3)
    net = 4 * secrets.randbelow(64)
    third = secrets.randbelow(256)
    a = Host("a", f"moetune-t-{tag}-a", f"10.213.{third}.{net + 1}", f"moetune-t-{tag}-a")
    b = Host("b", f"moetune-t-{tag}-b", f"10.213.{third}.{net + 2}", f"moetune-t-{tag}-b")
    d = tmp_path_factory.mktemp("two-hosts")
    procs: list[subprocess.Popen[bytes]] = []
    made = subprocess.run(["ip", "netns", "add", a.ns], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot create network namespaces here: {made.stderr.strip()}")
    try:
        _sh("ip", "netns", "add", b.ns)
        for h in (a, b):
            _sh("ip", "-n", h.ns, "link", "set", "lo", "up")
        _sh("ip", "link", "add", f"mt{tag}a", "type", "veth", "peer", "name", f"mt{tag}b")
        for h, dev in ((a, f"mt{tag}a"), (b, f"mt{tag}b")):
            _sh("ip", "link", "set", dev, "netns", h.ns)
            _sh("ip", "-n", h.ns, "addr", "add", f"{h.addr}/30", "dev", dev)
            _sh("ip", "-n", h.ns, "link", "set", dev, "up")
        for key in ("host_key", "client_key"):
            _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"moetune-test-{tag}", "-f", str(d / key))
        shutil.copy(d / "client_key.pub", d / "authorized_keys")
        host_pub = " ".join((d / "host_key.pub").read_text().split()[:2])
        (d / "known_hosts").write_text("".join(f"{h.addr} {host_pub}\n" for h in (a, b)))
        cfg = _ssh_config(d, [a, b])
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
        pids = {}
        for h in (a, b):
            p = subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    h.ns,
                    str(SSHD),
                    "-D",
                    "-f",
                    str(_sshd_config(d, h)),
                    "-E",
                    str(d / f"sshd_{h.node}.log"),
                ]
            )
            procs.append(p)
            pids[h.ns] = p.pid  # `ip netns exec` execs sshd: the same pid
        hosts = TwoHosts(a, b, d, cfg, pids)
        deadline = time.monotonic() + 15
        for h in (a, b):
            while hosts.ssh(h, "true").returncode != 0:
                if time.monotonic() > deadline:
                    logs = " ".join((d / f"sshd_{x.node}.log").read_text() for x in (a, b))
                    pytest.fail(f"sshd in {h.ns} does not answer: {hosts.ssh(h, 'true').stderr} {logs}")
                time.sleep(0.1)
        yield hosts
    finally:
        for h in (a, b):
            _kill_namespace(h.ns)
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(5)


@pytest.fixture
def cluster(two_hosts: TwoHosts, monkeypatch: pytest.MonkeyPatch) -> TwoHosts:
    """The two hosts, with moetune's ssh command pointed at their config for this test."""
    monkeypatch.setenv("MOETUNE_SSH_COMMAND", two_hosts.ssh_command)
    return two_hosts


@pytest.fixture(scope="session")
def split_model(models: Path) -> Path:
    """Four layers, so that the plan can put two of them on the worker's node."""
    path = models / "cluster-4layer.gguf"
    if not path.exists():
        generate(path, "qwen3moe", Dims(n_layer=4), "f16")
    return path


FAKE_SSH = """#!/bin/sh
# ssh for tests without a second host: drop the options and the destination, run the command here
while [ $# -gt 0 ]; do
  case "$1" in
    -o|-F|-i|-p|-J|-l) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
if [ "$1" = unreachable ]; then echo "ssh: Could not resolve hostname unreachable: Name or service not known" >&2; exit 255; fi
shift
exec /bin/sh -c "$*"
"""


@pytest.fixture
def fake_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """MOETUNE_SSH_COMMAND pointing at a script that runs the 'remote' command on this machine
    (destination ``unreachable`` fails as ssh does, exit 255)."""
    p = tmp_path / "fake-ssh"
    p.write_text(FAKE_SSH)
    p.chmod(0o755)
    monkeypatch.setenv("MOETUNE_SSH_COMMAND", str(p))
    return p
