"""The tools a GPU or RDMA build needs beyond cmake and a C++ compiler, found before a build starts:
the CUDA toolkit (nvcc, the runtime and cuBLAS) and the libibverbs headers. Each finder takes the
places it searches, so that a test can point it anywhere; a miss is an InputError naming the piece
and how to get it.
"""

from __future__ import annotations

import os
import platform
import shutil
from dataclasses import dataclass
from pathlib import Path

from moetune.errors import InputError


@dataclass(frozen=True, slots=True)
class Toolkit:
    nvcc: Path
    root: Path


CUDA_HINT = (
    "install the CUDA toolkit with cuBLAS (https://developer.nvidia.com/cuda-downloads; Debian/Ubuntu: "
    "apt install nvidia-cuda-toolkit), or set CUDA_HOME to where it is; `--backend cpu` builds without it"
)


def find_cuda(path_env: str, cuda_home: str | None, defaults: tuple[str, ...] = ("/usr/local/cuda",)) -> Toolkit:
    """The CUDA toolkit a CUDA build needs: nvcc (on PATH, under $CUDA_HOME/bin or
    /usr/local/cuda/bin), the runtime and cuBLAS headers and cuBLAS itself, under the toolkit's
    root or the system's. Raises InputError naming what is missing."""
    roots = [Path(r) for r in (cuda_home, *defaults) if r]
    on_path = shutil.which("nvcc", path=path_env)
    nvcc = next((r / "bin" / "nvcc" for r in roots if (r / "bin" / "nvcc").is_file()), None)
    if nvcc is None and on_path:
        nvcc = Path(on_path)
        roots.append(Path(os.path.realpath(on_path)).parent.parent)
    if nvcc is None:
        raise InputError(
            "--backend cuda needs the CUDA toolkit: nvcc is not on PATH, nor in "
            + ", ".join(str(r / "bin") for r in roots),
            hint=CUDA_HINT,
        )
    root = next((r for r in roots if (r / "bin" / "nvcc").is_file()), nvcc.parent.parent)
    search = [*dict.fromkeys([root, *roots, Path("/usr")])]
    incs = [d for r in search for d in (r / "include", *sorted(r.glob("targets/*/include")))]
    libs = [
        d
        for r in search
        for d in (r / "lib64", r / "lib", *sorted(r.glob("targets/*/lib")), *sorted(r.glob("lib/*-linux-gnu")))
    ]
    missing = [
        what
        for what, dirs, pattern in (
            ("cuda_runtime.h", incs, "cuda_runtime.h"),
            ("cuBLAS headers (cublas_v2.h)", incs, "cublas_v2.h"),
            ("cuBLAS (libcublas.so)", libs, "libcublas.so*"),
        )
        if not any(any(d.glob(pattern)) for d in dirs if d.is_dir())
    ]
    if missing:
        raise InputError(f"--backend cuda: the CUDA toolkit at {root} lacks {', '.join(missing)}", hint=CUDA_HINT)
    return Toolkit(nvcc, root)


def find_verbs(include_dirs: tuple[Path, ...]) -> Path:
    """``infiniband/verbs.h``, which ggml-rpc's RDMA transport is compiled against; InputError
    naming it (and its Debian package) where no include directory has it."""
    for d in include_dirs:
        if (d / "infiniband" / "verbs.h").is_file():
            return d / "infiniband" / "verbs.h"
    raise InputError(
        "--rpc-rdma on needs the libibverbs headers: no infiniband/verbs.h in " + ", ".join(map(str, include_dirs)),
        hint="install them (Debian/Ubuntu: apt install libibverbs-dev; Fedora: rdma-core-devel), "
        "or build with --rpc-rdma off (RPC over TCP)",
    )


def include_dirs() -> tuple[Path, ...]:
    """Where the C compiler looks for headers: $CPATH, $C_INCLUDE_PATH, then the system's."""
    env = [p for v in ("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH") for p in os.environ.get(v, "").split(":") if p]
    return tuple(
        Path(p)
        for p in dict.fromkeys(
            [*env, "/usr/local/include", "/usr/include", f"/usr/include/{platform.machine()}-linux-gnu"]
        )
    )


ARCH_HINT = (
    "give the target GPUs' compute capability without the dot: --cuda-arch 90 (H100, H200), 120 "
    "(RTX PRO 6000 Blackwell, RTX 5090), 121 (GB10), 89 (RTX 4090, L40S), '86;90' for several "
    "(or set CUDAARCHS)"
)


def check_native_gpu(dev: Path = Path("/dev"), proc: Path = Path("/proc/driver/nvidia/gpus")) -> None:
    """``--cuda-arch native`` compiles for the GPUs CMake finds here, and CMake stops with "no NVIDIA
    GPU was detected" where there is none (a build machine, a container without the GPU): say so
    before the build, with the architectures to give instead."""
    if any(dev.glob("nvidia[0-9]*")) or (proc.is_dir() and any(proc.iterdir())):
        return
    raise InputError(
        f"--cuda-arch native builds for this machine's GPUs, and none is visible here (no {dev / 'nvidia0'})",
        hint=ARCH_HINT,
    )
