"""Hostile input to every rendered command (issue 16): model paths and service names holding spaces,
quotes, ``$()``, backticks, ``;``, newlines, ``*``, a leading ``-`` and non-ASCII, through
`moetune plan --format argv|shell|podman|docker|llama-swap` and the plan JSON's ``shell``.

Each shell text is checked by ``bash -n``, then run by ``sh`` and ``bash`` with stub ``llama-server``,
``podman`` and ``docker`` first on PATH, which record their argv (NUL-separated, one file per call);
the recorded argv must equal the plan's exactly. A llama-swap configuration must load as YAML and
its ``cmd`` must split, by llama-swap's own rules (below), to the same argv; what llama-swap cannot
carry (a line break, a ``${...}`` it would take for a macro) is refused with exit 2 and one line
naming the service and the argument."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from moetune.engine.formats import Command, container_command, llama_swap_config, mount_labels
from moetune.errors import InputError
from moetune.model.archs import Dims
from moetune.model.testmodel import generate
from tests.helpers import run_cli

CPU_HW = "nodes: [{name: local, cpu: {cores: 16, ram_mib: 786432, ram_bw_gbs: 460}}]\n"
GPU_HW = (
    "nodes: [{name: local, cpu: {cores: 16, ram_mib: 786432, ram_bw_gbs: 460}, "
    "devices: [{name: CUDA0, kind: gpu, mem_mib: 97247, bw_gbs: 1790}]}]\n"
)

# (case id, the hostile text; used as a directory, in a file name and as a service name)
HOSTILE = [
    ("space", "my models"),
    ("single-quote", "it's"),
    ("double-quote", 'say "hi"'),
    ("command-substitution", "$(touch PWNED)"),
    ("backticks", "`touch PWNED`"),
    ("semicolon", "a;touch PWNED"),
    ("newline", "two\nlines"),
    ("newline-comment", "x\n# hidden\ntouch PWNED"),
    ("glob", "*"),
    ("leading-dash", "-rf"),
    ("non-ASCII", "modèles 模型 ünï"),
    ("backslash", "back\\slash\\"),
    ("tab", "tab\there"),
    ("hash", "#not a comment"),
    ("dollar-brace", "${HOME}"),
    ("llama-swap-macro", "${PORT}"),
    ("llama-swap-env", "${env.HOME}"),
]
# what llama-swap cannot carry: a line break in cmd (its parser drops lines that start with '#'
# and rewrites a trailing backslash), a ${name} or ${env.NAME} it would substitute (or refuse as unknown)
SWAP_REFUSES = {"newline", "newline-comment", "dollar-brace", "llama-swap-macro", "llama-swap-env"}

STUB = """#!{python}
import os, sys
out = os.path.join(os.environ["STUB_OUT"], f"{{os.path.basename(sys.argv[0])}}-{{os.getpid()}}")
with open(out, "wb") as f:
    f.write(b"\\0".join(os.fsencode(a) for a in [os.path.basename(sys.argv[0]), *sys.argv[1:]]))
