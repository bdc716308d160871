"""Hostile input to the commands that start and probe remote RPC workers (issue 16): the command
string ssh hands the node's login shell must give the worker exactly its argv and environment,
whatever the engine directory, the arguments and the values hold. The string is run here by
``bash -c`` and ``sh -c`` (as sshd runs it through the login shell) with a stub worker that records
its argv (NUL-separated) and environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from moetune.cluster.linktest import End
from moetune.errors import InputError
from moetune.hardware.inventory import Node, from_dict
from moetune.run.remote import RemoteProcess, pid_line, probe_node, ssh_argv, ssh_base, worker_script
from tests.run.conftest import wait_for

HOSTILE = [
    "my dir",
    "it's",
    'say "hi"',
    "$(touch PWNED)",
    "`touch PWNED`",
    "a;touch PWNED",
    "two\nlines",
    "*",
    "-rf",
    "modèles 模型",
    "k=v",
    "back\\slash",
    "#hash",
    "${HOME}",
    "tab\there",
    "~",
    "!x",
]

STUB = """#!{python}
import os, sys
with open(os.environ["STUB_OUT"], "wb") as f:
    f.write(b"\\0".join(os.fsencode(a) for a in sys.argv[1:]))
with open(os.environ["STUB_OUT"] + ".env", "wb") as f:
    f.write(os.environ.get("ODD", "<unset>").encode())
"""


def _stub(bin_dir: Path) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    b = bin_dir / "ggml-rpc-server"
    b.write_text(STUB.format(python=sys.executable))
    b.chmod(0o755)
    return b


def _remote_command(script: str) -> str:
    """What sshd gets to run: the last word of the ssh command line, given to the login shell's -c."""
    argv = ssh_argv(["ssh"], "node-b", script, tty=True)
    assert argv[-2] == "node-b"
    return argv[-1]


@pytest.mark.parametrize("shell", ["bash", "sh"])
@pytest.mark.parametrize("text", HOSTILE, ids=[repr(t) for t in HOSTILE])
def test_the_worker_command_survives_the_remote_shell(tmp_path: Path, text: str, shell: str) -> None:
    work = tmp_path / "work"
    work.mkdir()
    binary = _stub(tmp_path / text / f"{text} bin")
    args = ["-H", "10.0.0.2", "-p", "50052", text, f"--x={text}", "", " "]
    out = tmp_path / "argv"
    script = worker_script([str(binary), *args], {"MOETUNE_RUN": "r1", "ODD": text, "STUB_OUT": str(out)})
    r = subprocess.run([shell, "-c", _remote_command(script)], cwd=work, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert pid_line(r.stdout) is not None and "moetune-exit 0" in r.stdout
    assert [os.fsdecode(a) for a in out.read_bytes().split(b"\0")] == args
    assert Path(f"{out}.env").read_bytes().decode() == text
    assert list(work.iterdir()) == []


@pytest.mark.parametrize("bin_dir", ["-rf", "k=v", "-o=x"])
def test_a_relative_engine_directory_that_looks_like_an_option_or_an_assignment(tmp_path: Path, bin_dir: str) -> None:
    binary = _stub(tmp_path / bin_dir)
    out = tmp_path / "argv"
    rel = os.path.relpath(binary, tmp_path)
    script = worker_script([rel, "-p", "1"], {"STUB_OUT": str(out)})
    r = subprocess.run(
        ["bash", "-c", _remote_command(script)], cwd=tmp_path, capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 0, r.stderr
    assert out.read_bytes().split(b"\0") == [b"-p", b"1"]


def test_an_environment_name_the_shell_cannot_set_is_refused() -> None:
    with pytest.raises(InputError, match="'A B'"):
        worker_script(["/bin/true"], {"A B": "1"})


@pytest.mark.parametrize("text", HOSTILE, ids=[repr(t) for t in HOSTILE])
def test_the_probe_of_a_hostile_engine_directory(fake_ssh: Path, tmp_path: Path, text: str) -> None:
    d = tmp_path / text
    _stub(d)
    node = probe_node(ssh_base(), "node-b", str(d), ("ggml-rpc-server", "rpc-server"))
    assert node.binary == "ggml-rpc-server" and node.binary_path == f"{d}/ggml-rpc-server"


def test_a_worker_started_over_ssh_in_a_hostile_directory(fake_ssh: Path, tmp_path: Path) -> None:
    text = "it's $(touch PWNED) `x`;*\nü k=v"
    binary = _stub(tmp_path / text)
    out = tmp_path / "argv"
    args = ["-H", "127.0.0.1", "-p", "50052", text]
    p = RemoteProcess.start(
        "w", "node-b", [str(binary), *args], {"ODD": text, "STUB_OUT": str(out)}, log=tmp_path / "w.log"
    )
    wait_for(lambda: not p.alive(), 10, "the stub to finish")
    assert p.returncode == 0, (tmp_path / "w.log").read_text()
    assert [os.fsdecode(a) for a in out.read_bytes().split(b"\0")] == args
    assert not any(f.name == "PWNED" for f in Path.cwd().iterdir())


def test_a_link_test_command_survives_the_remote_shell(tmp_path: Path) -> None:
    binary = _stub(tmp_path / "$(x) it's")
    out = tmp_path / "argv"
    node = Node(name="b", cores=4, ram_mib=1024, ram_bw_gbs=10, devices=(), ssh="node-b")
    argv = End(node, ("ssh",)).argv(["env", f"STUB_OUT={out}", str(binary), *HOSTILE])
    r = subprocess.run(["bash", "-c", argv[-1]], cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert [os.fsdecode(a) for a in out.read_bytes().split(b"\0")] == HOSTILE


@pytest.mark.parametrize("target", ["-oProxyCommand=touch PWNED", "a b", "a\nb", ""])
def test_an_ssh_destination_that_ssh_would_misread_is_refused(target: str) -> None:
    doc = {
        "nodes": [
            {"name": "a", "cpu": {"cores": 4, "ram_mib": 1024, "ram_bw_gbs": 10}},
            {
                "name": "b",
                "cpu": {"cores": 4, "ram_mib": 1024, "ram_bw_gbs": 10},
                "ssh": target,
                "link_addr": "10.0.0.2",
            },
        ]
    }
    with pytest.raises(InputError, match="not an ssh destination"):
        from_dict(doc)


def test_an_ssh_destination_with_shell_characters_is_one_argument() -> None:
    target = "me@host;$(touch PWNED)"
    argv = ssh_argv(["ssh"], target, "true")
    assert argv[argv.index(target) - 1] == "-T" and argv[-1] == "exec /bin/sh -c true"
