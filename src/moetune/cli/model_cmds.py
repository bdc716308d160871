"""`moetune inspect` and `moetune testmodel`.

Imports stay light (no numpy, no rich for --json): the writer and the progress bar are imported
inside `testmodel`.
"""

from __future__ import annotations

from pathlib import Path

import click

from moetune.cli import common
from moetune.cli.common import json_option, print_json, remote_notes, remote_options
from moetune.errors import InputError
from moetune.model.archs import ARCHS, PRESET_RECIPES, PRESETS, Dims, with_overrides
from moetune.model.kv import CACHE_TYPES
from moetune.model.profile import open_model
from moetune.report.inspect_view import KvQuery, inspect_json, mib, print_inspect


@click.command()
@click.argument("path", required=False)
@remote_options
@click.option(
    "--ctx",
    type=click.IntRange(256),
    default=32768,
    show_default=True,
    help="Context for the KV cache total (sliding-window layers hold about a window of it).",
)
@click.option("--parallel", type=click.IntRange(1), default=1, show_default=True, help="Slots sharing the context.")
@click.option("-ub", "--ubatch", type=click.IntRange(1), default=512, show_default=True, help="Micro-batch (-ub).")
@click.option("--ctk", type=click.Choice(CACHE_TYPES), default="f16", show_default=True, help="Cache type (K and V).")
@click.option("--swa-full", is_flag=True, help="Size the sliding-window layers' cache for the whole context.")
@json_option
def inspect(
    path: str | None,
    hf: str | None,
    http_timeout_s: float,
    ctx: int,
    parallel: int,
    ubatch: int,
    ctk: str,
    swa_full: bool,
    as_json: bool,
) -> None:
    """Show a GGUF model's tensors, layers, sizes and KV cache cost (reads headers only).

    PATH may be any shard of a split model; the other shards are found beside it. PATH may also be
    an http(s) URL (Range requests fetch only the headers), or give --hf OWNER/REPO[:QUANT].
    """
    p = open_model(path, hf, timeout_s=http_timeout_s)
    remote_notes(p)
    if ctx // parallel < 256:
        raise InputError(f"--ctx {ctx} over {parallel} slots leaves under 256 tokens per slot")
    at = KvQuery(ctx=ctx, slots=parallel, ubatch=ubatch, cache_type=ctk, swa_full=swa_full)
    if as_json:
        print_json(inspect_json(p, at))
    else:
        print_inspect(p, common.out, at)


@click.command()
@click.argument("out_path", metavar="OUT.gguf", type=click.Path(path_type=Path))
@click.option("--arch", type=click.Choice(sorted(ARCHS)), help="Architecture (default qwen3moe).")
@click.option("--preset", type=click.Choice(sorted(PRESETS)), help="Published model's shape (sets --arch and sizes).")
@click.option("--layers", "n_layer", type=click.IntRange(1, 512), help="Trunk layers (NextN blocks come on top).")
@click.option("--experts", "n_expert", type=click.IntRange(1, 512))
@click.option("--experts-used", "n_expert_used", type=click.IntRange(1, 512))
@click.option("--embd", "n_embd", type=click.IntRange(32, 1 << 16))
@click.option("--expert-ff", "n_ff_exp", type=click.IntRange(32, 1 << 16))
@click.option("--ff", "n_ff", type=click.IntRange(32, 1 << 17), help="Dense FFN width (leading dense layers).")
@click.option("--heads", "n_head", type=click.IntRange(1, 256))
@click.option("--heads-kv", "n_head_kv", type=click.IntRange(1, 256))
@click.option("--dense-lead", "n_dense_lead", type=click.IntRange(0, 512), help="Leading dense (non-MoE) layers.")
@click.option("--nextn", "n_nextn", type=click.IntRange(0, 4), help="NextN/MTP blocks after the trunk.")
@click.option("--vocab", "n_vocab", type=click.IntRange(259, 1 << 20), help="Vocabulary size (byte tokens + padding).")
@click.option(
    "--window",
    "n_swa",
    type=click.IntRange(1, 1 << 20),
    help="Sliding window of the windowed layers (gpt-oss; default 128).",
)
@click.option(
    "--type",
    "type_spec",
    help="One type (q8_0) or a recipe: ffn_gate_exps=iq3_ks,ffn_down_exps=iq4_ks,other=q8_0 "
    "(default f16; a preset's published recipe with --preset)",
)
@click.option("--shards", type=click.IntRange(1, 999), default=1, show_default=True)
@click.option("--sparse", is_flag=True, help="Exact header, data region left as a file hole (no disk used).")
@click.option("--seed", type=int, default=0, show_default=True)
@json_option
def testmodel(
    out_path: Path,
    arch: str | None,
    preset: str | None,
    type_spec: str | None,
    shards: int,
    sparse: bool,
    seed: int,
    as_json: bool,
    **sizes: int | None,
) -> None:
    """Write a random-weight MoE model that llama-server can load (or a sparse replica for planning)."""
    if preset:
        arch_p, dims = PRESETS[preset]
        if arch and arch != arch_p:
            raise click.UsageError(f"--preset {preset} is a {arch_p} model; drop --arch {arch}")
        arch = arch_p
        type_spec = type_spec or PRESET_RECIPES.get(preset)
    else:
        dims = Dims()
        arch = arch or "qwen3moe"
        if arch in ("deepseek2", "glm-dsa"):
            dims = with_overrides(dims, n_head=2, n_head_kv=1)
    dims = with_overrides(dims, **sizes)
    type_spec = type_spec or "f16"
    from rich.progress import BarColumn, Progress, TextColumn

    from moetune.model.testmodel import generate

    out = common.out
    with Progress(
        TextColumn("writing {task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        console=common.err,
        transient=True,
        disable=as_json,
    ) as bar:
        task = bar.add_task(out_path.name, total=shards)
        g = generate(
            out_path,
            arch,
            dims,
            type_spec,
            shards=shards,
            sparse=sparse,
            seed=seed,
            progress=lambda n: bar.update(task, completed=n),
        )
    disk = sum(f.stat().st_blocks * 512 for f in g.files)
    doc = {
        "arch": g.arch,
        "files": [str(f) for f in g.files],
        "n_tensors": g.n_tensors,
        "tensor_bytes": g.tensor_bytes,
        "bytes_by_type": g.types,
        "sparse": sparse,
        "servable": g.servable,
        "disk_bytes": disk,
    }
    if as_json:
        print_json(doc)
        return
    out.print(
        f"wrote {len(g.files)} file(s), {g.n_tensors} tensors, {mib(g.tensor_bytes):,.2f} MiB of tensors "
        f"({mib(disk):,.2f} MiB on disk)"
    )
    for f in g.files:
        out.print(f"  {f}")
    if not g.servable:
        out.print(
            "[yellow]note:[/] some tensor types have filler data (ik_llama.cpp or unquantizable types): "
            "the file is for inspect and plan, not for llama-server"
        )


def register(cli: click.Group) -> None:
    cli.add_command(inspect)
    cli.add_command(testmodel)
