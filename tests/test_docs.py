"""The README and the docs site stay true (as sqlite-utils' tests/test_docs.py): every command and
subcommand the CLI has is documented, every ``$ moetune`` example either runs here with its output
compared or says why it cannot, the CLI reference is the commands' own help, and the site builds.

The markers, each on the line right before a fenced block:

- ``<!-- runs in tests/test_docs.py -->``: the block's ``$ moetune`` lines run in order (a line
  ending in ``\\`` continues on the next), in one directory that holds what the examples name (the
  sparse GLM-5.1 and Qwen3-Coder-Next replicas, two tiny generated models, the log fixtures of
  tests/fixtures/logs, and every file a page writes). The lines after a command, up to the next
  ``$`` line, are an excerpt of its output: each must be found in a line of what it printed
  (stdout or stderr), after runs of spaces are squeezed to one, the example directory's path is
  dropped, and ``…`` or ``...`` stand for anything. An excerpt with an ``Error:`` line expects
  the command to fail (a non-zero exit), any other a zero one.
  A command may start with environment assignments; ``PORT`` in them is the port of a Hugging
  Face-style hub on the loopback that serves ubergarm/GLM-5.1-GGUF's IQ3_KS files as the replica
  (``HF_ENDPOINT=http://127.0.0.1:PORT moetune inspect --hf ...``), and its address in the output
  reads ``127.0.0.1:PORT``.
- ``<!-- needs: WHAT (REASON) -->``: the block's examples do not run here, because they need WHAT
  (a GPU, a launched server, the network, ...); REASON says what they show that this machine cannot.
- ``<!-- file: NAME -->`` (before a YAML or text block): the block's text is written to NAME in
  the example directory, at that point of the page, for the examples after it.

A block with a ``$ moetune`` line and neither marker fails the test that names it; every example,
run or not, must name a command and options it has (click parses it).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from moetune.cli import cli
from tests.gguf_http import Hub, serve
from tests.helpers import run_cli

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.rglob("*.md"))]
LOGS = Path(__file__).resolve().parent / "fixtures" / "logs"
RUNS_MARK = "<!-- runs in tests/test_docs.py -->"
_NEEDS = re.compile(r"^<!-- needs: (?P<what>[^()]+?) \((?P<why>[^()]+(?:\([^()]*\)[^()]*)*)\) -->$")
_FILE = re.compile(r"^<!-- file: (?P<name>[\w.-]+) -->$")
_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
_INLINE = re.compile(r"`([^`\n]+)`")
_MENTION = re.compile(r"moetune ([a-z][a-z-]*(?:\|[a-z][a-z-]*)*)(?: ([a-z][a-z-]*(?:\|[a-z][a-z-]*)*))?")
_ENV = re.compile(r"^[A-Z_][A-Z0-9_]*=")
README_MAX_BYTES = 15 * 1024
COLUMNS = "100"  # the width the documented tables were printed at
HF_REPO = "ubergarm/GLM-5.1-GGUF"


@dataclass(frozen=True, kw_only=True)
class Block:
    """A fenced block of a page, with the marker line right before it (or "")."""

    page: Path
    line: int  # of the opening fence, 1-based
    marker: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    def examples(self) -> list[str]:
        """The ``$`` lines that run moetune (continuations joined)."""
        return [cmd for cmd, _ in self.commands() if is_moetune(cmd)]

    def commands(self) -> list[tuple[str, list[str]]]:
        """Each ``$`` line (continuations joined) and the output lines after it."""
        out: list[tuple[str, list[str]]] = []
        lines = self.text.splitlines()
        i = 0
        while i < len(lines):
            line = lines[i]
            i += 1
            if not line.startswith("$ "):
                if out:
                    out[-1][1].append(line)
                continue
            cmd = line[2:]
            while cmd.endswith("\\") and i < len(lines):
                cmd = cmd[:-1] + " " + lines[i].strip()
                i += 1
            out.append((cmd, []))
        return out


def blocks(page: Path) -> list[Block]:
    found = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("```"):
            start = i
            i += 1
            body = []
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            marker = lines[start - 1].strip() if start > 0 else ""
            found.append(Block(page=page, line=start + 1, marker=marker, text="\n".join(body)))
        i += 1
    return found


def is_moetune(cmd: str) -> bool:
    words = cmd.split()
    while words and _ENV.match(words[0]):
        words.pop(0)
    return (bool(words) and words[0] == "moetune") or " moetune " in f" {cmd} "


def argv(cmd: str) -> tuple[dict[str, str], list[str]]:
    """A command's environment assignments (``HF_ENDPOINT=...``) and its arguments after ``moetune``."""
    words = shlex.split(cmd, comments=True)
    env = {}
    while words and _ENV.match(words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    assert words and words[0] == "moetune", f"a runnable example runs moetune: {cmd}"
    return env, words[1:]


@contextlib.contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def squeeze(s: str) -> str:
    return re.sub(r"\s+", " ", s).strip()


def matches(expected: str, actual_lines: list[str]) -> bool:
    parts = re.split(r"…|\.\.\.", squeeze(expected))
    pattern = re.compile(".*".join(re.escape(p) for p in parts))
    return any(pattern.search(a) for a in actual_lines)


def runs_blocks(page: Path) -> list[Block]:
    return [b for b in blocks(page) if b.marker == RUNS_MARK]


# -- every command documented -------------------------------------------------------------------


def command_paths(group: click.Group, prefix: str = "") -> list[str]:
    """Every command and subcommand, walked through the lazy group (so each module is imported)."""
    ctx = click.Context(group)
    paths = []
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        assert cmd is not None, name
        paths.append(prefix + name)
        if isinstance(cmd, click.Group):
            paths += command_paths(cmd, prefix + name + " ")
    return paths


def documented(text: str) -> set[str]:
    code = [m[1] for m in _FENCE.finditer(text)]
    code += _INLINE.findall(text.replace("\\|", "|"))
    code += [line for line in text.splitlines() if line.startswith("#")]
    found: set[str] = set()
    for chunk in code:
        for m in _MENTION.finditer(chunk):
            for top in m[1].split("|"):
                found.add(top)
                found.update(f"{top} {sub}" for sub in (m[2] or "").split("|") if sub)
    return found


def test_every_command_is_documented() -> None:
    """Outside the generated CLI reference: a page that shows each command in use."""
    text = "\n".join(p.read_text() for p in PAGES if p != DOCS / "reference" / "cli.md")
    missing = [p for p in command_paths(cli) if p not in documented(text)]
    assert not missing, f"neither README.md nor docs/ show: {', '.join('moetune ' + p for p in missing)}"


def test_readme_keeps_its_first_lines() -> None:
    assert README.read_text().splitlines()[2:6] == [
        "```",
        "make demo    # the main job end to end on a built-in example (builds llama.cpp the first time)",
        "make test    # the full test suite (the same command CI runs)",
        "```",
    ]


def test_readme_is_short() -> None:
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes, more than {README_MAX_BYTES}: move detail into docs/"


def slug(heading: str) -> str:
    """The anchor mkdocs' toc extension gives a heading (its default slugify)."""
    text = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def test_readme_links_resolve() -> None:
    """mkdocs checks the site's links; the README is outside it, so here: each file and anchor exists."""
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", README.read_text()):
        if "://" in target:
            continue
        path, _, anchor = target.partition("#")
        f = ROOT / path
        anchors = (
            {slug(h.lstrip("#")) for h in f.read_text().splitlines() if h.startswith("#")} if f.exists() else set()
        )
        if not f.exists() or (anchor and anchor not in anchors):
            broken.append(target)
    assert not broken, f"README.md links to what is not there: {', '.join(broken)}"


# -- every example runs or says why not ---------------------------------------------------------


def test_every_example_is_marked() -> None:
    unmarked, bad = [], []
    for page in PAGES:
        for b in blocks(page):
            if not b.examples():
                continue
            if b.marker == RUNS_MARK:
                continue
            if b.marker.startswith("<!-- needs:"):
                if not _NEEDS.match(b.marker):
                    bad.append(f"{b.where}: {b.marker}")
                continue
            unmarked.append(f"{b.where}: {b.examples()[0]}")
    assert not bad, "a needs marker is <!-- needs: WHAT (REASON) -->:\n" + "\n".join(bad)
    assert not unmarked, (
        f"these blocks show `$ moetune` but neither run ({RUNS_MARK}) nor say what they "
        "need (<!-- needs: WHAT (REASON) -->):\n" + "\n".join(unmarked)
    )


def parse_problem(cmd: str) -> str | None:
    """Why CMD would not parse (an unknown command or option, a bad choice), or None. Files need not
    exist and required arguments may be elided: an example that does not run still names only what
    the command takes."""
    _, words = argv(cmd)
    args = [w for w in words if w not in ("…", "...")]
    # contexts as click makes them (context_settings, -h and --help inherited): click caches each
    # command's help option from the first context that asks, and the CLI reference reads it
    parent = cli.make_context("moetune", [], resilient_parsing=True)
    cmd_obj: click.Command = cli
    name = "moetune"
    while isinstance(cmd_obj, click.Group) and args:
        sub = cmd_obj.get_command(parent, args[0])
        if sub is None:
            return f"no command {args[0]!r}"
        name = args.pop(0)
        if isinstance(sub, click.Group) and args:
            parent = sub.make_context(name, [], parent=parent, resilient_parsing=True)
        cmd_obj = sub
    try:
        cmd_obj.make_context(name, args, parent=parent)
    except click.MissingParameter:
        return None
    except click.BadParameter as e:
        return None if "does not exist" in e.format_message() else e.format_message()
    except click.UsageError as e:
        return e.format_message()
    return None


def test_every_example_parses() -> None:
    """Also the examples that cannot run here: each names a command and options it has."""
    bad = []
    for page in PAGES:
        for b in blocks(page):
            for cmd in b.examples():
                if re.search(r"[|>;`]|\$[A-Za-z({]|\bfor\b", cmd):
                    continue  # shell around the command (a pipe, a redirect, a loop, a variable)
                why = parse_problem(cmd)
                if why:
                    bad.append(f"{b.where}: $ {cmd}\n  {why}")
    assert not bad, "\n".join(bad)


def test_the_markers_mark_blocks() -> None:
    """A marker that is not right before a fence marks nothing: say so instead of skipping it."""
    stray = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            if (line == RUNS_MARK or _NEEDS.match(line) or _FILE.match(line)) and not (
                i + 1 < len(lines) and lines[i + 1].startswith("```")
            ):
                stray.append(f"{page.relative_to(ROOT)}:{i + 1}")
    assert not stray, "a marker must come right before a fenced block: " + ", ".join(stray)


@pytest.fixture(scope="module")
def example_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("docs")
    for args in (
        ("GLM-5.1.gguf", "--preset", "glm-5.1", "--shards", "8", "--sparse"),
        ("coder.gguf", "--preset", "qwen3-coder-next", "--sparse"),
        ("tiny.gguf", "--arch", "glm4moe", "--layers", "4", "--dense-lead", "1", "--nextn", "1"),
        ("tiny4.gguf", "--arch", "qwen3moe", "--layers", "4"),
    ):
        r = run_cli("testmodel", str(d / args[0]), *args[1:])
        assert r.exit_code == 0, r.stderr
    for log in LOGS.glob("*.log"):
        shutil.copy(log, d)
    return d


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    """A Hugging Face-style hub on the loopback (tests/gguf_http.py) holding ubergarm/GLM-5.1-GGUF's
    IQ3_KS files as the sparse replica, answering file requests itself (no CDN redirect, so the
    documented request counts are the hub's own): the examples' ``HF_ENDPOINT=http://127.0.0.1:PORT``
    points at it (PORT is its port)."""
    root = tmp_path_factory.mktemp("hub")
    quant = root / HF_REPO / "IQ3_KS"
    quant.mkdir(parents=True)
    r = run_cli("testmodel", str(quant / "GLM-5.1-IQ3_KS.gguf"), "--preset", "glm-5.1", "--shards", "8", "--sparse")
    assert r.exit_code == 0, r.stderr
    with serve(Hub(root, repos={HF_REPO: root / HF_REPO})) as h:
        yield h


def run_page(page: Path, d: Path, hub_url: str) -> list[str]:
    """Run a page's runnable blocks in order; the problems found."""
    port = hub_url.rsplit(":", 1)[1]
    problems = []
    for b in blocks(page):
        m = _FILE.match(b.marker)
        if m:
            (d / m["name"]).write_text(b.text + "\n")
            continue
        if b.marker != RUNS_MARK:
            continue
        for cmd, expected in b.commands():
            if not is_moetune(cmd):
                continue
            env, args = argv(cmd)
            with environment({k: v.replace("PORT", port) for k, v in env.items()}):
                r = run_cli(*args)
            out = (r.stdout + "\n" + r.stderr).replace(f"{d}/", "").replace(str(d), ".")
            out = out.replace(f"127.0.0.1:{port}", "127.0.0.1:PORT")
            actual = [squeeze(a) for a in out.splitlines()]
            fails = any(e.startswith("Error:") for e in expected)
            if fails != (r.exit_code != 0):
                problems.append(
                    f"{b.where}: $ {cmd}\n  exit {r.exit_code} (expected {'non-zero' if fails else 0})"
                    f"\n  stderr: {r.stderr.strip()[-2000:]}"
                )
                continue
            missing = [e for e in expected if squeeze(e) and squeeze(e) not in ("...", "…") and not matches(e, actual)]
            if missing:
                problems.append(
                    f"{b.where}: $ {cmd}\n  not in its output:\n    "
                    + "\n    ".join(missing)
                    + "\n  output:\n    "
                    + "\n    ".join(out.splitlines()[:200])
                )
    return problems


@pytest.mark.parametrize("page", [p for p in PAGES if runs_blocks(p)], ids=lambda p: str(p.relative_to(ROOT)))
def test_examples_run(page: Path, example_dir: Path, hub: Hub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(example_dir)
    monkeypatch.setenv("COLUMNS", COLUMNS)
    problems = run_page(page, example_dir, hub.url)
    assert not problems, "\n\n".join(problems)


# -- the CLI reference and the site -------------------------------------------------------------


def load_script(name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cli_reference_is_current() -> None:
    gen = load_script("gen_cli_reference")
    current = (DOCS / "reference" / "cli.md").read_text()
    assert current == gen.render(), "docs/reference/cli.md is not current: run `python scripts/gen_cli_reference.py`"


def test_site_builds_strict(tmp_path: Path) -> None:
    """`make docs`: every page in the nav, every link and anchor resolves."""
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (pip install -e '.[dev]')")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "-f",
            str(ROOT / "mkdocs.yml"),
            "-d",
            str(tmp_path / "site"),
        ],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1"},
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
