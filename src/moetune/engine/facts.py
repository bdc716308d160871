"""What an engine build accepts, asked of the build itself.

The dialect moetune renders follows these facts, not the engine's kind alone: ik_llama.cpp's
``-fa`` took no value in older builds and takes one now (a bare ``-fa`` swallows the next flag),
``--n-cpu-moe`` counts from the first or from the last layers depending on the version, and flags
such as ``-rtr``, ``-amb``, ``-lm`` or ``--dry-run`` exist in some builds only. A build's ``--help``
does not list all it accepts (ik_llama.cpp 0.1.5 omits ``-ot`` and ``-rtr``), so each setting is
tried: ``llama-server FLAG [VALUE] --version`` exits 0 only when the arguments before
``--version`` parse (both engines parse in order and exit at ``--version``). The help still tells
``--n-cpu-moe``'s rule. Parsing is pure; ``probe`` runs the binary (about 30 short runs, a second
or two) and caches the answer by the binary's path, size and time, or a container image (the same
runs, each in a container) by the image's id.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
import re
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from moetune.kinds import EngineKind


class NCpuMoeRule(enum.StrEnum):
    """Which layers' experts ``--n-cpu-moe N`` keeps on the CPU."""

    FIRST = "first"  # layers 0..N-1 (mainline; ik_llama.cpp with one device)
    LAST = "last"  # the last N layers (ik_llama.cpp after its PR #2262)
    # ik_llama.cpp 0.1.5's loader: the first N layers with one device (or split mode graph/attn, or
    # N >= n_layer); with two or more devices in layer split mode, N is shared among the devices in
    # proportion to their layer counts and taken from the end of each device's range
    IK_SPLIT_TAIL = "ik-split-tail"


_OPTION = re.compile(r"(?<![\w-])(--?[A-Za-z][A-Za-z0-9_-]*)")


# the settings moetune renders or reads, each as the arguments that try it; the facts name them
# by their first argument ("-fa on" is tried as such: it tells a value-taking -fa)
PROBES: tuple[tuple[str, ...], ...] = (
    ("-fa", "on"),
    ("-fa",),
    ("-no-fa",),
    ("-ot", "x=CPU"),
    ("--cpu-moe",),
    ("--n-cpu-moe", "1"),
    ("-ts", "1"),
    ("-dev", "none"),
    ("-nr",),
    ("-rtr",),
    ("-lm", "none"),
    ("--no-mmap",),
    ("-fit", "off"),
    ("--fit",),
    ("--dry-run",),
    ("--kv-unified",),
    ("--jinja",),
    ("-amb", "512"),
    ("-mla", "3"),
    ("-ger",),
    ("-muge",),
    ("-fmoe",),
    ("-no-fmoe",),
    ("--merge-qkv",),
    ("-no-ooae",),
    ("-ooae",),
    ("-sm", "graph"),
    ("-khad",),
    ("--log-disable",),
)


CONTAINER_PROBES_AT_ONCE = 4


def probe_name(args: tuple[str, ...]) -> str:
    return " ".join(args) if args[0] in ("-fa", "-fit", "-sm", "-lm") else args[0]


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineFacts:
    kind: EngineKind
    version: str  # the build's version line, e.g. "version: 0 (ik-llama-cpp-python-0.1.5)"
    accepts: frozenset[str]  # the PROBES it accepts, by probe_name: "-fa on", "-rtr", "-amb", ...
    n_cpu_moe: NCpuMoeRule
    help_flags: frozenset[str] = frozenset()  # the option spellings its --help lists

    def has(self, name: str) -> bool:
        return name in self.accepts

    @property
    def flash_attn_takes_value(self) -> bool:
        return self.has("-fa on")

    def to_json(self) -> dict[str, object]:
        return {
            "kind": self.kind.value,
            "version": self.version,
            "accepts": sorted(self.accepts),
            "n_cpu_moe": self.n_cpu_moe.value,
            "help_flags": sorted(self.help_flags),
        }

    @classmethod
    def from_json(cls, d: dict[str, object]) -> EngineFacts:
        acc, hf = d["accepts"], d.get("help_flags", [])
        assert isinstance(acc, list) and isinstance(hf, list)
        return cls(
            kind=EngineKind(str(d["kind"])),
            version=str(d["version"]),
            accepts=frozenset(map(str, acc)),
            n_cpu_moe=NCpuMoeRule(str(d["n_cpu_moe"])),
            help_flags=frozenset(map(str, hf)),
        )


