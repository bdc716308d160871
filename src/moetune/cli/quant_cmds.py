"""`moetune quantize`: a recipe through the engine's own llama-quantize, its output predicted first."""

from __future__ import annotations

from pathlib import Path

import click

from moetune.cli import common
from moetune.cli.common import json_option, print_json, warn


@click.command()
@click.argument("source", type=click.Path(path_type=Path))
@click.option(
    "--recipe",
    "recipe_path",
    required=True,
    type=click.Path(path_type=Path),
    help="The recipe (YAML): a default type and rules by role, kind, layers or pattern.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    help="The quantized file (default: SOURCE-RECIPE.gguf beside the source).",
)
@click.option(
    "--engine", "engine_name", help="Engine name or kind whose llama-quantize runs (default: the default engine)."
)
@click.option("--imatrix", type=click.Path(path_type=Path), help="Importance matrix (llama-imatrix's output).")
@click.option("--allow-requantize", is_flag=True, help="Let the engine requantize a source that is quantized already.")
@click.option("--threads", type=click.IntRange(1, 4096), help="Threads for llama-quantize (default: all cores).")
@click.option(
    "--hw",
    "hw_path",
    help="Also plan the output on this hardware (a file or a built-in example): what "
    "fits and how fast, before quantizing.",
)
@click.option("--force", is_flag=True, help="Overwrite OUTPUT if it exists.")
@click.option(
    "--dry-run", is_flag=True, help="Predict the output and print the exact llama-quantize command; run nothing."
)
@json_option
def quantize(
    source: Path,
    recipe_path: Path,
    output: Path | None,
    engine_name: str | None,
    imatrix: Path | None,
    allow_requantize: bool,
    threads: int | None,
    hw_path: str | None,
    force: bool,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Quantize SOURCE with a recipe, through the engine's own llama-quantize.

    The output's type and bytes are predicted per tensor before it runs (the engine's fallbacks
    included) and checked against the written file after; `moetune plan --recipe` plans the result
    on the hardware without quantizing. Exits 2 for a recipe the engine cannot follow (a type it
    lacks, a type that needs --imatrix), 1 when llama-quantize fails.
    """
    import shlex

    from moetune.app.quantize import QuantizeRequest, mib, predict
    from moetune.app.quantize import quantize as run

    req = QuantizeRequest(
        source=source,
        recipe=recipe_path,
        output=output,
        engine=engine_name,
        imatrix=imatrix,
        allow_requantize=allow_requantize,
        threads=threads,
        hw=hw_path,
        force=force,
        dry_run=dry_run,
    )
    pred = predict(req)
    qp, out = pred.plan, pred.output
    for m, r in qp.warnings:
        warn(m, r)
    if not as_json:
        common.out.print(
            f"{source}: {mib(pred.profile.total_bytes)} -> {out}: {mib(qp.nbytes)} predicted "
            f"({pred.engine.kind}, {len(qp.rules)} rules)",
            markup=False,
        )
        for ty, n in qp.bytes_by_type().items():
            common.out.print(f"  {ty:<10} {mib(n):>16}", markup=False)
        if hw_path is not None:
            pl = pred.doc["plan"]
            common.out.print(
                f"  on {hw_path}: {'fits' if pl['fits'] else 'does NOT fit'}; weights "
                + ", ".join(f"{d['name']} {d['weights_mib']:,.1f} MiB" for d in pl["devices"])
                + f"; predicted TG {pl['predicted'].get('tg_tok_s', 0):,.1f} tok/s (`moetune plan "
                f"{source} --recipe {recipe_path} --hw {hw_path}` for the whole plan)",
                markup=False,
            )
        fb = pred.fallbacks
        if fb:
            common.out.print(
                f"  {len(fb)} tensors fall back: {fb[0].name}: {fb[0].fallback}" + (" ..." if len(fb) > 1 else ""),
                markup=False,
            )
    if dry_run:
        if as_json:
            print_json(pred.doc)
        else:
            common.print_text(shlex.join(pred.argv))
        return
    with common.err.status("llama-quantize", spinner="dots") as st:

        def progress(i: int, n: int, name: str) -> None:
            st.update(f"llama-quantize: tensor {i}/{n} {name}")

        done = run(req, pred, progress)
    if as_json:
        print_json(done.doc)
    elif not done.mismatches:
        common.out.print(f"wrote {out}: every tensor's type and bytes as predicted ({mib(qp.nbytes)})", markup=False)
    failure = done.failure()
    if failure is not None:
        raise failure


def register(cli: click.Group) -> None:
    cli.add_command(quantize)
