"""`moetune quantize`: a recipe through the engine's own llama-quantize, its output predicted first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from moetune.cli import common
from moetune.cli.common import json_option, print_json, warn
from moetune.errors import InputError, RuntimeFailure


def _mib(n: int) -> str:
    return f"{n / 2**20:,.2f} MiB"


def prediction_json(qp: Any, source_bytes: int, argv: list[str], source: str, output: str) -> dict[str, Any]:
    return {
        "source": source,
        "output": output,
        "engine_kind": str(qp.kind),
        "ftype": qp.ftype,
        "command": argv,
        "source_bytes": source_bytes,
        "bytes": qp.nbytes,
        "bytes_by_type": qp.bytes_by_type(),
        "rules": [{"pattern": p, "type": t.name.lower()} for p, t in qp.rules],
        "tensors": [
            {
                "name": t.name,
                "layer": t.layer,
                "role": t.role,
                "shape": list(t.shape),
                "source_type": t.source_type,
                "type": t.type,
                "bytes": t.nbytes,
                "rule": t.rule,
                "fallback": t.fallback or None,
            }
            for t in qp.tensors
        ],
        "warnings": [{"message": m, "remedy": r} for m, r in qp.warnings],
    }


def _plan_on(hw: str, source: Path, recipe: Path, out: Path, engine: str) -> dict[str, Any]:
    """The output planned on the hardware with the default settings (`moetune plan --recipe`)."""
    from moetune.app.plan import PlanRequest, plan

    doc = plan(PlanRequest(hw=hw, model=source, engine=engine, recipe=recipe, recipe_output=out)).doc
    return {
        "fits": doc["fits"],
        "predicted": doc["predicted"],
        "devices": [
            {
                "name": d["name"],
                "capacity_mib": d["capacity_mib"],
                "used_mib": d["used_mib"],
                "weights_mib": sum(i["mib"] for i in d["items"] if i["what"] == "weights"),
            }
            for d in doc["devices"]
        ],
    }


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
    import shutil

    from moetune.engine import registry
    from moetune.engine.dialect import quantize_argv
    from moetune.engine.quantize import plan_quantize
    from moetune.model.profile import load_profile
    from moetune.model.recipe import default_output, load_recipe
    from moetune.paths import readable_file

    recipe = load_recipe(recipe_path)
    profile = load_profile(source)
    if len(profile.files) > 1:
        raise InputError(
            f"{source}: a split model ({len(profile.files)} files)",
            hint="merge it first (llama-gguf-split --merge), then quantize the one file",
        )
    engine = registry.get(registry.resolve(engine_name)[0])
    qp = plan_quantize(profile, recipe, engine.kind, imatrix=imatrix is not None, allow_requantize=allow_requantize)
    out = output or default_output(source, recipe_path)
    if imatrix is not None:
        readable_file(imatrix, "imatrix")
    try:
        binary = str(engine.binary("quantize"))
    except InputError:
        if not dry_run:
            raise
        binary = "llama-quantize"  # a dry run needs no build: the command names the tool
    argv = quantize_argv(
        engine.kind,
        binary,
        str(source),
        str(out),
        qp.ftype,
        [(p, t.name) for p, t in qp.rules],
        imatrix=str(imatrix) if imatrix else None,
        allow_requantize=qp.requantize,
        threads=threads,
    )
    doc = prediction_json(qp, profile.total_bytes, argv, str(source), str(out))
    for m, r in qp.warnings:
        warn(m, r)
    if hw_path is not None:
        doc["plan"] = _plan_on(hw_path, source, recipe_path, out, engine.name)
    if not as_json:
        common.out.print(
            f"{source}: {_mib(profile.total_bytes)} -> {out}: {_mib(qp.nbytes)} predicted "
            f"({engine.kind}, {len(qp.rules)} rules)",
            markup=False,
        )
        for ty, n in qp.bytes_by_type().items():
            common.out.print(f"  {ty:<10} {_mib(n):>16}", markup=False)
        if hw_path is not None:
            pl = doc["plan"]
            common.out.print(
                f"  on {hw_path}: {'fits' if pl['fits'] else 'does NOT fit'}; weights "
                + ", ".join(f"{d['name']} {d['weights_mib']:,.1f} MiB" for d in pl["devices"])
                + f"; predicted TG {pl['predicted'].get('tg_tok_s', 0):,.1f} tok/s (`moetune plan "
                f"{source} --recipe {recipe_path} --hw {hw_path}` for the whole plan)",
                markup=False,
            )
        fb = [t for t in qp.tensors if t.fallback]
        if fb:
            common.out.print(
                f"  {len(fb)} tensors fall back: {fb[0].name}: {fb[0].fallback}" + (" ..." if len(fb) > 1 else ""),
                markup=False,
            )
    if dry_run:
        if as_json:
            print_json(doc)
        else:
            common.print_text(shlex.join(argv))
        return
    if engine.bin_dir is None:
        raise InputError(
            f"engine {engine.name} is a container image; quantize needs a local build",
            hint="use --engine with a build (`moetune engine list`)",
        )
    if out.exists() and not force:
        raise InputError(f"{out} exists", hint="give --force to overwrite it, or another -o")
    if out.resolve() == source.resolve():
        raise InputError("the output is the source", hint="give another -o")
    free = shutil.disk_usage(out.parent if out.parent.exists() else Path(".")).free
    if free < qp.nbytes:
        raise InputError(
            f"{out.parent}: {_mib(free)} free, the output needs {_mib(qp.nbytes)}",
            hint="free some space or write elsewhere with -o",
        )
    from moetune.run.quantize import check_written, run_quantize

    log = out.with_name(out.name + ".log")
    with common.err.status("llama-quantize", spinner="dots") as st:

        def progress(i: int, n: int, name: str) -> None:
            st.update(f"llama-quantize: tensor {i}/{n} {name}")

        run_quantize(argv, log, progress)
    bad = check_written(qp, out)
    doc["written"] = {
        "path": str(out),
        "log": str(log),
        "matches_prediction": not bad,
        "mismatches": [{"name": b.name, "predicted": b.predicted, "written": b.written} for b in bad],
    }
    if as_json:
        print_json(doc)
    elif not bad:
        common.out.print(f"wrote {out}: every tensor's type and bytes as predicted ({_mib(qp.nbytes)})", markup=False)
    if bad:
        raise RuntimeFailure(
            f"{out}: {len(bad)} tensors differ from the prediction, first {bad[0].name}: "
            f"predicted {bad[0].predicted}, written {bad[0].written}",
            hint="report this: moetune's model of llama-quantize is out of date for this build",
        )


def register(cli: click.Group) -> None:
    cli.add_command(quantize)