"""


# -- llama-swap's reading of cmd (proxy/config/config.go: StripComments, SanitizeCommand; the POSIX
# dialect of github.com/billziss-gh/golib/shlex that SanitizeCommand splits with) ---------------

SWAP_MACRO = re.compile(r"\$\{([a-zA-Z0-9_-]+)\}")
SWAP_ENV_MACRO = re.compile(r"\$\{env\.([a-zA-Z_][a-zA-Z0-9_]*)\}")


def golib_posix_split(line: str) -> list[str]:
    """github.com/billziss-gh/golib/shlex Posix.Split, rune for rune."""

    def escape(s: str, r: str, r0: str | None) -> str | None:  # None: no escape; "": an empty rune
        if r != "\\":
            return None
        if s in (" ", "A"):
            return "" if r0 in ("\n", None) else r0
        if s == '"':
            if r0 in ("\n", None):
                return ""
            return r0 if r0 in ("$", "`", '"', "\\") else None
        return None

    tokens: list[str] = []
    token: list[str] | None = None
    state = [" "]
    i = 0
    while i < len(line):
        r = line[i]
        i += 1
        r0 = line[i] if i < len(line) else None
        s = state[-1]
        e = escape(s, r, r0)
        if e is not None:
            if r0 is not None:
                i += 1
            if e == "":
                continue
        if s == " ":
            if e is not None:
                state.append("A")
                token = [*(token or []), e]
            elif r in "\"'":
                state += ["A", r]
                token = []
            elif r not in " \t\n":
                state.append("A")
                token = [*(token or []), r]
        elif s == "A":
            assert token is not None
            if e is not None:
                token.append(e)
            elif r in "\"'":
                state.append(r)
            elif r in " \t\n":
                state.pop()
                tokens.append("".join(token))
                token = None
            else:
                token.append(r)
        else:
            assert token is not None
            if e is not None:
                token.append(e)
            elif r == s:
                state.pop()
            else:
                token.append(r)
    if token is not None:
        tokens.append("".join(token))
    return tokens


def llama_swap_argv(cmd: str, port: int) -> list[str]:
    """The argv llama-swap runs for a model's ``cmd``, ${PORT} being ``port``."""
    assert not SWAP_ENV_MACRO.search(cmd)
    lines = [ln for ln in cmd.split("\n") if not ln.strip().startswith("#")]  # StripComments
    cleaned = [ln.strip()[:-1] + " " if ln.strip().endswith("\\") else ln for ln in lines]  # SanitizeCommand
    text = "\n".join(cleaned).replace("${PORT}", str(port))
    assert not SWAP_MACRO.search(text), f"llama-swap would refuse an unknown macro in {text!r}"
    return golib_posix_split(text)


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ('a \'b c\' "d\\"e" f\\ g', ["a", "b c", 'd"e', "f g"]),
        ("'' x ''", ["", "x", ""]),
        ("'it'\"'\"'s' \"$x\" 'a\\b'", ["it's", "$x", "a\\b"]),
        ("x\\\ny", ["xy"]),
    ],
)
def test_the_llama_swap_splitter_mirror(line: str, words: list[str]) -> None:
    assert golib_posix_split(line) == words


# -- running shell text -----------------------------------------------------------------------


def _stubs(tmp: Path) -> Path:
    fakes = tmp / "stubs"
    if not fakes.exists():
        fakes.mkdir()
        for name in ("llama-server", "podman", "docker"):
            (fakes / name).write_text(STUB.format(python=sys.executable))
            (fakes / name).chmod(0o755)
    return fakes


def run_shell(text: str, tmp: Path, shell: str) -> list[list[str]]:
    """``text`` run by ``shell`` in an empty directory with the stubs first on PATH: each call's argv,
    in the order the calls started (their pids); nothing else may appear in the directory."""
    subprocess.run(["bash", "-n"], input=text.encode(), check=True, timeout=30)
    got, work = tmp / "got", tmp / "work"
    for d in (got, work):
        d.mkdir(exist_ok=True)
        for f in d.iterdir():
            f.unlink()
    script = tmp / "script.sh"
    script.write_text(text)
    env = {**os.environ, "PATH": f"{_stubs(tmp)}:{os.environ['PATH']}", "STUB_OUT": str(got)}
    subprocess.run([shell, str(script)], env=env, cwd=work, check=True, timeout=30)
    assert list(work.iterdir()) == [], "the script ran something it should only have passed on"
    calls = sorted(got.iterdir(), key=lambda f: int(f.name.rsplit("-", 1)[1]))
    return [[os.fsdecode(a) for a in f.read_bytes().split(b"\0")] for f in calls]


def _port(argv: list[str]) -> int:
    return int(next(a.rsplit(":", 1)[-1] for i, a in enumerate(argv) if i and argv[i - 1] in ("--port", "-p")))


def _in_order(calls: list[list[str]], ports: list[int]) -> list[list[str]]:
    """Calls in the plan's service order (background processes start in any order)."""
    return sorted(calls, key=lambda c: ports.index(_port(c)))


# -- the plan ---------------------------------------------------------------------------------


def _model(root: Path, text: str) -> Path:
    """A tiny model in a directory named ``text``, its file name holding ``text`` too."""
    d = root / text
    d.mkdir(parents=True, exist_ok=True)
    return generate(d / f"{text} m.gguf", "qwen3moe", Dims(n_layer=4), "f16").files[0]


def _layout(tmp: Path, text: str, model: Path) -> Path:
    layout = tmp / "layout.yaml"
    layout.write_text(
        yaml.safe_dump(
            {
                "services": [
                    {"name": text, "model": str(model), "strategy": "cpu-moe"},
                    {"name": f"{text} 2", "model": str(model), "strategy": "cpu-moe", "port": 9102},
                ]
            }
        )
    )
    return layout