def _option_column(line: str) -> str:
    """The options at the start of a help line: the segments (split at runs of spaces) that start
    with a dash, or follow one that ends with a comma (``-fa,   --flash-attn [on|off|auto]``)."""
    segs = re.split(r"\s{2,}|\t", line)
    out = [segs[0]]
    for seg in segs[1:]:
        if not (seg.startswith("-") or out[-1].endswith(",")):
            break
        out.append(seg)
    return " ".join(out)


def _option_lines(help_text: str) -> list[tuple[set[str], str]]:
    """(option spellings, the whole line) for each line of the help that starts with options."""
    out = []
    for line in help_text.splitlines():
        s = line.strip()
        if not s.startswith("-"):
            continue
        head = _option_column(s)
        names = set(_OPTION.findall(head))
        if names:
            out.append((names, s))
    return out


def parse_help(
    kind: EngineKind, help_text: str, version_text: str = "", accepts: frozenset[str] | None = None
) -> EngineFacts:
    """The facts in a ``llama-server --help`` (and ``--version``) output, with the probes it
    accepted (None: what the help lists, for a text alone)."""
    lines = _option_lines(help_text)
    flags = frozenset(f for names, _ in lines for f in names)
    if accepts is None:
        fa = next((line for names, line in lines if "--flash-attn" in names), "")
        fa_value = bool(re.search(r"on\|off|\bauto\b|<", _option_column(fa), re.IGNORECASE))
        accepts = frozenset(n for n in map(probe_name, PROBES) if n.split()[0] in flags) - {"-fa on", "-fa"}
        accepts |= {"-fa on" if fa_value else "-fa"} if "-fa" in flags else set()
    ncmoe = next((line for names, line in lines if "--n-cpu-moe" in names), "")
    if re.search(r"\blast\b", ncmoe):
        rule = NCpuMoeRule.LAST
    elif kind == EngineKind.IK:
        rule = NCpuMoeRule.IK_SPLIT_TAIL
    else:
        rule = NCpuMoeRule.FIRST
    m = re.search(r"version: .*", version_text)
    return EngineFacts(
        kind=kind,
        version=m[0].strip() if m else "unknown",
        accepts=frozenset(accepts),
        n_cpu_moe=rule,
        help_flags=flags,
    )


# The facts of the builds `moetune engine install` makes, for plans rendered where the engine is
# not built: tests/engine/test_facts_server.py asks the real binaries the same questions.
KNOWN: dict[EngineKind, EngineFacts] = {
    EngineKind.MAINLINE: EngineFacts(
        kind=EngineKind.MAINLINE,
        version="version: 0.6.0-dev (build 0, commit unknown)",
        accepts=frozenset(
            {
                "-fa on",
                "-ot",
                "--cpu-moe",
                "--n-cpu-moe",
                "-ts",
                "-dev",
                "-nr",
                "-lm none",
                "-fit off",
                "--kv-unified",
                "--jinja",
                "--log-disable",
            }
        ),
        n_cpu_moe=NCpuMoeRule.FIRST,
    ),
    EngineKind.IK: EngineFacts(
        kind=EngineKind.IK,
        version="version: 0 (ik-llama-cpp-python-0.1.5)",
        accepts=frozenset(
            {
                "-fa on",
                "-no-fa",
                "-ot",
                "--cpu-moe",
                "--n-cpu-moe",
                "-ts",
                "-dev",
                "-rtr",
                "--no-mmap",
                "--fit",
                "--dry-run",
                "--jinja",
                "-amb",
                "-mla",
                "-ger",
                "-muge",
                "-no-fmoe",
                "--merge-qkv",
                "-no-ooae",
                "-sm graph",
                "-khad",
                "--log-disable",
            }
        ),
        n_cpu_moe=NCpuMoeRule.IK_SPLIT_TAIL,
    ),
}