def _formats(args: list[str], tmp: Path, case: str) -> None:
    doc = json.loads(run_cli("plan", *args, "--json").stdout)
    want = [["llama-server", *s["argv"]] for s in doc["services"]]
    ports = [s["port"] for s in doc["services"]]
    assert doc["argv"] == want[0]

    def text(fmt: str, *more: str) -> str:
        r = run_cli("plan", *args, "--format", fmt, *more)
        assert r.exit_code == 0, r.stderr
        return r.stdout

    shell = text("shell")
    assert doc["shell"] == shell
    for sh in ("sh", "bash"):
        assert _in_order(run_shell(shell, tmp, sh), ports) == want
        assert run_shell(text("argv"), tmp, sh) == want
    for runtime in ("podman", "docker"):
        image = "reg.example/it's $(x):1"
        rendered = text(runtime, "--image", image)
        labels = mount_labels(want)  # both services mount the one model's directory: shared
        assert labels == (["z", "z"] if len(want) > 1 else ["Z"])
        expect = [
            list(
                container_command(
                    runtime, image, Command(s["name"], s["port"], tuple(w)), gpus=("CUDA0",), label=label
                ).argv
            )
            for s, w, label in zip(doc["services"], want, labels, strict=True)
        ]
        for sh in ("sh", "bash"):
            assert _in_order(run_shell(rendered, tmp, sh), ports) == expect
        for call, s in zip(expect, doc["services"], strict=True):
            model = Path(s["model"])
            assert f"{model.parent}:/models:ro,{labels[0]}" in call and f"/models/{model.name}" in call
    r = run_cli("plan", *args, "--format", "llama-swap")
    if case in SWAP_REFUSES:
        assert r.exit_code == 2 and r.stdout == ""
        message = next(ln for ln in r.stderr.splitlines() if ln.startswith("Error: "))
        assert "llama-swap cannot carry" in message, r.stderr
        return
    assert r.exit_code == 0, r.stderr
    models = yaml.safe_load(r.stdout)["models"]
    assert list(models) == [s["name"] for s in doc["services"]]
    for w, entry, port in zip(want, models.values(), ports, strict=True):
        assert llama_swap_argv(entry["cmd"], port) == w
        assert entry["proxy"] == "http://127.0.0.1:${PORT}"


@pytest.mark.parametrize(("case", "text"), HOSTILE, ids=[c for c, _ in HOSTILE])
def test_a_hostile_model_path_and_service_name_in_every_format(tmp_path: Path, case: str, text: str) -> None:
    hw = tmp_path / "hw.yaml"
    hw.write_text(GPU_HW)
    model = _model(tmp_path / "models", text)
    _formats([str(model), "--hw", str(hw), "--strategy", "n-cpu-moe:2"], tmp_path, case)  # one service: exec'd
    _formats(["--layout", str(_layout(tmp_path, text, model)), "--hw", str(hw)], tmp_path, case)  # several


def test_a_relative_path_with_a_leading_dash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`plan ./-m.gguf` (a file whose name looks like a flag) plans its absolute path."""
    hw = tmp_path / "hw.yaml"
    hw.write_text(CPU_HW)
    generate(tmp_path / "-m.gguf", "qwen3moe", Dims(n_layer=4), "f16")
    monkeypatch.chdir(tmp_path)
    doc = json.loads(run_cli("plan", "./-m.gguf", "--hw", str(hw), "--json").stdout)
    assert doc["argv"][doc["argv"].index("-m") + 1] == str(tmp_path / "-m.gguf")
    assert run_shell(doc["shell"], tmp_path, "sh") == [doc["argv"]]


@pytest.mark.parametrize("bad", ["\x00", "\x1b[31m", "\x7f", "\x85", "\u2028", "\r"])
def test_llama_swap_refuses_what_yaml_cannot_carry_in_its_cmd(bad: str) -> None:
    cmd = Command("main", 8080, ("llama-server", "-m", f"/m/a{bad}b.gguf", "--port", "8080"))
    with pytest.raises(InputError, match=r"llama-swap cannot .* service main") as e:
        llama_swap_config([cmd])
    assert "\n" not in str(e.value)
    with pytest.raises(InputError, match="llama-swap cannot"):
        llama_swap_config([Command(f"a{bad}b", 8080, ("llama-server", "--port", "8080"))])