def probe(
    binary: Path | Sequence[str], kind: EngineKind, cache: Path | None = None, *, key: str | None = None
) -> EngineFacts:
    """Ask the build (``--help``, ``--version``, and each of PROBES before ``--version``); the
    answer is kept in ``cache`` (a directory).

    ``binary`` is the server binary (cached by its path, size and modification time), or the
    command that runs it: ``podman run --rm IMAGE`` for a container image, cached by ``key`` (the
    image's id). Each run of an image starts a container (a third of a second), so those run a few
    at a time."""
    if isinstance(binary, Path):
        st = binary.stat()
        key = f"{binary.resolve()}|{st.st_size}|{st.st_mtime_ns}"
        command: tuple[str, ...] = (str(binary),)
    else:
        command = tuple(binary)
    digest = hashlib.sha256(f"{key}|{kind}|{PROBES}".encode()).hexdigest()[:16]
    path = cache / f"facts-{digest}.json" if cache and key else None
    if path is not None and path.exists():
        try:
            return EngineFacts.from_json(json.loads(path.read_text()))
        except (ValueError, KeyError, AssertionError):
            pass

    def run(*args: str) -> tuple[int, str]:
        try:
            r = subprocess.run([*command, *args], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            return -1, ""
        return r.returncode, r.stdout + r.stderr

    rc, version = run("--version")
    if rc != 0:
        return parse_help(kind, run("--help")[1], version)
    with ThreadPoolExecutor(1 if isinstance(binary, Path) else CONTAINER_PROBES_AT_ONCE) as pool:
        codes = list(pool.map(lambda args: run(*args, "--version")[0], PROBES))
    accepts = frozenset(probe_name(args) for args, code in zip(PROBES, codes, strict=True) if code == 0)
    facts = parse_help(kind, run("--help")[1], version, accepts)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(facts.to_json()))
    return facts


def n_cpu_moe_layers(
    rule: NCpuMoeRule, n: int, n_layer: int, layer_device: list[str] | None = None, *, n_devices: int | None = None
) -> list[int]:
    """The layers whose experts ``--n-cpu-moe n`` keeps on the CPU under ``rule``. ``layer_device``
    (each layer's device, in order) and ``n_devices`` (the devices the engine counts, some perhaps
    without layers; default: those in ``layer_device``) matter for IK_SPLIT_TAIL only: two or more
    devices mean layer split over them."""
    n = max(0, n)
    if rule == NCpuMoeRule.LAST:
        return list(range(max(0, n_layer - n), n_layer))
    devices = list(dict.fromkeys(layer_device or []))
    if n_devices is None:
        n_devices = len(devices)
    if rule == NCpuMoeRule.FIRST or n >= n_layer or n_devices < 2 or n == 0:
        return list(range(min(n, n_layer)))
    assert layer_device is not None
    counts = [layer_device[:n_layer].count(d) for d in devices]
    # ik's rounding: round each device's share, then move single layers to or from the device whose
    # share is furthest from its exact value until the total is n
    share = [c * n / n_layer for c in counts]
    k = [math.floor(s + 0.5) for s in share]  # roundf: halves away from zero
    while sum(k) > n:
        cands = [i for i in range(len(k)) if k[i] > 0]
        i = max(cands, key=lambda j: (k[j] - 1 - share[j], -j))
        k[i] -= 1
    while sum(k) < n:
        cands = [i for i in range(len(k)) if k[i] < counts[i]]
        i = min(cands, key=lambda j: (k[j] + 1 - share[j], j))
        k[i] += 1
    left = dict(zip(devices, k, strict=True))
    out = []
    for layer in range(n_layer - 1, -1, -1):
        d = layer_device[layer]
        if left.get(d, 0) > 0:
            out.append(layer)
            left[d] -= 1
    return sorted(out)
